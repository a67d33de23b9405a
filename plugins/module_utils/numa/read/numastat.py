"""How much of this host's memory traffic is remote right now: the kernel's NUMA counters.

``/sys/devices/system/node/node*/numastat`` counts page allocations per node:
``local_node`` (allocated here for a task running on this node), ``other_node``
(allocated here for a task running on another node), ``numa_hit`` / ``numa_miss``
(the policy's intended node got / did not get the page) and ``numa_foreign``
(intended here, placed elsewhere). ``/proc/vmstat`` has the same counters summed
over the host. Read twice over a window, their differences say what share of the
window's allocations were remote. They count allocations, not accesses: for
accesses, ``perf stat -e node-loads,node-load-misses`` where the CPU and the
permissions allow it.
"""
import os
import shutil
import subprocess
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from . import audit, systemctl
from ..base.errors import NumaError
from .kernel_files import NODE_DIR, node_ids, read_counter_file, read_vmstat

NUMASTAT_FIELDS = ("numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node", "other_node")
VMSTAT_FIELDS = ("numa_hit", "numa_miss", "numa_foreign", "numa_interleave", "numa_local", "numa_other")
PERF_EVENTS = ("node-loads", "node-load-misses")
# perf needs a moment to attach and to print its counts after the window.
PERF_GRACE_SECONDS = 10.0

Counters = Dict[str, Any]


def read_counters(root: str = "/") -> Counters:
    """``{"nodes": {node id: {field: count}}, "vmstat": {field: count}}`` from ``root``.

    Raises NumaError when there is nothing to read at all (no numastat and no numa
    lines in vmstat: a kernel without CONFIG_NUMA).
    """
    nodes = {}
    for node in node_ids(root):
        counts = _only(read_counter_file(root, "%s/node%d/numastat" % (NODE_DIR, node)), NUMASTAT_FIELDS)
        if counts:
            nodes[node] = counts
    vmstat = _only(read_vmstat(root), VMSTAT_FIELDS)
    if not nodes and not vmstat:
        raise NumaError("no NUMA allocation counters under %s (neither %s/node*/numastat nor numa_* in "
                        "proc/vmstat): the kernel was built without CONFIG_NUMA; there is no remote "
                        "memory to measure" % (root, NODE_DIR))
    return {"nodes": nodes, "vmstat": vmstat}


def _only(counts: Dict[str, int], fields: Sequence[str]) -> Dict[str, int]:
    return {field: counts[field] for field in fields if field in counts}


def remote_ratio(before: Counters, after: Counters, window_seconds: float) -> Dict[str, Any]:
    """Per node and host-wide, the window's allocations and the remote share of them."""
    nodes = []
    for node in sorted(set(before["nodes"]) & set(after["nodes"])):
        delta = _delta(before["nodes"][node], after["nodes"][node], NUMASTAT_FIELDS)
        entry = {"node": node, "allocations": delta["local_node"] + delta["other_node"]}  # type: Dict[str, Any]
        entry.update(delta)
        entry["remote_share"] = _share(delta["other_node"], entry["allocations"])
        entry["miss_share"] = _share(delta["numa_miss"], delta["numa_hit"] + delta["numa_miss"])
        nodes.append(entry)
    host = _delta(before["vmstat"], after["vmstat"], VMSTAT_FIELDS)
    host["allocations"] = host["numa_local"] + host["numa_other"]
    host["remote_share"] = _share(host["numa_other"], host["allocations"])
    return {
        "window_seconds": window_seconds,
        "nodes": nodes,
        "host": host,
        "definition": ("remote_share = other_node / (local_node + other_node): of the pages allocated on a "
                       "node in the window, the share allocated for a task running on another node; "
                       "miss_share = numa_miss / (numa_hit + numa_miss): pages placed off the policy's "
                       "intended node; null when nothing was allocated. Allocations, not accesses."),
    }


def _delta(before: Dict[str, int], after: Dict[str, int], fields: Sequence[str]) -> Dict[str, int]:
    # A counter that went backwards (node offlined and back) reads as 0, not negative.
    return {field: max(after.get(field, 0) - before.get(field, 0), 0) for field in fields}


def _share(part: int, whole: int) -> Optional[float]:
    return round(part / whole, 4) if whole else None


def sample(root: str = "/", window_seconds: float = 1.0, sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> Dict[str, Any]:
    """Read the counters, wait ``window_seconds``, read again; the remote_ratio of that window."""
    if isinstance(window_seconds, bool) or not isinstance(window_seconds, (int, float)) or window_seconds <= 0:
        raise NumaError("window_seconds=%r is not a positive number of seconds: give one like 1 or 5"
                        % (window_seconds,))
    before = read_counters(root)
    begin = clock()
    sleep(window_seconds)
    after = read_counters(root)
    return remote_ratio(before, after, round(clock() - begin, 2))


# --- perf: remote loads (accesses) of one process --------------------------------------------

def perf_command(pids: Sequence[int], window_seconds: float) -> List[str]:
    return ["perf", "stat", "-x", ",", "-e", ",".join(PERF_EVENTS), "-p", ",".join(str(pid) for pid in pids),
            "--", "sleep", "%g" % window_seconds]


def start_perf(pids: Sequence[int], window_seconds: float, which: Callable[[str], Optional[str]] = shutil.which,
               popen: Callable[..., Any] = subprocess.Popen) -> Any:
    """A running ``perf stat`` on ``pids`` for the window, or a dict saying why it is unavailable."""
    if which("perf") is None:
        return {"available": False, "reason": "perf is not installed (Debian/Ubuntu: apt install linux-perf)"}
    try:
        return popen(perf_command(pids, window_seconds), stdout=subprocess.DEVNULL,
                     stderr=subprocess.PIPE, universal_newlines=True)
    except OSError as exc:
        return {"available": False, "reason": "perf could not start: %s" % exc}


def finish_perf(process: Any, window_seconds: float) -> Dict[str, Any]:
    """The counts of a ``start_perf`` process (always waited for, killed if it hangs)."""
    if isinstance(process, dict):
        return process
    try:
        err = process.communicate(timeout=window_seconds + PERF_GRACE_SECONDS)[1]
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"available": False, "reason": "perf stat did not finish within %g s of the window and was killed"
                % PERF_GRACE_SECONDS}
    return parse_perf(err, process.returncode)


def parse_perf(text: str, returncode: int) -> Dict[str, Any]:
    """Counts from ``perf stat -x ,`` output; unavailable, in perf's own words, otherwise.

    perf's generic events: node-loads are loads served from any node's memory,
    node-load-misses those served from a remote node, so their ratio is the share of
    the process's memory loads that crossed nodes.
    """
    counts = {}  # type: Dict[str, int]
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) < 3 or fields[2] not in PERF_EVENTS:
            continue
        if not fields[0].isdigit():
            return {"available": False,
                    "reason": "perf reports %s for %s here: this CPU or VM has no such counter"
                              % (fields[0] or "nothing", fields[2])}
        counts[fields[2]] = int(fields[0])
    if returncode != 0 or set(counts) != set(PERF_EVENTS):
        first = next((line.strip() for line in text.splitlines() if line.strip()), "no output")
        return {"available": False,
                "reason": "perf stat failed (%s): check kernel.perf_event_paranoid (<= 1 for other users' "
                          "processes) or run as root" % first}
    return {"available": True, "node_loads": counts["node-loads"], "node_load_misses": counts["node-load-misses"],
            "remote_load_share": _share(counts["node-load-misses"], counts["node-loads"])}


# --- a service: its pages off plan, and the whole window ---------------------------------------

def service_share(root: str, pids: Sequence[int], plan: Optional[Mapping[str, Any]], unit: Optional[str] = None,
                  audit_pids: Callable[..., Dict[str, Any]] = audit.audit_pids) -> Dict[str, Any]:
    """The share of a service's resident pages not on its plan's memory nodes (numa_audit's reading)."""
    report = audit_pids(root, pids, plan)
    remote = report.get("remote_percent")
    summary = ("unit %s: " % unit if unit else "") + report.get("msg", "")
    if plan is None:
        summary += "; pass the service's plan to get the share of pages off its nodes"
    return {"unit": unit, "pids": list(pids), "plan_nodes": report.get("expected_mem_nodes"),
            "resident_bytes": report.get("resident_bytes"), "nodes": report.get("nodes"),
            "off_plan_share": None if remote is None else round(remote / 100.0, 4),
            "summary": summary}


def _show_unit(unit: str) -> Dict[str, str]:
    return systemctl.show_unit(unit, systemctl.run_command)


def service_pids(root: str, pids: Optional[Sequence[int]], unit: Optional[str],
                 show_unit: Callable[[str], Dict[str, str]] = _show_unit) -> List[int]:
    """PIDs of the service named by PIDs or by a systemd unit; checked to exist."""
    if pids and unit:
        raise NumaError("name the service by pids or by unit, not both")
    if unit:
        found = systemctl.unit_pids(root, show_unit(unit))
        if not found:
            raise NumaError("unit %s has no running process: start it, or pass its PIDs" % unit)
        return found
    listed = [int(pid) for pid in pids or []]
    for pid in listed:
        if not os.path.isdir(os.path.join(root, "proc", str(pid))):
            raise NumaError("no process %d under %s: give the PID of a running process"
                            % (pid, os.path.join(root, "proc")))
    return listed


def collect(root: str = "/", window_seconds: float = 1.0, pids: Optional[Sequence[int]] = None,
            unit: Optional[str] = None, plan: Optional[Mapping[str, Any]] = None,
            sleep: Callable[[float], None] = time.sleep,
            show_unit: Callable[[str], Dict[str, str]] = _show_unit,
            perf_start: Callable[[Sequence[int], float], Any] = start_perf,
            audit_pids: Callable[..., Dict[str, Any]] = audit.audit_pids) -> Dict[str, Any]:
    """The window's remote shares; for a service (``pids`` or ``unit``) also its pages off
    ``plan``'s nodes and, where perf can count them, its remote loads over the same window."""
    targets = service_pids(root, pids, unit, show_unit) if pids or unit else []
    if not targets:
        process = {"available": False,
                   "reason": "no service given: pass pids or unit to count its remote loads with perf"}  # type: Any
    elif root != "/":
        process = {"available": False, "reason": "perf counts live processes; root is %s" % root}
    else:
        process = perf_start(targets, window_seconds)
    try:
        result = sample(root, window_seconds, sleep)
    finally:
        # Always collected, so a perf started here never outlives the call.
        result_perf = finish_perf(process, window_seconds)
    result["perf"] = result_perf
    if targets:
        result["service"] = service_share(root, targets, plan, unit, audit_pids)
    return result
