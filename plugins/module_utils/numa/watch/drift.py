"""Continuous proof, acted on: what the metrics timer does about an instance whose pages drifted.

A ``bind`` instance whose share of pages on its plan's nodes falls below its ``min_local_percent`` is
drifted (metrics.collect judges it; exposition.render shows ``inferops_numa_instance_drift 1``).
``drift_actions`` says in the journal which pages are where and, where the service opted in (``on_drift``),
acts at most once per ``interval`` per instance: ``evict`` moves the instance's pages on other nodes back to
its plan's nodes (migrate_pages(2), as ``migratepages`` does), ``restart`` restarts the unit (numa-pin exec
places it again and drops remote page cache of its model at start).

An action is taken only once the state directory holds it: when that write fails (a full /var) no
action is taken, so the interval holds across runs, reboots and full disks, and the textfile is still
written. The state directory is reached and trusted as exposition.py reaches the textfile's.
"""

import copy
import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import metrics
from ..read import audit, systemctl
from ..system import safe_fs, trusted_files
from ..base.cpulist import format_cpulist
from ..base.errors import NumaError, shown
from ..decide.records import is_count

STATE_DIR = "/var/lib/inferops-numa"
STATE_NAME = "drift-actions.json"
DEFAULT_DRIFT_INTERVAL = 3600
# Far beyond any Unix time of this machine's life, and small enough for float arithmetic.
MAX_STATE_SECONDS = 1 << 40
MAX_STATE_COUNT = 1 << 53

Migrate = Callable[[int, Sequence[int], Sequence[int]], int]
# Writes the drift state durably before an action is taken; NumaError when it cannot.
Record = Callable[[Mapping[str, Dict[str, Any]]], Any]


def read_actions(state_dir: str) -> Dict[str, Dict[str, Any]]:
    """unit -> {"last_seconds": when its last action was taken, "counts": {action: n}}; {} when none yet.
    NumaError when the state cannot be read or trusted: when each unit last acted is then unknown."""
    path = os.path.join(state_dir, STATE_NAME)
    fix = "remove it to start every drift interval again"
    try:
        fd = trusted_files.open_checked_directory(state_dir, "state directory", safe_fs.PRIVATE_DIR)
    except FileNotFoundError:
        return {}
    try:
        value, _mtime = trusted_files.read_trusted_json(fd, STATE_NAME, path, fix)
    except FileNotFoundError:
        return {}
    finally:
        os.close(fd)
    for unit, entry in value.items():
        if not _is_state_entry(entry):
            raise NumaError("ignoring %s: the entry of %s is not {\"last_seconds\": seconds, \"counts\": {action: n}} "
                            "of %s; %s" % (path, shown(unit), ", ".join(metrics.ON_DRIFT[1:]), fix))
    return value


def _is_state_entry(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("counts"), dict):
        return False
    last = entry.get("last_seconds")
    # NaN compares false, so it is no number here; a huge one would overflow the float arithmetic.
    if isinstance(last, bool) or not isinstance(last, (int, float)) or not 0 <= last <= MAX_STATE_SECONDS:
        return False
    return all(action in metrics.ON_DRIFT[1:] and is_count(count, MAX_STATE_COUNT)
               for action, count in entry["counts"].items())


def act_on_drift(snapshot: metrics.Snapshot, state_dir: str, interval: float, now: float,
                 run: systemctl.CommandRunner,
                 migrate: Optional[Migrate] = None) -> Tuple[List[str], Dict[str, Dict[str, Any]]]:
    """The timer's drift step: drift_actions with the state of ``state_dir``, each action written there before
    it is taken. State that cannot be read or trusted is a warning of the snapshot and no action.
    (The journal lines, the action counts to render.)"""
    try:
        actions = read_actions(state_dir)
    except NumaError as exc:
        snapshot["warnings"].append("no on_drift action is taken: %s" % exc)
        return drift_actions(snapshot["instances"], {}, interval, now, run, act=False)[0], {}
    lines, _changed = drift_actions(snapshot["instances"], actions, interval, now, run, migrate,
                                    record=lambda marked: write_actions(state_dir, marked))
    return lines, actions


def drift_actions(instances: Sequence[Mapping[str, Any]], actions: Dict[str, Dict[str, Any]], interval: float,
                  now: float, run: systemctl.CommandRunner, migrate: Optional[Migrate] = None,
                  act: bool = True, record: Optional[Record] = None) -> Tuple[List[str], bool]:
    """Journal lines for every drifted instance; with ``act``, the on_drift action of each that opted in
    and last acted more than ``interval`` seconds ago, counted in ``actions``. The counts are handed to
    ``record`` (which writes them durably) before any action is taken, and none is taken when that fails
    or there is no ``record``: an action not remembered would be taken again at every run.
    (The lines, whether ``actions`` changed.)"""
    lines = []
    due = []  # type: List[Tuple[Mapping[str, Any], str]]
    for entry in instances:
        if not entry["drift"]:
            continue
        lines.append("drift: %s" % entry["message"])  # the audit's words: the share, and the remote pages per node
        action = entry["on_drift"]
        if action == "none" or not act:
            continue
        last = (actions.get(entry["unit"]) or {}).get("last_seconds")
        if last is not None and now - last < interval:
            lines.append("drift: %s: on_drift %s not taken: the last action was %.0f s ago, within the %g s "
                         "interval" % (entry["unit"], action, now - last, interval))
            continue
        due.append((entry, action))
    if not due:
        return lines, False
    marked = _marked(actions, due, now)
    problem = _recorded(record, marked)
    if problem:
        lines.append("drift: on_drift %s not taken: it could not be recorded first: %s"
                     % (", ".join("%s of %s" % (action, entry["unit"]) for entry, action in due), problem))
        return lines, False
    actions.update(marked)
    lines.extend(_act(entry, action, run, migrate) for entry, action in due)
    return lines, True


def _marked(actions: Mapping[str, Dict[str, Any]], due: Sequence[Tuple[Mapping[str, Any], str]],
            now: float) -> Dict[str, Dict[str, Any]]:
    """The state with each due action taken at ``now``; ``actions`` itself changes only once that is recorded."""
    marked = copy.deepcopy(dict(actions))
    for entry, action in due:
        counts = marked.setdefault(entry["unit"], {"counts": {}})["counts"]
        marked[entry["unit"]]["last_seconds"] = now
        counts[action] = int(counts.get(action, 0)) + 1
    return marked


def _recorded(record: Optional[Record], marked: Mapping[str, Dict[str, Any]]) -> str:
    """Why ``marked`` is not durably recorded; "" once it is."""
    if record is None:
        return "no state directory was given to record it in"
    try:
        record(marked)
    except NumaError as exc:
        return str(exc)
    return ""


def _act(entry: Mapping[str, Any], action: str, run: systemctl.CommandRunner, migrate: Optional[Migrate]) -> str:
    unit = entry["unit"]
    if action == "restart":
        rc, out, err = run(["systemctl", "restart", "--", unit])
        if rc != 0:
            return "drift: %s: restart FAILED (rc %d): %s" % (unit, rc, (err or out).strip())
        return "drift: %s: restarted (on_drift restart)" % unit
    if migrate is None:
        from ..system.kernel import migrate_pages as migrate
    remote = sorted(int(node) for node in entry["remote_nodes"])
    notes = []
    for pid in entry["pids"]:
        try:
            left = migrate(pid, remote, entry["mem_nodes"])
            notes.append("PID %d: %s" % (pid, "moved" if not left else "%d pages could not be moved" % left))
        except NumaError as exc:
            notes.append("PID %d: NOT moved: %s" % (pid, exc))
    return "drift: %s: pages on node(s) %s moved to node(s) %s (on_drift evict): %s" % (
        unit, format_cpulist(remote), entry["nodes"], "; ".join(notes) or "no process")


def write_actions(state_dir: str, actions: Mapping[str, Any]) -> str:
    return trusted_files.write_atomically(state_dir, STATE_NAME, json.dumps(actions, indent=1, sort_keys=True) + "\n",
                                          "state directory", mode=0o600)


def check_interval(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= audit.MAX_WAIT_SECONDS * 30:
        raise NumaError("drift interval %s is not a number of seconds from 0 to %d: give one like %d"
                        % (value, audit.MAX_WAIT_SECONDS * 30, DEFAULT_DRIFT_INTERVAL))
