"""Memory bandwidth the hardware counts per group of tasks: resctrl's monitoring (Intel RDT MBM, AMD QoS), read.

Where resctrl is mounted (``mount -t resctrl resctrl /sys/fs/resctrl``) and ``info/L3_MON/mon_features``
lists ``mbm_local_bytes`` / ``mbm_total_bytes``, every group of tasks has, per L3 domain
(``mon_data/mon_L3_<id>``), the bytes its tasks moved to and from memory: ``mbm_total_bytes`` all of it,
``mbm_local_bytes`` the part served by the memory of the domain the task ran on. They are cumulative
counters of the group's own tasks. With sub-NUMA clustering a domain's files already sum its
``mon_sub_L3_*`` directories, so only the domain's own files are added up.

The groups (Documentation/filesystems/resctrl.rst): the default group is resctrl's root; every other
directory there holding ``tasks`` is a control group; monitor groups sit in ``mon_groups`` of either.
A task is in one control group and at most one of its monitor groups, and a control group's ``tasks``
lists its monitor groups' tasks too. An instance's *own* group is the most specific group holding its
main process whose tasks are all threads of the instance's processes: only then do the counters measure
the instance alone. The default group counts the whole host and is never an instance's own.

Reading changes nothing; act/resctrl_groups.py makes the monitor groups. Absent hardware, an unmounted
resctrl or a counter the kernel reports ``Unavailable`` is None, never zero.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..base.cpulist import parse_integer
from .kernel_files import Root, numbered, parse_status

RESCTRL = "sys/fs/resctrl"
FEATURES = "info/L3_MON/mon_features"
# (the snapshot's name, the kernel's event file): traffic to the task's own domain's memory, and all of it.
BANDWIDTH_EVENTS = (("local_bytes", "mbm_local_bytes"), ("total_bytes", "mbm_total_bytes"))
# Entries of resctrl's root that are not control groups.
_NOT_GROUPS = frozenset(("info", "mon_groups", "mon_data"))
# A tasks file holds one task id a line; the default group's lists every task of the host.
MAX_TASKS_BYTES = 64 << 20


class Group(NamedTuple):
    """A resctrl group: its path under resctrl's root ("" the default group, "g", "mon_groups/m",
    "g/mon_groups/m"), the control group it is in ("" the default), and whether it is a monitor group."""

    path: str
    control: str
    monitor: bool


class Hierarchy(NamedTuple):
    """Every group and the task ids it lists, as read at one moment, and the monitoring events the host counts."""

    features: FrozenSet[str]
    tasks: Dict[Group, Set[int]]


def counts_bandwidth(features: Iterable[str]) -> bool:
    return any(event in features for _name, event in BANDWIDTH_EVENTS)


def read_hierarchy(root: str) -> Optional[Hierarchy]:
    """The groups under ``root``'s resctrl, or None where it counts no memory bandwidth (no such hardware,
    resctrl not mounted, monitoring off)."""
    with Root(root) as tree:
        try:
            features = frozenset(tree.read("%s/%s" % (RESCTRL, FEATURES)).decode("ascii", "replace").split())
        except OSError:
            return None
        if not counts_bandwidth(features):
            return None
        return Hierarchy(features, dict((group, _tasks(tree, group)) for group in _groups(tree)))


def _groups(tree: Root) -> List[Group]:
    controls = [Group("", "", False)] + [Group(name, name, False) for name in sorted(_listed(tree, RESCTRL))
                                         if name not in _NOT_GROUPS and tree.exists(_rel(name, "tasks"))]
    monitors = []
    for control in controls:
        for name in sorted(_listed(tree, _rel(control.path, "mon_groups"))):
            path = join(control.path, "mon_groups", name)
            if tree.exists(_rel(path, "tasks")):
                monitors.append(Group(path, control.path, True))
    return controls + monitors


def _listed(tree: Root, rel: str) -> List[str]:
    try:
        return tree.listdir(rel)
    except OSError:
        return []


def join(*parts: str) -> str:
    """A group's path from its parts, the empty ones (the default group's) left out."""
    return "/".join(part for part in parts if part)


def _rel(group_path: str, name: str) -> str:
    """A file of a group, relative to the root."""
    return join(RESCTRL, group_path, name)


def _tasks(tree: Root, group: Group) -> Set[int]:
    """The task ids the group's ``tasks`` lists; none where it cannot be read (a group removed meanwhile)."""
    try:
        text = tree.read(_rel(group.path, "tasks"), MAX_TASKS_BYTES).decode("ascii", "replace")
    except OSError:
        return set()
    return set(tid for tid in (_count(word) for word in text.split()) if tid is not None)


def _count(word: str) -> Optional[int]:
    """A task id or a counter as the kernel prints it; None for "Unavailable", "Error" or anything else."""
    number = parse_integer(word)
    return number if number is not None and number >= 0 else None


def group_of(hierarchy: Hierarchy, tid: int) -> Optional[Group]:
    """The most specific group listing ``tid``: its monitor group, else its control group; None when none does."""
    holding = [group for group, tasks in hierarchy.tasks.items() if tid in tasks]
    return max(holding, key=lambda group: (group.monitor, group.path != ""), default=None)


def instance_threads(root: str, pids: Sequence[int]) -> Set[int]:
    """Every thread id of the processes ``pids`` (``/proc/<pid>/task``); a process that exited has none."""
    threads = set()  # type: Set[int]
    with Root(root) as tree:
        for pid in pids:
            try:
                threads.update(numbered(tree.listdir("proc/%d/task" % pid), ""))
            except OSError:
                continue
    return threads


def foreign_tasks(root: str, tasks: Iterable[int], pids: Sequence[int], threads: Set[int]) -> List[int]:
    """The tasks that are no thread of the processes ``pids``: not among ``threads`` (listed after ``tasks``
    was read, so a thread started meanwhile is there), and alive with another thread group id."""
    foreign = []
    with Root(root) as tree:
        for tid in sorted(set(tasks) - threads):
            try:
                status = parse_status(tree.read("proc/%d/status" % tid).decode("ascii", "replace"))
            except OSError:
                continue  # exited since the group was read
            if status.get("Tgid", "").strip() not in set(str(pid) for pid in pids):
                foreign.append(tid)
    return foreign


def own_group(root: str, hierarchy: Hierarchy, main_pid: int, pids: Sequence[int],
              threads: Set[int]) -> Tuple[Optional[Group], str]:
    """(The instance's own group, "") or (None, why it has none); ``threads``: instance_threads, listed after
    the hierarchy was read."""
    group = group_of(hierarchy, main_pid)
    if group is None:
        return None, "its main process %d is in no resctrl group" % main_pid
    if group.path == "":
        return None, "it is in resctrl's default group, which counts the whole host"
    strangers = foreign_tasks(root, hierarchy.tasks[group], pids, threads)
    if strangers:
        return None, ("its resctrl group %s also holds %d task(s) of other processes (task %d first), so its "
                      "counters are not the instance's" % (group.path, len(strangers), strangers[0]))
    return group, ""


def bandwidth(root: str, group: Group, features: FrozenSet[str]) -> Dict[str, Optional[int]]:
    """{"local_bytes": n, "total_bytes": n}: each counter summed over the group's L3 domains; None for one the
    host does not count, or that a domain reports ``Unavailable`` or ``Error`` (a part would understate it)."""
    with Root(root) as tree:
        data = _rel(group.path, "mon_data")
        domains = sorted(name for name in _listed(tree, data) if name.startswith("mon_L3_")
                         and _count(name[7:]) is not None)
        return dict((name, _summed(tree, data, domains, event) if event in features else None)
                    for name, event in BANDWIDTH_EVENTS)


def _summed(tree: Root, data: str, domains: Sequence[str], event: str) -> Optional[int]:
    total = 0
    for domain in domains:
        try:
            word = tree.read("%s/%s/%s" % (data, domain, event)).decode("ascii", "replace").strip()
        except OSError:
            return None
        count = _count(word)
        if count is None:
            return None  # "Unavailable", "Error"
        total += count
    return total if domains else None


def instance_bandwidth(root: str, hierarchy: Optional[Hierarchy], main_pid: int,
                       pids: Sequence[int]) -> Dict[str, Optional[object]]:
    """What the metrics show of an instance: {"group", "local_bytes", "total_bytes", "reason"}; counters None
    and the reason said where the host does not count bandwidth or the instance has no group of its own."""
    absent = {"group": None, "local_bytes": None, "total_bytes": None, "reason": ""}  # type: Dict[str, Optional[object]]
    if hierarchy is None:
        return dict(absent, reason="the host counts no memory bandwidth (no resctrl monitoring)")
    group, reason = own_group(root, hierarchy, main_pid, pids, instance_threads(root, pids))
    if group is None:
        return dict(absent, reason=reason)
    counted = bandwidth(root, group, hierarchy.features)
    return dict(absent, group=group.path, **counted)
