"""``numa-pin cost``: its options and its tables, the CLI's side of cost.py.

Imported only when the command is ``cost``: the measurement engine (cost.py)
stays off the ``numa-pin exec`` path that every service start runs.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..measure import cost
from ..read.audit import load_plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, TextIO


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``numa-pin cost`` on its subparser."""
    parser.add_argument("--max-seconds", type=float, default=cost.DEFAULT_MAX_SECONDS,
                        help="stop measuring after this long; unmeasured pairs say so (default %(default)s)")
    parser.add_argument("--buffer-mb", type=int, help="chase/copy buffer in MiB (default 4x the L3, >= 64)")
    parser.add_argument("--small-kb", type=int, help="L1-resident buffer in KiB (default half the L1d)")
    parser.add_argument("--chase-steps", type=int, default=cost.DEFAULT_CHASE_STEPS,
                        help="pointer-chase steps per buffer (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=cost.DEFAULT_REPEATS,
                        help="copies per pair and round (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=cost.DEFAULT_ROUNDS,
                        help="measure every pair this many times, keep its quietest round (default %(default)s)")
    parser.add_argument("--window-seconds", type=float, default=1.0,
                        help="how long to sample the remote-allocation counters (default %(default)s)")
    parser.add_argument("--pid", type=int, action="append", dest="pids", help="a PID of the service to inspect")
    parser.add_argument("--unit", help="the systemd unit of the service to inspect")
    parser.add_argument("--plan-file", help="the service's plan (JSON from numa-pin explain)")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON instead of tables")


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Measure and print; NumaError is left to the CLI's edge."""
    options = cost.CostOptions(buffer_mb=args.buffer_mb, small_kb=args.small_kb, chase_steps=args.chase_steps,
                               repeats=args.repeats, max_seconds=args.max_seconds, rounds=args.rounds)
    plan = load_plan(args.plan_file) if args.plan_file else None
    result = cost.run(options, args.window_seconds, args.pids, args.unit, plan, progress=_progress)
    out.write(json.dumps(result, indent=2, sort_keys=True) + "\n" if args.json else format_table(result))
    return 0


def _progress(text: str) -> None:
    """What the measurement does next, on stderr (the tables or JSON go to stdout): a line per pair, a few
    seconds apart."""
    sys.stderr.write("numa-pin cost: %s\n" % text)
    sys.stderr.flush()


def format_table(result: Dict[str, Any]) -> str:
    """The matrices as aligned text: rows are CPU nodes, columns memory nodes."""
    nodes = result["nodes"]
    blocks = [
        _matrix_block("latency ns (measured)", nodes, result["latency_ns"], "%.1f"),
        _matrix_block("latency ratio to local (measured)", nodes, result["latency_ratio"], "%.2f"),
        _matrix_block("copy bandwidth GB/s (measured)", nodes, result["bandwidth_gbps"], "%.2f"),
        _matrix_block("bandwidth ratio to local (measured)", nodes, result["bandwidth_ratio"], "%.2f"),
        _matrix_block("SLIT distance (firmware, not measured)", nodes, result["distance"], "%s"),
        _matrix_block("SLIT distance ratio (firmware, not measured)", nodes, result["distance_ratio"], "%.2f"),
    ]
    lines = ["\n".join(block) for block in blocks]
    if result.get("unmeasured"):
        lines.append("not measured:\n" + "\n".join("  %s: %s" % item for item in sorted(result["unmeasured"].items())))
    lines.extend(_remote_lines(result.get("remote_ratio")))
    method = result.get("method", {})
    lines.append("method: %s\n  %s\n  %s"
                 % (method.get("latency", ""), method.get("bandwidth", ""), method.get("noise", "")))
    return "\n\n".join(lines) + "\n"


def _matrix_block(title: str, nodes: List[int], matrix: List[List[Any]], fmt: str) -> List[str]:
    cells = [["cpu\\mem"] + ["node %d" % node for node in nodes]]
    for node, row in zip(nodes, matrix):
        cells.append(["node %d" % node] + ["-" if value is None else fmt % value for value in row])
    width = max(len(cell) for row in cells for cell in row)
    return [title + ":"] + ["  " + " ".join(cell.rjust(width) for cell in row) for row in cells]


def _remote_lines(remote: Optional[Dict[str, Any]]) -> List[str]:
    if not remote:
        return []
    if "nodes" not in remote:
        return ["remote allocations: unavailable (%s)" % remote.get("reason")]
    lines = ["remote allocations over %s s, other_node / (local_node + other_node):" % remote.get("window_seconds")]
    for entry in remote["nodes"]:
        share = entry.get("remote_share")
        shown = "-" if share is None else "%.1f%%" % (100 * share)
        lines.append("  node %d: %s of %d pages" % (entry["node"], shown, entry.get("allocations", 0)))
    if remote.get("service"):
        lines.append("  service: %s" % remote["service"]["summary"])
    perf = remote.get("perf") or {}
    if perf.get("available"):
        lines.append("  perf: %d of %d node loads remote" % (perf["node_load_misses"], perf["node_loads"]))
    elif perf:
        lines.append("  perf node-loads: unavailable (%s)" % perf.get("reason"))
    return ["\n".join(lines)]
