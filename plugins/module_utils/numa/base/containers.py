"""Container runtimes: how a plan reaches a server started by ``podman run`` or ``docker run``.

A containerized service is still one argv in the unit's ``ExecStart=``; the runtime's ``run`` command is built
from the service's ``container`` entry once (``run_argv``, deploy time), and the flags that depend on the plan
(``plan_flags``: the cgroup cpuset, the plan's environment, the GPUs as devices) are put after ``run`` where the
``{token}``s are filled: by numa-pin at every start, by the role in pin_mode systemd (base/tokens.server_command).

What each runtime can apply (docs/containers.md has the measurements):

- ``podman``: the container's first process descends from the ``podman run`` that numa-pin execs
  (podman -> conmon -> runc -> the server), so the CPU affinity and the memory policy numa-pin set are
  inherited: every policy the planner chooses reaches the server. The cgroup cpuset says the same again
  (``--cpuset-cpus``, and ``--cpuset-mems`` unless the policy only prefers a node), and ``--cgroups=split``
  keeps conmon and the container in the unit's own cgroup, where the audit and the metrics find them.
- ``docker``: the daemon starts the container, not the client the unit runs, so nothing numa-pin sets reaches
  it: only the cgroup cpuset applies, which binds (``cpuset.mems`` restricts every allocation to its nodes) but
  can neither interleave nor prefer. The preflight and numa-pin refuse those plans for docker.

GPUs are passed by their CDI names (``nvidia.com/gpu=3``); the container then sees only its GPUs, numbered from 0
in bus order, so the visibility variables it gets are renumbered the same way. numa-pin exec imports this module
at every start of a containerized server: standard library only.
"""
from __future__ import annotations

from .errors import NumaError
from .gpu_vendors import VENDORS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

ALL_POLICIES = ("bind", "preferred", "interleave", "weighted_interleave")
# How long a runtime's stop waits before it kills the container (podman's and docker's own default).
DEFAULT_STOP_SECONDS = 10
# Where docker's container ids are written: root's own, cleared at boot.
CID_DIR = "/run"
# The word after the program that every rendered command has: the plan's flags go right after it.
RUN = "run"
# Run options numa-pin or the role set, which the service's own options must not give again or undo.
OWN_OPTIONS = ("--cpuset-cpus", "--cpuset-mems", "--cgroups", "--cgroup-parent", "--name", "--rm", "--replace",
               "--detach", "-d", "--sdnotify", "--network", "--net", "--env-host", "--cpus", "--numa",
               "--cidfile")


class Runtime:
    """One container runtime: its program and the ``run`` options every service gets; whether a daemon starts its
    containers (then nothing numa-pin sets reaches them, only the cgroup cpuset binds, and their cgroup is their own,
    found by the id file); the flags it has for a missing container and a registry's credentials; the unit type and
    settings its ``run`` needs."""

    __slots__ = ("name", "program", "run_options", "daemon", "ignore_missing", "auth_flag", "unit_type",
                 "unit_settings")

    def __init__(self, name: str, program: str, run_options: Tuple[str, ...], daemon: bool,
                 ignore_missing: Tuple[str, ...], auth_flag: Optional[str], unit_type: str,
                 unit_settings: Mapping[str, str]) -> None:
        self.name = name
        self.program = program
        self.run_options = run_options
        self.daemon = daemon
        self.ignore_missing = ignore_missing
        self.auth_flag = auth_flag
        self.unit_type = unit_type
        self.unit_settings = dict(unit_settings)

    @property
    def policies(self) -> Tuple[str, ...]:
        """The memory policies it applies: every one where numa-pin's own reaches the container, else the cpuset's."""
        return ("bind",) if self.daemon else ALL_POLICIES


RUNTIMES = {
    runtime.name: runtime for runtime in (
        # --sdnotify=conmon: conmon says READY once the container runs (and names itself MAINPID, hence
        # NotifyAccess=all); --replace: a container of the same name left by a crash is removed first;
        # --cgroups=split leaves the unit's own cgroup to podman, so ExecStop='s podman needs Delegate=yes (else
        # 219/CGROUP, measured in the lab).
        Runtime("podman", "/usr/bin/podman", ("--rm", "--replace", "--cgroups=split", "--sdnotify=conmon"),
                False, ("--ignore",), "--authfile", "notify", {"NotifyAccess": "all", "Delegate": "yes"}),
        # The client stays attached; a container left by a crash of the client is removed before the next start.
        Runtime("docker", "/usr/bin/docker", ("--rm",), True, (), None, "exec", {}),
    )
}


def runtime(name: str) -> Runtime:
    """The table's record of a runtime name; NumaError naming the choices for any other."""
    if name not in RUNTIMES:
        raise NumaError("container runtime %r is none of %s: give one of them" % (name, ", ".join(RUNTIMES)))
    return RUNTIMES[name]


def container_name(service: str, instance: str = "{instance}") -> str:
    """The container of an instance of a service (by default of ``{instance}``, the token filled at start)."""
    return "%s-%s" % (service, instance)


def cid_file(service: str, instance: str = "{instance}") -> str:
    """Where docker writes the id of an instance's container (``--cidfile``): the audit finds its cgroup by it."""
    return "%s/inferops-numa-%s.cid" % (CID_DIR, container_name(service, instance))


def run_argv(spec: Mapping[str, Any], service: str, command: Sequence[str], env_names: Sequence[str]) -> List[str]:
    """``[program, "run", options..., image, command...]`` for a service's ``container`` entry: the runtime's own
    options, the container's name, network, volumes, devices, registry credentials and pull policy, the names of
    the service's environment (their values come from the unit), the entry's own options, the image, then the
    server's arguments. Raises NumaError for an option that would undo the binding."""
    chosen = runtime(spec.get("runtime") or "podman")
    options = [str(option) for option in spec.get("options") or []]
    clashing = sorted({option.partition("=")[0] for option in options} & set(OWN_OPTIONS))
    if clashing:
        raise NumaError("container options %s are set by inferops.numa from the plan and the entry (cpuset, name, "
                        "network, cgroup, lifetime): remove them, or use the container keys network, volumes, "
                        "devices" % ", ".join(clashing))
    argv = [spec.get("program") or chosen.program, RUN] + list(chosen.run_options)
    argv += ["--name", container_name(service), "--network", spec.get("network") or "host"]
    argv += _repeated("--volume", spec.get("volumes")) + _repeated("--device", spec.get("devices"))
    argv += _repeated("--env", env_names)
    if chosen.daemon:  # the container's cgroup is the daemon's, found by its id
        argv += ["--cidfile", cid_file(service)]
    if spec.get("auth_file") and chosen.auth_flag:
        argv += [chosen.auth_flag, spec["auth_file"]]
    if spec.get("pull"):
        argv += ["--pull", spec["pull"]]
    return argv + options + [spec["image"]] + list(command)


def unit_commands(spec: Mapping[str, Any], service: str, stop_seconds: Optional[int] = None) -> Dict[str, List[List[str]]]:
    """The unit's commands around a runtime's ``run`` of instance ``{instance}``, by setting (``ExecStartPre``,
    ``ExecStop``, ``ExecStopPost``; systemd ignores their failures): the container stopped by its runtime (SIGTERM,
    then SIGKILL after ``stop_seconds``, default the runtimes' 10: a server running as the container's PID 1 has no
    default SIGTERM handler), then removed, with docker's id file, so a container a crash left never holds the
    name; a runtime without a daemon (podman) does that before a start itself (``--replace``)."""
    chosen = runtime(spec.get("runtime") or "podman")
    program = spec.get("program") or chosen.program
    name = container_name(service)
    stop = [program, "stop"] + list(chosen.ignore_missing) + ["--time", str(stop_seconds or DEFAULT_STOP_SECONDS), name]
    remove = [[program, "rm", "--force"] + list(chosen.ignore_missing) + [name]]
    if not chosen.daemon:
        return {"ExecStop": [stop], "ExecStopPost": remove}
    remove.append(["/bin/rm", "-f", cid_file(service)])
    return {"ExecStartPre": remove, "ExecStop": [stop], "ExecStopPost": remove}


def _repeated(flag: str, values: Optional[Sequence[Any]]) -> List[str]:
    return [word for value in values or () for word in (flag, str(value))]


def policy_problem(name: str, policy: str) -> Optional[str]:
    """Why the runtime cannot apply a plan's memory policy (one line with the fix), or None when it can."""
    chosen = runtime(name)
    if policy in chosen.policies:
        return None
    return ("container runtime %s applies only a cgroup cpuset (its daemon starts the container, so numa-pin's memory "
            "policy never reaches it), which cannot %s: run the service with runtime podman, or give it a model "
            "that fits one node (policy bind)" % (chosen.name, policy.replace("_", " ")))


def plan_flags(name: str, plan: Mapping[str, Any], bound: bool = True) -> List[str]:
    """The runtime's flags for one instance's plan: the cpuset (unless ``bound`` is false, the A/B gate's unbound
    baseline), the plan's environment with GPU visibility renumbered for the container, and the GPUs by CDI name.
    Raises NumaError when the runtime cannot apply the plan's policy."""
    problem = policy_problem(name, plan.get("policy") or "bind")
    if problem and bound:
        raise NumaError(problem)
    flags = []  # type: List[str]
    if bound:
        flags += ["--cpuset-cpus", plan.get("cpulist") or ""]
        if plan.get("policy") != "preferred":
            flags += ["--cpuset-mems", ",".join(str(node) for node in plan.get("mem_nodes") or [])]
    env, devices = container_gpus(plan.get("env") or {})
    flags += [word for key in sorted(env) for word in ("--env", "%s=%s" % (key, env[key]))]
    return flags + [word for device in devices for word in ("--device", device)]


def container_gpus(env: Mapping[str, str]) -> Tuple[Dict[str, str], List[str]]:
    """(the plan's environment as the container must see it, the CDI names of its GPUs).

    A visibility variable names host indices in the order the server uses them (``CUDA_VISIBLE_DEVICES=3,1``);
    the container holds only those GPUs, numbered by the same bus order from 0, so it becomes ``1,0`` and the
    devices ``nvidia.com/gpu=3``, ``nvidia.com/gpu=1``."""
    result = dict(env)
    devices = []  # type: List[str]
    for vendor in VENDORS:
        if not vendor.visible_devices or vendor.visible_devices not in env:
            continue
        host = [int(word) for word in str(env[vendor.visible_devices]).split(",") if word.strip().isdigit()]
        order = sorted(host)
        result[vendor.visible_devices] = ",".join(str(order.index(index)) for index in host)
        devices += ["%s=%d" % (vendor.cdi_kind, index) for index in host] if vendor.cdi_kind else []
    return result, devices


def with_plan_flags(argv: Sequence[str], name: str, plan: Mapping[str, Any], bound: bool = True) -> List[str]:
    """``argv`` (a rendered ``run`` command) with the plan's flags right after ``run``."""
    if len(argv) < 2 or argv[1] != RUN:
        raise NumaError("container command %r does not start with the runtime's program and %r: let the role render "
                        "it from the service's container entry" % (list(argv[:2]), RUN))
    return list(argv[:2]) + plan_flags(name, plan, bound) + list(argv[2:])
