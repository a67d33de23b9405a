"""Each running instance in a resctrl monitor group of its own, so the hardware counts its memory bandwidth.

The metrics timer (root) calls ``adopt`` after reading the snapshot. For an instance whose main process
has no group of its own (read/resctrl.own_group), it makes ``inferops-numa.<unit>`` in ``mon_groups`` of
the control group the process is in, and writes each of the instance's threads there. A monitor group
only changes which counter a task's traffic is added to (its RMID), never its cache or bandwidth
allocation (its control group), and the kernel moves a task only into a monitor group of the control
group it is already in. Threads the server starts later inherit the group of the thread that starts
them; one started while the instance was moved is moved at the next run. An instance the operator put
in a monitor group of their own is left there. The counters begin when the group is made, within one
timer period of the start.

Monitor IDs (RMIDs) are few (``info/L3_MON/num_rmids``, a few dozen to a few hundred): a restarted
instance takes the same group again, and a group of a unit no longer recorded is removed once empty.

Only monitor groups this module names are ever made, written to or removed. Each is reached from the
resctrl directory a name at a time without following a link (system/root_files, as every file root writes).
"""

from __future__ import annotations

import errno
import os
from typing import Any, List, Mapping, Sequence, Set, Tuple

from ..read import resctrl
from ..read.resctrl import Group, Hierarchy
from ..system import root_files, safe_fs

GROUP_PREFIX = "inferops-numa."
# Made only where asked: in resctrl's file system a directory made is a group, and takes a monitor ID.
GROUP_MODE = 0o755
UNIT_SUFFIX = ".service"


def group_name(unit: str) -> str:
    """``llama@0.service`` -> ``inferops-numa.llama@0``."""
    return GROUP_PREFIX + (unit[:-len(UNIT_SUFFIX)] if unit.endswith(UNIT_SUFFIX) else unit)


def adopt(instances: Sequence[Mapping[str, Any]], recorded_units: Sequence[str],
          root: str = "/") -> Tuple[List[str], Set[str]]:
    """Give each running instance its own monitor group, and remove the empty ones of units no longer
    recorded. (Journal lines for what changed or failed, the units whose group changed.) Nothing where
    the host counts no memory bandwidth."""
    hierarchy = resctrl.read_hierarchy(root)
    if hierarchy is None:
        return [], set()
    try:
        top, _problem, _owner = safe_fs.walk(root, safe_fs.names_of(root, resctrl.RESCTRL), None)
    except OSError as exc:
        return ["resctrl: cannot open %s (%s): no instance's memory bandwidth is measured"
                % (os.path.join(root, resctrl.RESCTRL), exc.strerror)], set()
    lines, changed = [], set()  # type: List[str], Set[str]
    try:
        for entry in instances:
            if entry.get("up") and entry.get("main_pid"):
                line = _adopt_instance(top, root, hierarchy, entry)
                if line:
                    lines.append(line)
                    changed.add(entry["unit"])
        lines.extend(_remove_unrecorded(top, root, hierarchy, set(recorded_units)))
    finally:
        os.close(top)
    return lines, changed


def _adopt_instance(top: int, root: str, hierarchy: Hierarchy, entry: Mapping[str, Any]) -> str:
    """What was done to put the instance in a group of its own; "" when it has one or cannot be moved."""
    unit, main_pid, pids = entry["unit"], entry["main_pid"], entry["pids"]
    current = resctrl.group_of(hierarchy, main_pid)
    threads = resctrl.instance_threads(root, pids)
    own, _reason = resctrl.own_group(root, hierarchy, main_pid, pids, threads)
    if current is None or (own is None and current.monitor):
        return ""  # exited, or in a monitor group someone else made: theirs to keep
    target = own or Group(resctrl.join(current.control, "mon_groups", group_name(unit)), current.control, True)
    if not target.monitor:
        return ""  # a control group of its own: counted already
    made = target not in hierarchy.tasks
    try:
        group_fd = _open_group(top, root, target.path, make=made)
    except OSError as exc:
        return "resctrl: %s: cannot make monitor group %s: %s; its memory bandwidth is not measured" % (
            unit, target.path, _why(exc))
    try:
        moved, problem = _move(group_fd, _to_move(hierarchy, target, threads), _shown(root, target.path))
    finally:
        os.close(group_fd)
    if not (made or moved or problem):
        return ""
    return "resctrl: %s: %smonitor group %s: %d thread(s) moved in%s" % (
        unit, "made " if made else "", target.path, moved, "; %s" % problem if problem else "")


def _to_move(hierarchy: Hierarchy, target: Group, threads: Set[int]) -> List[int]:
    """The instance's threads in the target's control group but not yet in the target."""
    moving = []
    for tid in sorted(threads):
        group = resctrl.group_of(hierarchy, tid)
        if group is not None and group != target and group.control == target.control:
            moving.append(tid)
    return moving


def _move(group_fd: int, tids: Sequence[int], shown: str) -> Tuple[int, str]:
    """(How many of ``tids`` the group's ``tasks`` took, the problem that stopped the rest or "")."""
    if not tids:
        return 0, ""
    try:
        # O_APPEND: each write moves one task, as the kernel's interface reads them.
        tasks = root_files.open_in(group_fd, "tasks", os.O_WRONLY | os.O_APPEND, os.path.join(shown, "tasks"))
    except OSError as exc:
        return 0, "cannot open its tasks file: %s" % _why(exc)
    moved = 0
    try:
        for tid in tids:
            try:
                os.write(tasks, b"%d\n" % tid)
                moved += 1
            except OSError as exc:
                if exc.errno not in (errno.ESRCH, errno.EINVAL):  # exited, or moved to another control group
                    return moved, "thread %d not moved: %s" % (tid, _why(exc))
    finally:
        os.close(tasks)
    return moved, ""


def _remove_unrecorded(top: int, root: str, hierarchy: Hierarchy, recorded_units: Set[str]) -> List[str]:
    lines = []
    recorded_names = set(group_name(unit) for unit in recorded_units)
    for group, tasks in sorted(hierarchy.tasks.items()):
        parent, _slash, name = group.path.rpartition("/")
        if not group.monitor or tasks or not name.startswith(GROUP_PREFIX):
            continue
        if name in recorded_names:
            continue  # a stopped instance: it takes its group again at its next start
        try:
            parent_fd = _open_group(top, root, parent, make=False)
        except OSError:
            continue
        try:
            root_files.remove_directory(parent_fd, name)
            lines.append("resctrl: removed the empty monitor group %s: no unit of that name is deployed" % group.path)
        except OSError as exc:
            lines.append("resctrl: cannot remove the empty monitor group %s: %s" % (group.path, _why(exc)))
        finally:
            os.close(parent_fd)
    return lines


def _open_group(top: int, root: str, path: str, make: bool) -> int:
    """A descriptor of the group directory ``path`` under resctrl's (``top``), each name opened from its parent
    without following a link; with ``make`` its last name is made when missing (never one before it)."""
    names = [name for name in path.split("/") if name]
    return root_files.open_below(top, names, _shown(root, ""), GROUP_MODE if make else None)


def _shown(root: str, path: str) -> str:
    """The group ``path`` as messages name it."""
    return os.path.join(root, resctrl.RESCTRL, path)


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return ("the hardware's monitor IDs are all in use (info/L3_MON/num_rmids); remove monitor groups no "
                "longer needed")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied; numa-pin metrics makes monitor groups as root, as its timer runs it"
    return "%s; see %s" % (exc.strerror or exc, "info/last_cmd_status")
