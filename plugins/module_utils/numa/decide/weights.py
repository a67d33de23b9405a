"""Weighted-interleave weights for a host, from the bandwidth each memory node delivers.

``MPOL_WEIGHTED_INTERLEAVE`` (Linux 6.9) hands out pages round-robin, node N getting as many in a row as its weight
in ``/sys/kernel/mm/mempolicy/weighted_interleave/nodeN`` (1-255). Pages split in proportion to the weights, so the
weights should be in proportion to what each node can deliver: then every node is as busy as the others and the
instance reads at the sum of their bandwidths instead of N times the slowest one's.

Where a node's bandwidth comes from, best first (SOURCES):
  measured  numa_cost's matrix recorded on this host (``record: true``), for this same topology: a memory node's
            figure is the best any CPU node got from it, as HMAT's access0 is its best initiator's;
  hmat      the firmware's HMAT (numaperf ``access0/initiators``): the lower of read and write bandwidth, as the
            kernel's own ``auto`` weights take it;
  kernel    the kernel computes them from HMAT itself (``weighted_interleave/auto``, Linux 6.16).
Bandwidths become weights in tenths of the fastest node's (at least 1), divided by their greatest common divisor:
20 and 10 GB/s give 2 and 1, 20 and 18 give 10 and 9. (The kernel's ``auto`` takes percent shares of the total,
which would turn two identical nodes measured at 41.8 and 41.5 GB/s into 50 and 49.)

Pure functions of the facts (numa_facts' topology) and a record: no I/O.
"""

from __future__ import annotations

from math import gcd
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from ..base.errors import shown
from ..base.sizes import finite_number

SOURCES = ("measured", "hmat", "kernel")
# A node's weight is its bandwidth in tenths of the fastest node's: coarser than a measurement's noise (a few per
# cent), so identical nodes measured at 41.8 and 41.5 GB/s get equal weights, and far below the kernel's 255.
STEPS = 10
# A recorded bandwidth above this many GB/s is no measurement (a node's DRAM or HBM gives some 10 to 5000); a node
# id above MAX_NODE_ID is none of the kernel's (its MAX_NUMNODES is 1024 at most).
MAX_GBPS = 1e6
MAX_NODE_ID = 1 << 16
# HMAT's figures are MB/s, read by read/topology as bounded kernel numbers; past this they are no bandwidth either.
MAX_HMAT_MBPS = 1e12
REMEASURE = "measure again with numa_cost record: true"


class Bandwidths(NamedTuple):
    """Per memory node, its bandwidth (any unit, the same for all) from ``source``; or why there is none."""

    source: str
    by_node: Dict[int, float]
    reason: str


def weights_from_bandwidth(by_node: Mapping[int, float]) -> Dict[int, int]:
    """Each node's weight: its bandwidth in STEPS-ths of the fastest node's (at least 1), reduced by their GCD."""
    fastest = max(by_node.values(), default=0)
    if fastest <= 0:
        return {}
    steps = {node: max(1, int(round(STEPS * bandwidth / fastest))) for node, bandwidth in by_node.items()}
    divisor = 0
    for step in steps.values():
        divisor = gcd(divisor, step)
    return {node: step // divisor for node, step in sorted(steps.items())}


def memory_nodes(topology: Mapping[str, Any]) -> List[int]:
    """The nodes whose memory interleave can use: every node with memory."""
    return sorted(node["id"] for node in topology.get("nodes") or [] if node.get("has_memory"))


def topology_signature(facts: Mapping[str, Any]) -> str:
    """What makes two hosts the same NUMA type: per node its CPU count and whether it has
    memory, and the SLIT matrix. Memory sizes are left out: firmware reservations make them
    differ by a few MiB between identical machines."""
    nodes = ["node%d:%dcpu%s" % (node["id"], len(node.get("cpus") or []), "" if node.get("has_memory") else ":nomem")
             for node in facts.get("nodes", [])]
    slit = "/".join(",".join(str(cell) for cell in row) for row in facts.get("distances") or [])
    return "%s slit=%s" % (" ".join(nodes), slit or "unknown")


def measured_bandwidths(topology: Mapping[str, Any], record: Optional[Mapping[str, Any]]) -> Bandwidths:
    """From numa_cost's recorded result: each memory node's best bandwidth over the CPU nodes measured.

    The record is a file's content: anything in it that is not what numa_cost writes (a number past its bounds, a
    400-digit int, ``1e999`` read as inf, another type) makes it unusable, said in one line, never an exception."""
    if record is None:
        return Bandwidths("measured", {}, "no numa_cost record on this host (run numa_cost with record: true)")
    if not isinstance(record, dict):
        return Bandwidths("measured", {}, "the numa_cost record is no JSON object; " + REMEASURE)
    signature = record.get("topology_signature")
    if signature != topology_signature(topology):
        return Bandwidths("measured", {}, "the numa_cost record is of another topology (%s); %s"
                                          % (shown(signature) if isinstance(signature, str) else
                                             "its signature is no text", REMEASURE))
    nodes = record.get("nodes")
    matrix = record.get("bandwidth_gbps")
    if not _is_matrix(nodes, matrix):
        return Bandwidths("measured", {}, "the numa_cost record has no node list and bandwidth matrix of its size; "
                          + REMEASURE)
    best = {}  # type: Dict[int, float]
    for column, node in enumerate(nodes):
        cells = []
        for row, cpu_node in zip(matrix, nodes):
            cell = row[column]
            if cell is None or cell == 0:  # not measured, or too little to round to 0.01 GB/s
                continue
            if not _is_bandwidth(cell, MAX_GBPS):
                return Bandwidths("measured", {}, "the numa_cost record's bandwidth from node %d to node %d is %s, "
                                                  "not a number of GB/s from 0 to %g; %s"
                                  % (cpu_node, node, _described(cell), MAX_GBPS, REMEASURE))
            cells.append(float(cell))
        if cells:
            best[node] = max(cells)
    missing = [node for node in memory_nodes(topology) if node not in best]
    if missing:
        return Bandwidths("measured", {}, "the numa_cost record has no bandwidth to node(s) %s; measure again with "
                                          "a larger max_seconds" % ",".join(map(str, missing)))
    return Bandwidths("measured", {node: best[node] for node in memory_nodes(topology)}, "")


def hmat_bandwidths(topology: Mapping[str, Any]) -> Bandwidths:
    """From HMAT: each memory node's lower of read and write bandwidth from its best initiators (MB/s)."""
    by_node = {}  # type: Dict[int, float]
    missing = []
    for node in topology.get("nodes") or []:
        if not node.get("has_memory"):
            continue
        figures = node.get("hmat") or {}
        known = [float(figures[key]) for key in ("read_bandwidth", "write_bandwidth")
                 if _is_bandwidth(figures.get(key), MAX_HMAT_MBPS)]
        if known:
            by_node[node["id"]] = min(known)
        else:
            missing.append(node["id"])
    if missing:
        return Bandwidths("hmat", {}, "the firmware's HMAT gives no bandwidth for node(s) %s"
                                      % ",".join(map(str, missing)))
    return Bandwidths("hmat", by_node, "")


def choose(topology: Mapping[str, Any], record: Optional[Mapping[str, Any]],
           source: str = "auto") -> Tuple[Optional[Bandwidths], List[str]]:
    """The bandwidths of ``source`` (measured or hmat; ``auto``: the first of them that has them all), and why each
    source tried was passed over. (None, reasons) when none has them; the caller then tries the kernel's ``auto``."""
    tried = {"measured": lambda: measured_bandwidths(topology, record), "hmat": lambda: hmat_bandwidths(topology)}
    reasons = []
    for name in ("measured", "hmat") if source == "auto" else (source,):
        found = tried[name]()
        if found.by_node:
            return found, reasons
        reasons.append("%s: %s" % (name, found.reason))
    return None, reasons


def _is_bandwidth(value: Any, highest: float) -> bool:
    """A finite number above 0 and at most ``highest`` (compared exactly: an int of 400 digits is no bandwidth)."""
    return finite_number(value) and 0 < value <= highest


def _described(value: Any) -> str:
    """A record's value in a message: a list or an object by its kind (repr() of a deeply nested one raises)."""
    if isinstance(value, (list, dict)):
        return "a JSON %s" % ("list" if isinstance(value, list) else "object")
    return shown(value)


def _is_matrix(nodes: Any, matrix: Any) -> bool:
    if not isinstance(nodes, list) or not all(
            isinstance(node, int) and not isinstance(node, bool) and 0 <= node < MAX_NODE_ID for node in nodes):
        return False
    if len(set(nodes)) != len(nodes):
        return False
    return isinstance(matrix, list) and len(matrix) == len(nodes) and all(
        isinstance(row, list) and len(row) == len(nodes) for row in matrix)
