"""Where a running service's memory and threads really are, judged against its Plan.

Reads only what the kernel reports, never our own outputs:

- ``/proc/<pid>/numa_maps``: resident pages per node for every mapping. A line
  has no ``N<node>=`` counts when nothing of it is resident. Counts are in the
  mapping's ``kernelpagesize_kB`` (4 for normal pages, 2048 for hugetlb), so
  sums are kept in bytes and converted to base pages only for reporting.
- ``/proc/<pid>/task/<tid>/status`` and ``stat``: each thread's
  ``Cpus_allowed_list``, ``Mems_allowed_list`` and the CPU it last ran on.
  ``Mems_allowed_list`` follows cpusets, not the memory policy, so memory is
  judged from numa_maps only.

Three kinds of resident pages:

- ``anon``: mappings without a backing file (heap, stack, malloc arenas, a model
  read with --no-mmap) and mappings whose resident pages are all anonymous
  (``anon=`` equals the total, e.g. MAP_PRIVATE hugetlb). They follow the
  memory policy.
- ``file``: the other file-backed mappings -- page cache, such as an mmap-ed
  model, sitting wherever the file was first read (the page-cache trap). The
  few copy-on-write pages of a private file mapping stay here: numa_maps does
  not say on which node they are.
- ``code``: every mapping of a file the process also maps executable (in
  ``/proc/<pid>/maps``): program and library images, their text and their
  read-only and data segments alike. One copy serves every process on the
  host (the kernel never replicates it per node), so a second instance's
  image is "remote" by construction; it is reported, and left out of the
  local share. A model file is never mapped executable, so it stays ``file``.

The local share is the bytes on the plan's ``mem_nodes`` over the resident
``anon`` + ``file`` bytes (or one of them, ``pages``). It is enforced
(``min_local_percent``) for ``bind`` plans; for ``preferred`` and interleave
plans it is reported, with the spread across the interleave set. A thread
allowed or last seen on a CPU outside the plan's CPUs always fails the audit.

An audit never passes with nothing audited: a PID that has no memory of its own
(a kernel thread, a zombie) fails it with that reason, and so does a ``bind``
plan with no resident pages to judge.
"""

import os
import re
import time
from typing import Any, Callable, Collection, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple, Union

from ..base.containers import cid_file
from ..base.cpulist import format_cpulist, parse_cpulist
from ..inputs import judging
from ..base.errors import NumaError, shown
from .kernel_files import Root, parse_maps, proc_text, read_status
from .systemctl import CommandRunner, container_pids, run_command, show_unit, unit_pids
from ..base.sizes import finite_number, format_size
from ..decide.records import plan_problem
from ..system import trusted_files

KINDS = ("anon", "file", "code")
INTERLEAVE_POLICIES = ("interleave", "weighted-interleave")
# Under weighted interleave each node's share of the pages must be within this many percentage points of its
# weight's share: the kernel hands out pages in weight-long runs per allocation, and a 2 MiB THP or a large
# page-cache folio is one allocation, so a small instance's split is coarse; a policy that ignores the weights
# (plain interleave over 2:2:1 nodes: 33 % instead of 20 %) falls outside it.
WEIGHT_BAND_PERCENT = 10.0
_WEIGHTS_DIR = "sys/kernel/mm/mempolicy/weighted_interleave"
# A plan file an audit cannot trust or read: what to do instead.
PLAN_FILE_FIX = ("deploy the service with the inference_service role, or give the JSON that numa-pin explain prints "
                 "in a directory only root may write")
# RSS counts as settled when two samples one poll apart differ by at most this share.
RSS_SETTLED_SHARE = 0.01
POLL_SECONDS = 1.0
# Longest wait (and settle period) an audit accepts: a day covers the slowest model load, and
# a bounded number keeps the polling loop finite.
MAX_WAIT_SECONDS = 86400
# PID_MAX_LIMIT of a 64-bit kernel: kernel.pid_max can be set no higher.
MAX_PID = 1 << 22
# proc(5): the flags field of /proc/<pid>/stat; PF_KTHREAD from include/linux/sched.h.
PF_KTHREAD = 0x00200000
# proc(5) states of a process that has exited: zombie, dead. Its memory is already freed.
EXITED_STATES = ("Z", "X")

_NODE_COUNT = re.compile(r"^N(\d+)=(\d+)$")
_COUNTER = re.compile(r"^([A-Za-z_]+)=(\d+)$")
# Words numa_maps prints between the policy and the counters.
_FLAGS = frozenset(("heap", "stack", "huge"))


class MapsLine(NamedTuple):
    """One resident mapping of numa_maps."""

    policy: str
    kind: str  # one of KINDS
    page_bytes: int
    pages: Dict[int, int]  # node -> pages of page_bytes


class Expectation(NamedTuple):
    """What a Plan says the process should look like; ``weights``: the kernel's weighted-interleave weights of
    its mem_nodes, for a weighted-interleave plan (else empty)."""

    policy: Optional[str]
    mem_nodes: List[int]
    cpus: List[int]
    weights: Mapping[int, int] = {}


def parse_numa_maps_line(line: str, executable: Collection[int] = ()) -> Optional[MapsLine]:
    """A numa_maps line -> MapsLine, or None when nothing of the mapping is resident.

    ``executable``: start addresses of the executable mappings (from maps), so that
    file-backed code is told apart from file data.

    Layout: ``<address> <policy> [file=PATH|heap|stack] [huge] key=value... N<node>=<pages>...
    kernelpagesize_kB=<kB>``. The policy may hold spaces (``prefer (many):0-1``,
    ``weighted interleave:0-1``); a path never does (the kernel escapes it).
    """
    fields = line.split()
    policy_words = []  # type: List[str]
    has_file = False
    counters = {}  # type: Dict[str, int]
    pages = {}  # type: Dict[int, int]
    for field in fields[1:]:
        node = _NODE_COUNT.match(field)
        counter = _COUNTER.match(field)
        if node:
            pages[int(node.group(1))] = int(node.group(2))
        elif counter:
            counters[counter.group(1)] = int(counter.group(2))
        elif field.startswith("file="):
            has_file = True
        elif field not in _FLAGS and not counters and not has_file:
            policy_words.append(field)
    if not pages:
        return None
    if "kernelpagesize_kB" not in counters:
        raise NumaError("numa_maps line without kernelpagesize_kB: %r" % line)
    if not has_file or counters.get("anon", 0) >= sum(pages.values()):
        kind = "anon"
    elif int(fields[0], 16) in executable:
        kind = "code"
    else:
        kind = "file"
    return MapsLine(" ".join(policy_words) or "unknown", kind, counters["kernelpagesize_kB"] * 1024, pages)


def executable_starts(maps_text: str) -> Set[int]:
    """Start addresses of the mappings of program images in a ``/proc/<pid>/maps`` text.

    An image is a file with at least one executable mapping; all its mappings
    (text, rodata, data) count, so a library's read-only data is not taken
    for page cache the service chose to read.
    """
    mappings = [(start, perms, path) for start, perms, _device, _inode, path in parse_maps(maps_text) if path]
    images = set(path for _start, perms, path in mappings if "x" in perms)
    return set(start for start, _perms, path in mappings if path in images)


def parse_numa_maps(text: str, executable: Collection[int] = ()) -> List[MapsLine]:
    """Every resident mapping of a numa_maps file."""
    lines = []
    for raw in text.splitlines():
        parsed = parse_numa_maps_line(raw, executable)
        if parsed is not None:
            lines.append(parsed)
    return lines


def node_bytes(lines: Sequence[MapsLine]) -> Dict[int, Dict[str, int]]:
    """node -> {"anon": bytes, "file": bytes, "code": bytes}."""
    totals = {}  # type: Dict[int, Dict[str, int]]
    for line in lines:
        for node, count in line.pages.items():
            entry = totals.setdefault(node, _zero())
            entry[line.kind] += count * line.page_bytes
    return totals


def _zero() -> Dict[str, int]:
    return dict((kind, 0) for kind in KINDS)


def policy_bytes(lines: Sequence[MapsLine]) -> Dict[str, int]:
    """Resident bytes per memory policy as numa_maps prints it (``bind:1``, ``default`` ...)."""
    totals = {}  # type: Dict[str, int]
    for line in lines:
        totals[line.policy] = totals.get(line.policy, 0) + sum(line.pages.values()) * line.page_bytes
    return totals


def _stat_fields(stat_text: str) -> List[str]:
    """The fields of a ``stat`` file from field 3 (state) on; the name before them may hold spaces and ')'."""
    dummy, sep, rest = stat_text.rpartition(")")
    return rest.split() if sep else []


def _stat_number(fields: List[str], field: int) -> Optional[int]:
    """Field number ``field`` (1-based, as proc(5) counts) of _stat_fields' list; None unless a 64-bit number."""
    index = field - 3
    text = fields[index] if 0 <= index < len(fields) else ""
    return int(text) if text.isdecimal() and len(text) <= 20 else None


def last_cpu(stat_text: str) -> Optional[int]:
    """Field 39 (``processor``) of ``/proc/<pid>/task/<tid>/stat``."""
    return _stat_number(_stat_fields(stat_text), 39)


def without_memory(pid: int, status: Mapping[str, str], stat_text: str) -> Optional[str]:
    """Why a process has no memory of its own to audit, or None when it has.

    A zombie has exited (state Z or X); a kernel thread has no mm (PF_KTHREAD in the flags, field 9);
    either way status shows no ``VmRSS``, the one sign left when stat cannot be read.
    """
    fields = _stat_fields(stat_text)
    name = status.get("Name", "")
    flags = _stat_number(fields, 9)
    if fields and fields[0] in EXITED_STATES:
        return ("PID %d (%s) is a zombie (state %s in /proc/%d/stat): it has exited and its memory is freed; "
                "audit a running process of the service" % (pid, name, fields[0], pid))
    if flags is not None and flags & PF_KTHREAD:
        return ("PID %d (%s) is a kernel thread (PF_KTHREAD in /proc/%d/stat): it has no memory of its own; "
                "give the PID of the service's process" % (pid, name, pid))
    if "VmRSS" not in status:
        return ("PID %d (%s) has no memory map (no VmRSS in /proc/%d/status): it is a kernel thread or has "
                "exited; give the PID of the service's running process" % (pid, name, pid))
    return None


def check_pids(pids: Sequence[Any]) -> List[int]:
    """The PIDs, each a process ID (1 to MAX_PID) given once: a PID listed twice would count its memory twice."""
    seen = set()  # type: Set[int]
    for pid in pids:
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= MAX_PID:
            raise NumaError("PID %s is not a process ID (1 to %d): give the PID of a running process"
                            % (shown(pid), MAX_PID))
        if pid in seen:
            raise NumaError("PID %d is given twice: list each process once" % pid)
        seen.add(pid)
    return list(pids)


def check_seconds(name: str, value: Any) -> None:
    """A wait the polling loop can finish: NaN or infinity would never reach its deadline."""
    if not finite_number(value) or not 0 <= value <= MAX_WAIT_SECONDS:
        raise NumaError("%s %s is not a number of seconds from 0 to %d: give one like 60"
                        % (name, shown(value), MAX_WAIT_SECONDS))


def load_plan(path: str) -> Dict[str, Any]:
    """A plan file: the record the inference_service role wrote, or the JSON numa-pin explain prints. The audit's
    verdict on it decides whether a change is rolled back, so it is read as every plan record is
    (trusted_files.read_plan_record: no link followed, a directory and a file only root may write, at most
    MAX_JSON_BYTES, one JSON object) and its fields checked as the metrics check them (decide/records)."""
    plan = trusted_files.read_plan_record(path, PLAN_FILE_FIX)
    if plan is None:
        raise NumaError("plan file %s does not exist: deploy the service with the inference_service role "
                        "first, or give the JSON that numa-pin explain prints" % path)
    problem = plan_problem(plan)
    if problem:
        raise NumaError("refusing the plan file %s: %s; %s" % (path, problem, PLAN_FILE_FIX))
    return plan


def expectation(plan: Optional[Mapping[str, Any]]) -> Optional[Expectation]:
    """The parts of a Plan (or plan record) the audit compares with; None without a plan."""
    if plan is None:
        return None
    if not isinstance(plan, Mapping):
        raise NumaError("plan %r is not a mapping: pass the plan dict of numa_plan or its plan file" % (plan,))
    try:
        mem_nodes = sorted(int(node) for node in plan.get("mem_nodes") or [])
        if plan.get("cpus"):
            cpus = sorted(int(cpu) for cpu in plan["cpus"])
        else:
            cpus = parse_cpulist(plan.get("cpulist") or "")
    except (TypeError, ValueError) as exc:
        raise NumaError("plan has unreadable mem_nodes/cpus (%s): pass the plan dict of numa_plan" % exc)
    return Expectation(plan.get("policy"), mem_nodes, cpus)


def with_kernel_weights(expect: Optional[Expectation], root: str) -> Optional[Expectation]:
    """``expect`` with the kernel's weights of its mem_nodes when it is a weighted-interleave plan: what the kernel
    placed the pages by. A node without a readable weight leaves the split unjudged."""
    if expect is None or expect.policy != "weighted-interleave":
        return expect
    weights = {}
    try:
        with Root(root) as tree:
            for node in expect.mem_nodes:
                text = tree.read("%s/node%d" % (_WEIGHTS_DIR, node), 64).decode("ascii", "replace").strip()
                if not text.isdigit() or int(text) <= 0:
                    return expect
                weights[node] = int(text)
    except OSError:
        return expect
    return expect._replace(weights=weights)


def _tasks(root: str, pid: int) -> List[int]:
    try:
        names = os.listdir(os.path.join(root, "proc", str(pid), "task"))
    except (FileNotFoundError, ProcessLookupError):
        return []
    return sorted(int(name) for name in names if name.isdigit())


def _thread_report(root: str, pid: int, tid: int) -> Optional[Dict[str, Any]]:
    # A thread that exits while it is read is left out, not an error.
    status = read_status(root, pid, tid)
    if status is None:
        return None
    stat_text = proc_text(root, pid, "stat", tid) or ""
    return {"tid": tid, "name": status.get("Name", ""),
            "cpus_allowed": status.get("Cpus_allowed_list", ""),
            "mems_allowed": status.get("Mems_allowed_list", ""),
            "last_cpu": last_cpu(stat_text)}


def _outside(thread: Mapping[str, Any], cpus: List[int]) -> bool:
    allowed = set(parse_cpulist(thread["cpus_allowed"]))
    if allowed - set(cpus):
        return True
    return thread["last_cpu"] is not None and thread["last_cpu"] not in cpus


def _off_plan(threads: List[Mapping[str, Any]], expect: Optional[Expectation]) -> Optional[int]:
    """How many of the threads last ran on a CPU outside the plan's (field 39 of their stat): one straggler shows
    here even where every thread may run only on the plan's CPUs. None without a plan's CPUs to compare with."""
    if not (expect and expect.cpus):
        return None
    return sum(1 for thread in threads if thread["last_cpu"] is not None and thread["last_cpu"] not in expect.cpus)


def _percent(part: int, whole: int) -> Optional[float]:
    if whole <= 0:
        return None
    return round(100.0 * part / whole, 2)


def _selected(entry: Mapping[str, int], pages: str) -> int:
    if pages == "all":
        return entry["anon"] + entry["file"]
    return entry[pages]


def local_shares(nodes: Mapping[int, Mapping[str, int]], mem_nodes: List[int]) -> Dict[str, Optional[float]]:
    """Local percent of "all" (anon + file), anon, file and code bytes, given the nodes memory should be on."""
    shares = {}  # type: Dict[str, Optional[float]]
    for pages in judging.PAGE_SELECTIONS + ("code",):
        total = sum(_selected(entry, pages) for entry in nodes.values())
        local = sum(_selected(entry, pages) for node, entry in nodes.items() if node in mem_nodes)
        shares[pages] = _percent(local, total)
    return shares


def _nodes_out(nodes: Mapping[int, Mapping[str, int]], page_size: int) -> Dict[str, Dict[str, int]]:
    out = {}
    for node in sorted(nodes):
        entry = nodes[node]
        out[str(node)] = {}
        for kind in KINDS:
            out[str(node)][kind + "_bytes"] = entry[kind]
            out[str(node)][kind + "_pages"] = entry[kind] // page_size
    return out


def read_process(root: str, pid: int, page_size: int) -> Optional[Dict[str, Any]]:
    """Threads and per-node memory of one process, and why it has none (``without_memory``); None when it is gone."""
    status = read_status(root, pid)
    stat_text = proc_text(root, pid, "stat")
    numa_maps_text = _mappings_text(root, pid, "numa_maps")
    maps_text = _mappings_text(root, pid, "maps")
    if status is None or numa_maps_text is None or maps_text is None:
        return None
    threads = [thread for thread in (_thread_report(root, pid, tid) for tid in _tasks(root, pid)) if thread]
    lines = parse_numa_maps(numa_maps_text, executable_starts(maps_text))
    return {"pid": pid, "name": status.get("Name", ""),
            "cpus_allowed": status.get("Cpus_allowed_list", ""),
            "mems_allowed": status.get("Mems_allowed_list", ""),
            "threads": threads,
            "policies": policy_bytes(lines),
            "node_bytes": node_bytes(lines),
            "without_memory": without_memory(pid, status, stat_text or "")}


def _mappings_text(root: str, pid: int, name: str) -> Optional[str]:
    """proc_text of a file the kernel shows only to a ptrace reader (numa_maps, maps). Root is refused one of
    another user's process only without CAP_SYS_PTRACE (a container's default capabilities): then "run as root"
    is no fix, and the message names the capability."""
    try:
        return proc_text(root, pid, name)
    except NumaError as exc:
        # proc_text raises its NumaError while handling the PermissionError (from None hides it from tracebacks only).
        if os.geteuid() != 0 or not isinstance(exc.__context__, PermissionError):
            raise
        raise NumaError("cannot read %s: permission denied to root, which lacks CAP_SYS_PTRACE here (a container's "
                        "default capabilities) and so cannot read another user's process; grant CAP_SYS_PTRACE to "
                        "the run, or audit as the process's user" % os.path.join(root, "proc", str(pid), name)) from None


def _merge(into: Dict[int, Dict[str, int]], nodes: Mapping[int, Mapping[str, int]]) -> None:
    for node, entry in nodes.items():
        target = into.setdefault(node, _zero())
        for kind in KINDS:
            target[kind] += entry[kind]


def _process_out(raw: Dict[str, Any], expect: Optional[Expectation], page_size: int) -> Dict[str, Any]:
    nodes = raw["node_bytes"]
    outside = [t for t in raw["threads"] if expect and expect.cpus and _outside(t, expect.cpus)]
    result = {"pid": raw["pid"], "name": raw["name"], "cpus_allowed": raw["cpus_allowed"],
              "mems_allowed": raw["mems_allowed"], "thread_count": len(raw["threads"]),
              "threads_outside": outside, "threads_off_plan": _off_plan(raw["threads"], expect),
              "policies": raw["policies"],
              "nodes": _nodes_out(nodes, page_size),
              "resident_bytes": _resident(nodes), "without_memory": raw["without_memory"]}
    if expect is not None:
        shares = local_shares(nodes, expect.mem_nodes)
        result.update(local_percent=shares["all"], anon_local_percent=shares["anon"],
                      file_local_percent=shares["file"], code_local_percent=shares["code"])
    return result


def _resident(nodes: Mapping[int, Mapping[str, int]]) -> int:
    return sum(sum(entry.values()) for entry in nodes.values())


def _interleave_spread(nodes: Mapping[int, Mapping[str, int]], expect: Expectation,
                       pages: str) -> Dict[str, Optional[float]]:
    on_set = dict((node, _selected(nodes.get(node, _zero()), pages)) for node in expect.mem_nodes)
    total = sum(on_set.values())
    return dict((str(node), _percent(count, total)) for node, count in sorted(on_set.items()))


def _weight_shares(weights: Mapping[int, int]) -> Dict[str, float]:
    total = sum(weights.values())
    return {str(node): round(100.0 * weight / total, 2) for node, weight in sorted(weights.items())}


def _weight_problems(spread: Mapping[str, Optional[float]], wanted: Mapping[str, float]) -> List[str]:
    off = ["node %s %s%% (weight's share %s%%)" % (node, _pct(spread.get(node)), _pct(share))
           for node, share in wanted.items() if abs((spread.get(node) or 0.0) - share) > WEIGHT_BAND_PERCENT]
    if not off:
        return []
    return ["the weighted-interleave split is off its weights by more than %g points: %s; the kernel's weights "
            "changed after the pages were placed, or the pages were placed before the policy: restart the service"
            % (WEIGHT_BAND_PERCENT, ", ".join(off))]


def judge(processes: List[Dict[str, Any]], expect: Optional[Expectation], min_local_percent: float,
          pages: str, page_size: int) -> Dict[str, Any]:
    """Totals, shares and the verdict for raw process readings (see read_process)."""
    judging.check(min_local_percent, pages)
    totals = {}  # type: Dict[int, Dict[str, int]]
    for raw in processes:
        _merge(totals, raw["node_bytes"])
    report = {"processes": [_process_out(raw, expect, page_size) for raw in processes],
              "nodes": _nodes_out(totals, page_size),
              "resident_bytes": _resident(totals),
              "pages": pages, "min_local_percent": min_local_percent,
              "policy": expect.policy if expect else None,
              "expected_mem_nodes": expect.mem_nodes if expect else None,
              "expected_cpus": format_cpulist(expect.cpus) if expect else None,
              "local_percent": None, "remote_percent": None,
              "anon_local_percent": None, "file_local_percent": None, "code_local_percent": None,
              "interleave_percent": None, "interleave_weight_percent": None}
    problems = [raw["without_memory"] for raw in processes if raw["without_memory"]]
    if expect is not None:
        shares = local_shares(totals, expect.mem_nodes)
        local = shares[pages]
        report.update(local_percent=local, anon_local_percent=shares["anon"], file_local_percent=shares["file"],
                      code_local_percent=shares["code"],
                      remote_percent=None if local is None else round(100.0 - local, 2))
        if expect.policy in INTERLEAVE_POLICIES:
            report["interleave_percent"] = _interleave_spread(totals, expect, pages)
        if expect.weights and local:
            report["interleave_weight_percent"] = _weight_shares(expect.weights)
            problems.extend(_weight_problems(report["interleave_percent"], report["interleave_weight_percent"]))
        problems.extend(_memory_problems(totals, expect, min_local_percent, pages, local))
        problems.extend(_thread_problems(report["processes"], expect))
    report["ok"] = not problems
    report["msg"] = _message(report, problems)
    return report


def _memory_problems(totals: Mapping[int, Mapping[str, int]], expect: Expectation, min_local_percent: float,
                     pages: str, local: Optional[float]) -> List[str]:
    if expect.policy not in judging.ENFORCED_POLICIES:
        return []
    if local is None:
        return ["no %s memory is resident: nothing to hold to the bind plan; check that these are the "
                "service's processes, or audit pages=all" % ("anon + file" if pages == "all" else pages)]
    if local >= min_local_percent:
        return []
    remote = dict((node, entry) for node, entry in totals.items()
                  if node not in expect.mem_nodes and _selected(entry, pages))
    where = ", ".join("%s on node %d (anon %s, file %s)" % (
        format_size(_selected(entry, pages)), node, format_size(entry["anon"]), format_size(entry["file"]))
        for node, entry in sorted(remote.items()))
    return ["%.2f%% of the %s memory is on node(s) %s, below min_local_percent %s; remote: %s" % (
        local, "anon + file" if pages == "all" else pages, format_cpulist(expect.mem_nodes), min_local_percent,
        where)]


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else "%.2f" % value


def _thread_problems(processes: List[Mapping[str, Any]], expect: Expectation) -> List[str]:
    problems = []
    for process in processes:
        for thread in process["threads_outside"]:
            problems.append("PID %d thread %d (%s) may run on CPUs %s (last on CPU %s), outside the plan's %s"
                            % (process["pid"], thread["tid"], thread["name"], thread["cpus_allowed"],
                               thread["last_cpu"], format_cpulist(expect.cpus)))
    return problems


def _message(report: Mapping[str, Any], problems: List[str]) -> str:
    pids = ", ".join(str(p["pid"]) for p in report["processes"])
    head = "PID(s) %s: %s resident" % (pids, format_size(report["resident_bytes"]))
    if report["local_percent"] is not None:
        head += ", %.2f%% of %s on node(s) %s (anon %s%%, file %s%%; code %s%%, not counted)" % (
            report["local_percent"], "anon + file" if report["pages"] == "all" else report["pages"],
            format_cpulist(report["expected_mem_nodes"]), _pct(report["anon_local_percent"]),
            _pct(report["file_local_percent"]), _pct(report["code_local_percent"]))
    if report["interleave_percent"]:
        head += ", interleave spread %s" % ", ".join(
            "node %s %s%%" % (node, _pct(share)) for node, share in report["interleave_percent"].items())
    if report["interleave_weight_percent"]:
        head += " (weights' shares %s)" % ", ".join(
            "node %s %s%%" % item for item in report["interleave_weight_percent"].items())
    if not problems:
        return head
    return head + ". FAILED: " + "; ".join(problems)


def audit_pids(root: str, pids: Sequence[int], plan: Optional[Mapping[str, Any]] = None,
               min_local_percent: float = judging.DEFAULT_MIN_LOCAL_PERCENT, pages: str = judging.DEFAULT_PAGES,
               page_size: Optional[int] = None) -> Dict[str, Any]:
    """Audit explicit PIDs; a PID that does not exist is an error."""
    size = page_size or os.sysconf("SC_PAGE_SIZE")
    processes = []
    for pid in check_pids(pids):
        raw = read_process(root, pid, size)
        if raw is None:
            raise NumaError("no process %s under %s: give the PID of a running process" % (pid, os.path.join(root, "proc")))
        processes.append(raw)
    return judge(processes, with_kernel_weights(expectation(plan), root), min_local_percent, pages, size)


def _rss_kb(root: str, pid: int) -> Optional[int]:
    status = read_status(root, pid)
    if status is None:
        return None
    value = status.get("VmRSS", "").split()
    return int(value[0]) if value and value[0].isdigit() else None


class _Settle:
    """Tracks the MainPID's RSS until it stops growing for settle_seconds."""

    def __init__(self, settle_seconds: float) -> None:
        self.settle_seconds = settle_seconds
        self.last = None  # type: Optional[Tuple[int, int]]
        self.since = None  # type: Optional[float]

    def update(self, pid: int, rss_kb: Optional[int], now: float) -> bool:
        sample = None if rss_kb is None else (pid, rss_kb)
        steady = (sample is not None and self.last is not None and self.last[0] == pid
                  and abs(rss_kb - self.last[1]) <= self.last[1] * RSS_SETTLED_SHARE)
        self.last = sample
        if not steady:
            self.since = None
            return self.settle_seconds <= 0 and sample is not None
        if self.since is None:
            self.since = now
        return now - self.since >= self.settle_seconds


class _UnitWait:
    """One unit being waited for: active, with its MainPID's RSS settled."""

    def __init__(self, unit: str, settle_seconds: float) -> None:
        self.unit = unit
        self.settle = _Settle(settle_seconds)
        self.props = {}  # type: Dict[str, str]

    def poll(self, root: str, run: CommandRunner, now: float) -> bool:
        """Read the unit once; True when it is ready. A unit that is not loaded fails at once."""
        self.props = show_unit(self.unit, run)
        if self.props.get("LoadState") != "loaded":
            raise NumaError("unit %s is not loaded (LoadState=%s): check the unit name, and run "
                            "`systemctl daemon-reload` after writing it" % (self.unit, self.props.get("LoadState")))
        main = self._main_pid()
        return self._active() and self.settle.update(main, _rss_kb(root, main), now)

    def at_deadline(self, wait_seconds: float) -> List[str]:
        """Not ready in time: an error when it is not running, a warning when its memory still grows."""
        props, main = self.props, self._main_pid()
        if not self._active():
            raise NumaError("unit %s is not running after %ss (ActiveState=%s, SubState=%s, Result=%s, "
                            "MainPID=%s): see `journalctl -u %s`" % (
                                self.unit, wait_seconds, props.get("ActiveState"), props.get("SubState"),
                                props.get("Result"), main, self.unit))
        return ["unit %s: memory of PID %d was still growing after %ss; audited a service that "
                "may still be loading (raise wait_seconds)" % (self.unit, main, wait_seconds)]

    def _main_pid(self) -> int:
        return int(self.props.get("MainPID") or 0)

    def _active(self) -> bool:
        return self.props.get("ActiveState") == "active" and self._main_pid() > 0


WaitOutcome = Union[Tuple[Dict[str, str], List[str]], NumaError]


def wait_for_units(units: Sequence[str], root: str, run: CommandRunner, wait_seconds: float, settle_seconds: float,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Dict[str, WaitOutcome]:
    """Wait (bounded) until every unit is active and its MainPID's RSS has settled, all in the same seconds.

    Per unit: its properties and warnings, or the NumaError that ends its wait (not loaded: at once;
    never active: at the deadline). An RSS still growing at the deadline is only a warning: the audit
    then sees a service still loading.
    """
    check_seconds("wait_seconds", wait_seconds)
    check_seconds("settle_seconds", settle_seconds)
    deadline = clock() + wait_seconds
    waiting = dict((unit, _UnitWait(unit, settle_seconds)) for unit in units)
    outcomes = {}  # type: Dict[str, WaitOutcome]
    while True:
        for unit, wait in list(waiting.items()):
            try:
                ready = wait.poll(root, run, clock())
            except NumaError as exc:
                ready, outcomes[unit] = True, exc
            if ready:
                outcomes.setdefault(unit, (wait.props, []))
                del waiting[unit]
        if not waiting:
            return outcomes
        if clock() >= deadline:
            for unit, wait in waiting.items():
                try:
                    outcomes[unit] = (wait.props, wait.at_deadline(wait_seconds))
                except NumaError as exc:
                    outcomes[unit] = exc
            return outcomes
        sleep(POLL_SECONDS)


def wait_for_unit(unit: str, root: str, run: CommandRunner, wait_seconds: float, settle_seconds: float,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> Tuple[Dict[str, str], List[str]]:
    """wait_for_units for one unit: its properties and warnings, or its NumaError raised."""
    outcome = wait_for_units([unit], root, run, wait_seconds, settle_seconds, clock, sleep)[unit]
    if isinstance(outcome, NumaError):
        raise outcome
    return outcome


def instance_pids(root: str, unit: str, props: Mapping[str, str], plan: Optional[Mapping[str, Any]]) -> List[int]:
    """The processes of an instance: its unit's cgroup (a podman container's among them, run with --cgroups=split),
    and for a docker container, which its daemon starts elsewhere, the container's cgroup, named by its id file."""
    pids = unit_pids(root, props)
    if (plan or {}).get("container") != "docker":
        return pids
    service, at, instance = unit.rpartition(".")[0].partition("@")
    if not (at and service and instance):
        raise NumaError("unit %s runs a docker container, whose processes are found by the id file of an instance "
                        "<service>@<instance>.service: audit the service's instance unit" % shown(unit))
    return sorted(set(pids) | set(container_pids(root, cid_file(service, instance))))


def audit_props(root: str, unit: str, props: Mapping[str, str], warnings: List[str],
                plan: Optional[Mapping[str, Any]], min_local_percent: float, pages: str,
                page_size: Optional[int]) -> Dict[str, Any]:
    """Audit the processes of a unit whose ``systemctl show`` properties were read (no waiting)."""
    size = page_size or os.sysconf("SC_PAGE_SIZE")
    processes = []
    for pid in instance_pids(root, unit, props, plan):
        raw = read_process(root, pid, size)
        if raw is None:
            warnings.append("PID %d of %s exited while being audited" % (pid, unit))
        elif raw["without_memory"]:
            # A child the service has not reaped yet: nothing of it to judge, nor a fault of the service.
            warnings.append("%s: left out of the audit: %s" % (unit, raw["without_memory"]))
        else:
            processes.append(raw)
    if not processes:
        raise NumaError("unit %s has no running process to audit (MainPID=%s): see `journalctl -u %s`"
                        % (unit, props.get("MainPID"), unit))
    report = judge(processes, with_kernel_weights(expectation(plan), root), min_local_percent, pages, size)
    report["msg"] = "%s: %s" % (unit, report["msg"])
    report["unit"] = unit
    report["warnings"] = warnings
    return report


def audit_unit(root: str, unit: str, plan: Optional[Mapping[str, Any]] = None,
               min_local_percent: float = judging.DEFAULT_MIN_LOCAL_PERCENT,
               pages: str = judging.DEFAULT_PAGES, wait_seconds: float = 0, settle_seconds: float = 3.0,
               run: Optional[CommandRunner] = None, page_size: Optional[int] = None,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Dict[str, Any]:
    """Audit every process of a systemd unit, after waiting for it to be up."""
    judging.check(min_local_percent, pages)
    props, warnings = wait_for_unit(unit, root, run or run_command, wait_seconds, settle_seconds, clock, sleep)
    return audit_props(root, unit, props, warnings, plan, min_local_percent, pages, page_size)


class UnitAudit(NamedTuple):
    """One entry of audit_units: a unit, its plan (or None) and how to judge it."""
    unit: str
    plan: Optional[Mapping[str, Any]]
    min_local_percent: float
    pages: str


def audit_units(root: str, audits: Sequence[UnitAudit], wait_seconds: float = 0, settle_seconds: float = 3.0,
                run: Optional[CommandRunner] = None, page_size: Optional[int] = None,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> List[Dict[str, Any]]:
    """audit_unit for several units, waited for together; a unit that fails is a failed report."""
    for entry in audits:
        judging.check(entry.min_local_percent, entry.pages)
    outcomes = wait_for_units([entry.unit for entry in audits], root, run or run_command, wait_seconds,
                              settle_seconds, clock, sleep)
    reports = []
    for entry in audits:
        outcome = outcomes[entry.unit]
        try:
            if isinstance(outcome, NumaError):
                raise outcome
            reports.append(audit_props(root, entry.unit, outcome[0], list(outcome[1]), entry.plan,
                                       entry.min_local_percent, entry.pages, page_size))
        except NumaError as exc:
            reports.append({"unit": entry.unit, "ok": False, "msg": str(exc), "warnings": []})
    return reports


def audit_service(pids: Optional[Sequence[int]] = None, unit: Optional[str] = None,
                  plan: Optional[Mapping[str, Any]] = None,
                  min_local_percent: float = judging.DEFAULT_MIN_LOCAL_PERCENT, pages: str = judging.DEFAULT_PAGES,
                  root: str = "/", wait_seconds: float = 0) -> Dict[str, Any]:
    """``numa-pin audit``: a unit (waiting up to wait_seconds) or explicit PIDs, exactly one of them."""
    if bool(pids) == bool(unit):
        raise NumaError("audit needs either --unit NAME or --pid PID (one or more), not %s"
                        % ("both" if unit else "neither"))
    if unit:
        return audit_unit(root, unit, plan, min_local_percent, pages, wait_seconds)
    return audit_pids(root, list(pids or []), plan, min_local_percent, pages)
