# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Turn the fleet's numa_cost results into one report model (controller side).

``numa_cost_report(hostvars, hosts, var)`` collects each host's registered
``numa_cost`` result, checked against host_results.COST_RESULT (a host that breaks
it is listed with the reason, the others reported), groups hosts of identical NUMA
shape (``topology_signature``), and precomputes every table cell's text and heatmap
colour so that report_pages.py only lays them out. Measured figures and the
firmware's SLIT are kept apart and labelled as such.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.inferops.numa.plugins.plugin_utils import host_results

# Heatmap ends: "as good as local" and "clearly remote". A latency (or SLIT) ratio of
# LATENCY_WORST or more, or a bandwidth ratio of BANDWIDTH_WORST or less, is full red.
LATENCY_WORST = 2.5
BANDWIDTH_WORST = 0.3
GOOD_RGB = (232, 245, 233)
BAD_RGB = (229, 115, 115)
# Measured remote/local below this while SLIT claims at least SLIT_CLAIM: the nodes do not
# differ in practice (emulated NUMA, or a SLIT that overstates).
FLAT_MEASURED = 1.2
SLIT_CLAIM = 1.5


def heat(value: Optional[float], worst: float) -> str:
    """Background colour of a ratio: green at 1.0, red at ``worst`` (either side of 1)."""
    if value is None:
        return "#eeeeee"
    span = worst - 1.0
    share = min(max((value - 1.0) / span, 0.0), 1.0)
    return "#%02x%02x%02x" % tuple(int(round(good + (bad - good) * share)) for good, bad in zip(GOOD_RGB, BAD_RGB))


def table(nodes: Sequence[int], matrix: Optional[Sequence[Sequence[Any]]], fmt: str,
          worst: Optional[float] = None) -> Dict[str, Any]:
    """Header and rows of cells ``{"text", "color"}``; rows are CPU nodes, columns memory nodes."""
    rows = []
    for row_index, node in enumerate(nodes):
        values = list(matrix[row_index]) if matrix and row_index < len(matrix) else [None] * len(nodes)
        cells = [{"text": "-" if value is None else fmt % value,
                  "color": heat(value, worst) if worst is not None else ""} for value in values]
        rows.append({"node": node, "cells": cells})
    return {"header": ["node %s" % node for node in nodes], "rows": rows}


def verdict(latency_ratio: Sequence[Sequence[Any]], distance_ratio: Sequence[Sequence[Any]]) -> List[str]:
    """Sentences comparing what was measured with what SLIT claims, for the remote pairs."""
    if len(latency_ratio) < 2:
        return ["one NUMA node: no memory is remote"]
    measured = _off_diagonal(latency_ratio)
    claimed = _off_diagonal(distance_ratio)
    if not measured:
        return ["no remote pair was measured: only the firmware's SLIT claims (distance ratio) are shown"]
    worst_measured, worst_claimed = max(measured), max(claimed) if claimed else None
    text = "measured remote/local latency up to %.2fx" % worst_measured
    if worst_claimed is not None:
        text += "; SLIT claims up to %.2fx" % worst_claimed
    lines = [text]
    if worst_claimed is not None and worst_measured < FLAT_MEASURED and worst_claimed >= SLIT_CLAIM:
        lines.append("the nodes do not differ in practice although SLIT says they do (emulated NUMA, e.g. a "
                     "QEMU guest, or a SLIT that overstates): trust the measured ratios")
    return lines


def _off_diagonal(matrix: Sequence[Sequence[Any]]) -> List[float]:
    return [value for row, values in enumerate(matrix or []) for col, value in enumerate(values)
            if row != col and value is not None]


def _remote_lines(remote: Optional[Mapping[str, Any]]) -> List[str]:
    if not remote:
        return ["not sampled"]
    if remote.get("available") is False or not remote.get("nodes"):
        return ["unavailable: %s" % (remote.get("reason") or "unknown")]
    lines = []
    for entry in remote["nodes"]:
        share = entry.get("remote_share")
        lines.append("node %s: %s of %s pages allocated in %ss were for tasks on other nodes"
                     % (entry["node"], "-" if share is None else "%.1f%%" % (100 * share),
                        entry.get("allocations") or 0, remote.get("window_seconds")))
    service = remote.get("service")
    if service:
        lines.append("service: %s" % service.get("summary"))
    perf = remote.get("perf") or {}
    if perf.get("available"):
        lines.append("perf: %.1f%% of node loads remote" % (100 * (perf.get("remote_load_share") or 0)))
    elif perf:
        lines.append("perf node-loads: unavailable (%s)" % perf.get("reason"))
    return lines


def host_entry(name: str, result: Any) -> Dict[str, Any]:
    """Everything the templates print for one host (``result`` is its clean reading, or why it has none)."""
    if not isinstance(result, Mapping):
        return {"name": name, "ok": False, "error": result}
    nodes = result["nodes"]
    method = result.get("method") or {}
    return {
        "name": name, "ok": True,
        "signature": result.get("topology_signature") or "unknown",
        "nodes": nodes,
        "latency_ratio": table(nodes, result.get("latency_ratio"), "%.2f", LATENCY_WORST),
        "bandwidth_ratio": table(nodes, result.get("bandwidth_ratio"), "%.2f", BANDWIDTH_WORST),
        "distance": table(nodes, result.get("distance"), "%s"),
        "distance_ratio": table(nodes, result.get("distance_ratio"), "%.2f", LATENCY_WORST),
        "latency_ns": table(nodes, result.get("latency_ns"), "%.1f"),
        "bandwidth_gbps": table(nodes, result.get("bandwidth_gbps"), "%.2f"),
        "spread": table(nodes, method.get("spread"), "%.2f"),
        "unmeasured": ["%s: %s" % item for item in sorted((result.get("unmeasured") or {}).items())],
        "notes": list(result.get("notes") or []) + list(method.get("notes") or []),
        "verdict": verdict(result.get("latency_ratio") or [], result.get("distance_ratio") or []),
        "remote": _remote_lines(result.get("remote_ratio")),
        "method": [method[key] for key in host_results.METHOD_TEXTS
                   if method.get(key)],
        "elapsed_seconds": result.get("elapsed_seconds"),
    }


def median_matrix(matrices: Sequence[Sequence[Sequence[Any]]]) -> List[List[Optional[float]]]:
    """Cell-wise median over hosts, ignoring cells a host could not measure."""
    if not matrices:
        return []
    result = []
    for row in range(len(matrices[0])):
        cells = []
        for col in range(len(matrices[0][row])):
            values = sorted(m[row][col] for m in matrices
                            if row < len(m) and col < len(m[row]) and m[row][col] is not None)
            cells.append(_median(values))
        result.append(cells)
    return result


def _median(values: List[float]) -> Optional[float]:
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else round((values[middle - 1] + values[middle]) / 2, 3)


def group_hosts(results: Mapping[str, Mapping[str, Any]], entries: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Host types: hosts with equal topology_signature, with the median ratio heatmaps of the type."""
    by_signature = {}  # type: Dict[str, List[str]]
    for entry in entries:
        if entry["ok"]:
            by_signature.setdefault(entry["signature"], []).append(entry["name"])
    groups = []
    for index, (signature, names) in enumerate(sorted(by_signature.items(), key=_group_order), start=1):
        first = results[names[0]]
        nodes = first["nodes"]
        groups.append({
            "index": index, "signature": signature, "hosts": names, "nodes": nodes,
            "latency_ratio": table(nodes, median_matrix([results[n].get("latency_ratio") or [] for n in names]),
                                   "%.2f", LATENCY_WORST),
            "bandwidth_ratio": table(nodes, median_matrix([results[n].get("bandwidth_ratio") or [] for n in names]),
                                     "%.2f", BANDWIDTH_WORST),
            "distance_ratio": table(nodes, first.get("distance_ratio"), "%.2f", LATENCY_WORST),
        })
    return groups


def _group_order(item: Tuple[str, List[str]]) -> Tuple[int, str]:
    return -len(item[1]), item[0]


def numa_cost_report(hostvars: Any, hosts: Sequence[str], var: str = "numa_cost_result") -> Dict[str, Any]:
    """The report model for ``hosts``, reading each host's registered ``var``."""
    return model(host_results.registered(hostvars, hosts, var), hosts)


def model(results: Mapping[str, Any], hosts: Sequence[str]) -> Dict[str, Any]:
    clean = {name: host_results.reading(results.get(name), host_results.COST_RESULT, "numa_cost", "nodes")
             for name in hosts}
    entries = [host_entry(str(name), clean[name]) for name in hosts]
    groups = group_hosts({name: value for name, value in clean.items() if isinstance(value, Mapping)}, entries)
    return {
        "hosts": entries,
        "groups": groups,
        "host_count": len(entries),
        "failed": [entry for entry in entries if not entry["ok"]],
        "scale": {"latency_worst": LATENCY_WORST, "bandwidth_worst": BANDWIDTH_WORST},
    }
