"""Each instance's distance to its memory-bandwidth limit: the roofline of a memory-bound decoder.

Generating one token reads every weight once (for a mixture of experts, the active experts' and the shared ones),
and a CPU decoder waits on memory, not arithmetic, so

    tokens/s  <=  bandwidth of the plan's memory nodes  /  bytes read per token

The bandwidth is each memory node's best figure (numa_cost's record, else the firmware's HMAT; decide/weights.choose,
the weights' own source): one node's for a bound instance; for an interleaved one the nodes serve equal shares, so
the slowest sets the pace (N x the lowest); for weighted interleave the shares follow the bandwidths, so they add
up. The bytes per token are the model's size unless the service gives ``bytes_per_token`` (MoE models). An instance
runs at a ``share`` of that bound: measured servers reach about 0.5-0.6 of it (llama.cpp and vLLM decoding on
DRAM-bound CPUs; docs/metrics.md), so a share far below the fleet's typical one points at a host problem (a remote
node, a straggler thread, a slow DIMM population), not at the model.

Pure: the bandwidths come in, the shares go out.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence

from .weights import Bandwidths

# Bytes per second per unit of each source's figures: numa_cost records GB/s, HMAT (sysfs numaperf) MB/s.
BYTES_PER_SECOND = {"measured": 1e9, "hmat": 1e6}
# An instance at less than this share of the fleet's median share is flagged (half of what its peers reach).
FAR_BELOW = 0.5
# The fewest instances with a share for a median to mean "typical".
MIN_PEERS = 3


def bound_tokens_per_second(bandwidths: Bandwidths, policy: Optional[str], mem_nodes: Sequence[int],
                            bytes_per_token: int) -> Optional[float]:
    """The decode rate the plan's memory nodes allow a model reading ``bytes_per_token`` per token; None when a node
    has no figure or nothing is read."""
    figures = [bandwidths.by_node.get(node) for node in mem_nodes]
    if not figures or any(figure is None for figure in figures) or bytes_per_token <= 0:
        return None
    if policy == "interleave":
        per_second = len(figures) * min(figures)
    else:
        per_second = sum(figures)
    return per_second * BYTES_PER_SECOND[bandwidths.source] / bytes_per_token


def roofline(bandwidths: Optional[Bandwidths], why_none: str, policy: Optional[str], mem_nodes: Sequence[int],
             bytes_per_token: Optional[int], tokens_per_second: Optional[float]) -> Dict[str, Any]:
    """{bound_tokens_per_second, share, source, bytes_per_token, reason}: the bound and the measured rate's share of
    it, each None with the reason where it cannot be known."""
    result = {"bound_tokens_per_second": None, "share": None, "source": None, "bytes_per_token": bytes_per_token,
              "reason": ""}  # type: Dict[str, Any]
    if bandwidths is None:
        result["reason"] = "no bandwidth of the host's memory nodes: %s" % why_none
        return result
    result["source"] = bandwidths.source
    if not bytes_per_token:
        result["reason"] = "no model size in the plan record: give the service model, model_size or bytes_per_token"
        return result
    bound = bound_tokens_per_second(bandwidths, policy, mem_nodes, bytes_per_token)
    if bound is None:
        result["reason"] = "node(s) %s of the plan have no bandwidth figure" % ",".join(map(str, mem_nodes))
        return result
    result["bound_tokens_per_second"] = round(bound, 3)
    if tokens_per_second is None:
        result["reason"] = "no measured tokens/s (set the service's ab_gate)"
        return result
    result["share"] = round(tokens_per_second / bound, 4)
    return result


def typical_share(shares: Mapping[Hashable, float]) -> Optional[float]:
    """The fleet's typical share: the median of all; None among fewer than MIN_PEERS."""
    return statistics.median(shares.values()) if len(shares) >= MIN_PEERS else None


def far_below(shares: Mapping[Hashable, float]) -> List[Hashable]:
    """The instances (keys: a unit, or a host and a unit) whose share is below FAR_BELOW of the typical share,
    sorted; none among fewer than MIN_PEERS."""
    typical = typical_share(shares)
    if typical is None:
        return []
    return sorted(unit for unit, share in shares.items() if share < FAR_BELOW * typical)
