"""``numa-pin metrics``: its options, the textfile it writes and the drift lines it logs; the CLI side of
watch/metrics.py (the snapshot), exposition.py (the textfile) and drift.py (the drift actions).

Imported only when the command is ``metrics``, so numa-pin exec's start path stays lean.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..act import resctrl_groups
from ..watch import drift, exposition, metrics
from ..read.systemctl import run_command

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, TextIO


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``numa-pin metrics`` on its subparser."""
    parser.add_argument("--textfile-dir", default=exposition.TEXTFILE_DIR,
                        help="node_exporter's textfile collector directory; %s is written there atomically "
                             "(default: %%(default)s)" % exposition.TEXTFILE_NAME)
    parser.add_argument("--stdout", action="store_true", help="print the metrics instead of writing the textfile")
    parser.add_argument("--json", action="store_true", help="print the snapshot as JSON instead of writing the textfile")
    parser.add_argument("--plan-dir", default=metrics.PLAN_DIR,
                        help="where the inference_service role wrote the plan records (default: %(default)s)")
    parser.add_argument("--state-dir", default=drift.STATE_DIR,
                        help="where drift actions are counted and rate-limited (default: %(default)s)")
    parser.add_argument("--drift-interval", type=float, default=drift.DEFAULT_DRIFT_INTERVAL,
                        help="seconds an instance's on_drift action waits before it is taken again "
                             "(default: %(default)s)")


def run(args: argparse.Namespace, out: TextIO, err: TextIO = sys.stderr) -> int:
    """Collect, log (and act on) drift, write the textfile or print; NumaError is left to the CLI's edge.

    --stdout and --json are a look, not the timer's run: drift is logged, never acted on. The timer's
    run acts only on what the state directory recorded first, and writes the textfile even when that
    directory fails.
    """
    drift.check_interval(args.drift_interval)
    snapshot = metrics.collect("/", args.plan_dir, run_command)
    if args.stdout or args.json:
        actions = {}  # type: dict
        lines = drift.drift_actions(snapshot["instances"], actions, args.drift_interval, time.time(), run_command,
                                    act=False)[0]
    else:
        lines, actions = drift.act_on_drift(snapshot, args.state_dir, args.drift_interval, time.time(),
                                            run_command)
        lines.extend(_adopt_resctrl(snapshot))
    for line in ["warning: %s" % warning for warning in snapshot["warnings"]] + lines:
        err.write("numa-pin metrics: %s\n" % line)
    if args.json:
        out.write(json.dumps(snapshot, indent=2, sort_keys=True) + "\n")
    elif args.stdout:
        out.write(exposition.render(snapshot, actions))
    else:
        exposition.write_textfile(args.textfile_dir, exposition.render(snapshot, actions))
    return 0


def _adopt_resctrl(snapshot: metrics.Snapshot) -> List[str]:
    """The timer's monitor-group step: every running instance in a resctrl group of its own, and the counters of
    those just moved read again, so the textfile shows them from this run on."""
    instances = snapshot["instances"]
    lines, changed = resctrl_groups.adopt(instances, [entry["unit"] for entry in instances], snapshot["root"])
    metrics.add_bandwidth(snapshot["root"], [entry for entry in instances if entry["unit"] in changed])
    return lines
