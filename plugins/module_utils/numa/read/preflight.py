"""The host's half of the preflight: what a deployment needs from this host, looked at before anything changes.

Read-only. Each problem is one line, "[service NAME: ]what: cause; fix":

- systemd runs as PID 1 (every service and the metrics timer are systemd units);
- each service's instances plan here (its layout gives instances, the model fits), with the planner the
  deployment and the fleet report use (decide/services.plan_service);
- each service's server binary (``command[0]``) is an executable file, found as systemd finds it;
- the cgroup the units run in (system.slice) allows the CPUs and memory nodes of each plan: the planner sees
  the cpuset of the process that plans, which is not always the one a unit starts in;
- ``set_mempolicy`` is allowed (a seccomp filter or a container can refuse it, and numa-pin then cannot
  bind);
- the balancing knob is writable when the run is to set it;
- root here can read the pages of another user's process (CAP_SYS_PTRACE in this process's effective set) when
  a service audits and runs as another user: without it (a container's default capabilities) the audit of the
  first restarted instance fails, after the change.

The syscall check runs only on the live host (``root`` "/"): a captured tree has no kernel to ask.

A warning is a line of the same form for what works but costs: a GPU of a plan with no NIC on its node, on a host
that has NICs, sends its traffic to other hosts across the socket link.
"""

import errno
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .kernel_files import Root, printable, read_status
from .topology import read
from ..base.containers import policy_problem
from ..base.cpulist import format_cpulist, parse_cpulist
from ..base.errors import NumaError
from ..decide.services import plan_service

# systemd's executable search path for a command without a slash (systemd.service(5), "Command lines").
SYSTEMD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# The slice system units run in, and the files where cgroup v2 says what its cpuset allows.
SYSTEM_SLICE = "sys/fs/cgroup/system.slice"
BALANCING_KNOB = "proc/sys/kernel/numa_balancing"
# capability(7): reading /proc/<pid>/numa_maps of another user's process is a ptrace read, which root passes
# only with this capability in its effective set (CapEff in /proc/self/status, a hex mask).
CAP_SYS_PTRACE = 19
_CAP_MASK = re.compile(r"^[0-9a-fA-F]{1,32}$")
# The accounts that own every process: no capability is needed to read their own pages.
ROOT_USERS = ("root", "0")


def host_findings(root: str, services: Sequence[Mapping[str, Any]],
                  balancing: str = "keep") -> Tuple[List[str], List[str]]:
    """(every problem this host has with ``services`` (inference_service_list entries, defaults merged) and with
    setting balancing to ``balancing`` (keep: not set), every warning)."""
    problems = systemd_problems(root)
    if balancing != "keep":
        problems += balancing_problems(root)
    if not services:
        return problems, []
    if root == "/":
        problems += mempolicy_problems()
    problems += audit_problems(root, services)
    topology = read(root)
    allowed = slice_allowed(root)
    warnings = []  # type: List[str]
    for entry in services:
        name = str(entry.get("name"))
        found, told = service_findings(root, entry, topology, allowed)
        problems += ["service %s: %s" % (name, problem) for problem in found]
        warnings += ["service %s: %s" % (name, warning) for warning in told]
    return problems, warnings


def systemd_problems(root: str) -> List[str]:
    with Root(root) as tree:
        comm = _text(tree, "proc/1/comm")
        booted = tree.exists("run/systemd/system")
    if comm == "systemd" and booted:
        return []
    # One line for both runs: a real one refuses with it, a dry run (--check) plans without systemd and says it.
    return ["systemd: PID 1 here is %s, not systemd; starting, restarting, enabling and auditing the instances, and "
            "the metrics timer, need it: run the roles on a host booted with systemd (--check plans here without "
            "it)" % (printable(comm) if comm else "unknown")]


def balancing_problems(root: str) -> List[str]:
    path = os.path.join(root, BALANCING_KNOB)
    if not os.path.exists(path):
        return []  # a kernel without automatic NUMA balancing: nothing to turn off (numa_balancing says so)
    if not os.access(path, os.W_OK) or os.statvfs(path).f_flag & os.ST_RDONLY:
        return ["numa_host_balancing: /%s is read-only here (a container, or /proc/sys mounted read-only); "
                "set it on the host that owns the kernel and give numa_host_balancing: keep" % BALANCING_KNOB]
    return []


def mempolicy_problems() -> List[str]:
    from ..system.kernel import KernelCallError, set_mempolicy

    try:
        set_mempolicy("default", [])
    except KernelCallError as exc:
        if exc.errno in (errno.EPERM, errno.ENOSYS, errno.EACCES):
            return ["memory policy: set_mempolicy is refused here (%s): numa-pin could not bind memory; allow "
                    "the syscall (the container's seccomp profile) or run on the host" % errno.errorcode.get(
                        exc.errno, exc.errno)]
    return []


def audit_problems(root: str, services: Sequence[Mapping[str, Any]], euid: Optional[int] = None) -> List[str]:
    """A line for each auditing service of another user when this process, as root (``euid``, default its
    own), lacks CAP_SYS_PTRACE; none where the capability set cannot be read (nothing to say then)."""
    users = [(str(entry.get("name")), str(entry.get("user") or entry.get("name"))) for entry in services
             if entry.get("audit", True) and str(entry.get("user") or entry.get("name")) not in ROOT_USERS]
    if not users or (os.geteuid() if euid is None else euid) != 0 or _has_capability(root, CAP_SYS_PTRACE) is not False:
        return []
    return ["service %s: audit: root here lacks CAP_SYS_PTRACE, so it cannot read /proc/<pid>/numa_maps of the "
            "service's user %s (a container's default capabilities); grant CAP_SYS_PTRACE to the run, or set "
            "audit: false" % (printable(name), printable(user)) for name, user in users]


def _has_capability(root: str, bit: int) -> Optional[bool]:
    """Whether this process's effective capabilities hold ``bit`` (/proc/self/status under ``root``); None when
    the file or its CapEff line cannot be read."""
    try:
        status = read_status(root, "self")
    except NumaError:
        return None
    mask = (status or {}).get("CapEff", "")
    if not _CAP_MASK.match(mask):
        return None
    return bool(int(mask, 16) >> bit & 1)


def slice_allowed(root: str) -> Optional[Dict[str, List[int]]]:
    """The CPUs and memory nodes system.slice allows (cgroup v2), or None where the files are not there."""
    with Root(root) as tree:
        cpus = _text(tree, SYSTEM_SLICE + "/cpuset.cpus.effective")
        mems = _text(tree, SYSTEM_SLICE + "/cpuset.mems.effective")
    try:
        return {"cpus": parse_cpulist(cpus), "mems": parse_cpulist(mems)} if cpus and mems else None
    except NumaError:
        return None


def service_findings(root: str, entry: Mapping[str, Any], topology: Mapping[str, Any],
                     allowed: Optional[Mapping[str, List[int]]]) -> Tuple[List[str], List[str]]:
    """(the entry's problems, its warnings), each line led by the unit it is of."""
    problems = command_problems(root, entry.get("command") or [])
    warnings = []
    runtime = (entry.get("container") or {}).get("runtime")
    for row in plan_service(topology, entry):
        where = row["unit"] or "placement"
        unapplied = policy_problem(runtime, row["policy"]) if runtime and not row["error"] else None
        if row["error"] or unapplied:
            problems.append("%s: %s" % (where, row["error"] or unapplied))
            continue
        if allowed is not None:
            problems += ["%s: %s" % (where, problem) for problem in _outside_slice(row, allowed)]
        if row["gpus_without_nic"] and topology.get("nics"):
            # Only where the host has NICs: a single box without any has no traffic to other hosts to misroute.
            warnings.append("%s: GPU(s) %s have no NIC on their node: their traffic to other hosts (NCCL, UCX) "
                            "crosses the socket link; give the instance GPUs on a node with a NIC, or put one "
                            "there" % (where, printable(", ".join(row["gpus_without_nic"]))))
    return problems, warnings


def command_problems(root: str, command: Sequence[str]) -> List[str]:
    if not command:
        return ["command: empty; give the server's argv as a list"]
    program = str(command[0])
    if "{" in program:
        return []  # a {token} is an instance's, filled at start
    candidates = [program] if "/" in program else [os.path.join(path, program) for path in SYSTEMD_PATH]
    if any(_is_executable(os.path.join(root, candidate.lstrip("/"))) for candidate in candidates):
        return []
    where = "is not an executable file here" if "/" in program else "is in none of %s" % ":".join(SYSTEMD_PATH)
    return ["command: %s %s; install the server first, or give command[0] the path of its binary"
            % (printable(program), where)]


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _outside_slice(row: Mapping[str, Any], allowed: Mapping[str, List[int]]) -> List[str]:
    problems = []
    cpus = set(parse_cpulist(row["cpulist"])) - set(allowed["cpus"])
    if cpus:
        problems.append("CPUs %s of its plan are outside system.slice's cpuset (%s, /%s/cpuset.cpus.effective); "
                        "widen the slice's AllowedCPUs= or reserve those CPUs (reserve_cpus)"
                        % (format_cpulist(sorted(cpus)), format_cpulist(allowed["cpus"]), SYSTEM_SLICE))
    mems = set(row["mem_nodes"]) - set(allowed["mems"])
    if mems:
        problems.append("memory nodes %s of its plan are outside system.slice's cpuset (%s, "
                        "/%s/cpuset.mems.effective); widen the slice's AllowedMemoryNodes= or pin another node"
                        % (format_cpulist(sorted(mems)), format_cpulist(allowed["mems"]), SYSTEM_SLICE))
    return problems


def _text(tree: Root, rel: str) -> str:
    try:
        return tree.read(rel, 4096).decode("utf-8", "replace").strip()
    except (OSError, NumaError):
        return ""
