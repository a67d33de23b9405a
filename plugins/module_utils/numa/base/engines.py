"""Engine recipes: what an inference engine needs to hear so its own NUMA binding and ours agree.

A plan binds the whole server process (CPU affinity and memory policy, inherited by every
worker it spawns). That is the whole job for an instance on one node. An instance whose GPUs
hang off several nodes gets the union of them instead, and binding each worker next to its GPU
is the engine's: the plan's ``gpu_map`` says, per GPU in the order the server sees them (the
visibility variable's order), the node, CPUs and memory node for its worker. A recipe turns that
into the engine's own switches, or turns the engine's binder off where ours binds everything,
so that two binders never fight:

- ``generic``: nothing; the plan's binding only.
- ``llama.cpp``: no ``--numa``, and a command giving one, or an environment holding
  ``LLAMA_ARG_NUMA`` (which llama.cpp reads as ``--numa``), is refused: in every ``--numa`` mode
  (``numactl`` included) ggml sets the main thread's affinity to all CPUs after each graph, so
  numa-pin's binding alone is what keeps llama.cpp on the plan's CPUs.
- ``vllm``: spanning, ``--numa-bind`` with ``--numa-bind-nodes`` and ``--numa-bind-cpus`` from the
  map (vLLM runs each worker under ``numactl --physcpubind --membind``, so it needs numactl and the
  spawn start method); on one node, nothing: vLLM binds only when asked.
- ``sglang``: spanning, ``--numa-node`` from the map (SGLang runs each worker under numactl);
  on one node, ``SGLANG_AUTO_NUMA_BIND=0`` so its NVML-driven binder does not rebind the workers.
- ``trtllm``: spanning, ``TLLM_NUMA_AWARE_WORKER_AFFINITY=1`` (each rank's affinity set to its
  GPU's node); on one node ``0``: unset, TensorRT-LLM clears an affinity it finds constrained.

Each engine is one ``Engine`` record in ``ENGINES`` (its recipe, the settings it must not be given, its
health path, the API an A/B gate asks it by): the request's ``engine`` choices, numa_rollout's, the refusals,
the readiness URL and the gate's ``auto`` API are all read from that table, so an engine is added by adding
its record. docs/engines.md records the engine versions each recipe was checked against. numa-pin exec
imports this module at every start: standard library only, ``typing`` for type checkers.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

    GpuMap = Sequence[Mapping[str, Any]]
    # (args, env, requires, reasons)
    Parts = Tuple[List[str], Dict[str, str], List[str], List[str]]
    Recipe = Callable[[GpuMap, bool], Parts]

GENERIC = "generic"
# The APIs an A/B gate can measure an engine by (measure/ab_gate asks each its own way): llama-server's /completion,
# which says its decode rate, or an OpenAI-compatible /v1/completions, timed.
LLAMA_CPP_API = "llama.cpp"
OPENAI_API = "openai"
APIS = (LLAMA_CPP_API, OPENAI_API)


class Engine:
    """One inference engine, all the collection knows of it: ``recipe`` (gpu_map, spanning) -> Parts;
    ``conflicts``, the settings that undo the plan's binding, each (flag, the environment variable the engine
    reads as that flag, why); ``health_path``, where it answers HTTP 200 once ready (None: none known, its port
    is probed); ``api``, the one of ``APIS`` an A/B gate set to ``auto`` asks it by."""

    __slots__ = ("name", "recipe", "conflicts", "health_path", "api", "nccl")

    def __init__(self, name: str, recipe: Recipe, conflicts: Tuple[Tuple[str, str, str], ...] = (),
                 health_path: Optional[str] = None, api: str = OPENAI_API, nccl: bool = False) -> None:
        self.name = name
        self.recipe = recipe
        self.conflicts = conflicts
        self.health_path = health_path
        self.api = api
        # Its GPUs talk over NCCL (RCCL reads the same variables) and UCX: it is told their nearest NICs (nic_env).
        self.nccl = nccl


def recipe(engine: str, gpu_map: GpuMap, spanning: bool) -> Dict[str, Any]:
    """The engine's part of a plan: {engine, args, env, requires, conflicts, reasons}; ``args`` go
    after the server's own arguments, ``env`` into its environment, ``requires`` names programs it
    runs, ``conflicts`` flags of its command that would undo the binding."""
    record = ENGINES[engine]
    args, env, requires, reasons = record.recipe(gpu_map, spanning)
    if record.nccl:
        nics, nic_reasons = nic_env(gpu_map)
        env, reasons = dict(env, **nics), reasons + nic_reasons
    return {"engine": engine, "args": args, "env": env, "requires": requires,
            "conflicts": sorted(flag for flag, _variable, _why in record.conflicts), "reasons": reasons}


def conflicting_flags(engine: str, argv: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Why each flag of ``argv`` that the engine's recipe names as a conflict undoes the binding, and
    each variable of ``environ`` (the environment the server will start with; None where it is not
    known, as on the controller) that the engine reads as such a flag."""
    given = {arg.partition("=")[0] for arg in argv[1:] if arg.startswith("--")}
    found = []
    for flag, variable, why in sorted(ENGINES[engine].conflicts):
        if flag in given:
            found.append("%s (%s)" % (flag, why))
        if environ is not None and variable in environ:
            found.append("%s in the environment, which %s reads as %s (%s; unset it: drop it from the service's "
                         "environment)" % (variable, engine, flag, why))
    return found


# What an engine that talks over NCCL is told of each GPU's nearest RDMA NICs, one variable a row: (variable, the
# library that reads it, what the value starts with, each name a NIC of the map gives it). NCCL_IB_HCA names the
# devices exactly ("=": no prefix match, mlx5_1 is not mlx5_10); UCX_NET_DEVICES (vLLM's NIXL transfers,
# TensorRT-LLM's disaggregated serving) names each device's ports, "mlx5_0:1", every port the facts list: UCX skips
# one that is not active. NCCL_SOCKET_IFNAME is never set: its bootstrap needs an interface with an address, which
# sysfs does not show.
NIC_VARIABLES = (
    ("NCCL_IB_HCA", "NCCL", "=", lambda nic: [nic["rdma_name"]]),
    ("UCX_NET_DEVICES", "UCX", "", lambda nic: ["%s:%d" % (nic["rdma_name"], port) for port in nic.get("ports") or ()]),
)  # type: Tuple[Tuple[str, str, str, Callable[[Mapping[str, Any]], List[str]]], ...]


def nearest_rdma(gpu: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """The RDMA NICs of a map entry's ``nics`` (nearest first) that are as near as the nearest of them."""
    rdma = [nic for nic in gpu.get("nics") or () if nic.get("rdma_name")]
    return [nic for nic in rdma if nic.get("near") == rdma[0].get("near")]


def nic_env(gpu_map: GpuMap) -> Tuple[Dict[str, str], List[str]]:
    """Each NIC_VARIABLES variable naming the RDMA devices nearest each GPU of the map, so its traffic to other
    hosts leaves by a NIC on the GPU's own switch or node, never across the socket link; all unset, with the
    reason, when a GPU has none near it, and one unset, with the reason, when a GPU's nearest NICs give it no name
    (no ports known). Nothing where the map names no RDMA NIC at all (one host's GPUs talk over NVLink or PCIe)."""
    nearest = [nearest_rdma(gpu) for gpu in gpu_map]
    if not any(nearest):
        return {}, []
    lonely = [gpu["gpu"] for gpu, nics in zip(gpu_map, nearest) if not nics]
    if lonely:
        return {}, ["%s left to %s: GPU(s) %s have no RDMA NIC on their node (their traffic crosses the socket "
                    "link)" % (" and ".join(row[0] for row in NIC_VARIABLES),
                               " and ".join(row[1] for row in NIC_VARIABLES), ", ".join(lonely))]
    env = {}  # type: Dict[str, str]
    reasons = []  # type: List[str]
    for variable, library, prefix, names_of in NIC_VARIABLES:
        groups = [[name for nic in nics for name in names_of(nic)] for nics in nearest]
        unnamed = [gpu["gpu"] for gpu, names in zip(gpu_map, groups) if not names]
        if unnamed:
            reasons.append("%s left to %s: the RDMA NIC(s) nearest GPU(s) %s show no port in sysfs" % (
                variable, library, ", ".join(unnamed)))
            continue
        names = []  # type: List[str]
        for group in groups:
            names.extend(name for name in group if name not in names)
        env[variable] = prefix + ",".join(names)
        reasons.append("%s=%s: the RDMA NIC(s) nearest each GPU (%s)" % (variable, env[variable], "; ".join(
            "%s: %s" % (gpu["gpu"], "/".join(group)) for gpu, group in zip(gpu_map, groups))))
    return env, reasons


def _generic(gpu_map: GpuMap, spanning: bool) -> Parts:
    if spanning:
        return [], {}, [], ["engine generic: the process has the CPUs and memory of every GPU's node; name the "
                            "engine (vllm, sglang, trtllm) to bind each worker next to its GPU"]
    return [], {}, [], []


def _llama_cpp(gpu_map: GpuMap, spanning: bool) -> Parts:
    return [], {}, [], ["engine llama.cpp: no --numa (every mode of it resets the main thread's CPU affinity to all "
                        "CPUs after each graph); numa-pin's binding keeps every thread on the plan's CPUs"]


def _vllm(gpu_map: GpuMap, spanning: bool) -> Parts:
    if not spanning:
        return [], {}, [], ["engine vllm: --numa-bind stays off, numa-pin binds the whole process"]
    nodes = [str(_worker_memory_node(gpu)) for gpu in gpu_map]
    cpus = [gpu["cpulist"] for gpu in gpu_map]
    return (["--numa-bind", "--numa-bind-nodes"] + nodes + ["--numa-bind-cpus"] + cpus,
            {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, ["numactl"],
            ["engine vllm: --numa-bind runs worker i under numactl --physcpubind=<cpus i> --membind=<node i>, "
             "from the gpu_map (nodes %s)" % " ".join(nodes)])


def _sglang(gpu_map: GpuMap, spanning: bool) -> Parts:
    if not spanning:
        return [], {"SGLANG_AUTO_NUMA_BIND": "0"}, [], [
            "engine sglang: its automatic per-GPU binding is off (SGLANG_AUTO_NUMA_BIND=0), numa-pin binds "
            "the whole process"]
    nodes = [str(gpu["node"]) for gpu in gpu_map]
    return ["--numa-node"] + nodes, {"SGLANG_NUMA_BIND_V2": "1"}, ["numactl"], [
        "engine sglang: --numa-node %s runs worker i under numactl on its GPU's node" % " ".join(nodes)]


def _trtllm(gpu_map: GpuMap, spanning: bool) -> Parts:
    if not spanning:
        return [], {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "0"}, [], [
            "engine trtllm: TLLM_NUMA_AWARE_WORKER_AFFINITY=0 keeps the affinity numa-pin set (unset, "
            "TensorRT-LLM clears an affinity it finds constrained)"]
    return [], {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "1"}, [], [
        "engine trtllm: TLLM_NUMA_AWARE_WORKER_AFFINITY=1 sets each rank's CPU affinity to its GPU's node"]


def _worker_memory_node(gpu: Mapping[str, Any]) -> int:
    """The one node a worker's memory is bound to: the nearest serving its GPU's CPUs."""
    return gpu["mem_nodes"][0]


# The engines, by name, in the order their names are offered. A variable of a conflict counts whatever its value:
# the engine reads an empty one too. Every health path: llama-server's /health answers 503 while loading
# (tools/server/README.md); vLLM's, SGLang's and trtllm-serve's OpenAI-compatible servers answer /health with 200
# when up; a generic server has none known, so its port is probed, or the entry's health_url asked.
ENGINES = {engine.name: engine for engine in (
    Engine(GENERIC, _generic),
    # ggml (llama.cpp b11434, ggml-cpu.c): in any --numa mode on a multi-node host the main thread's affinity is
    # set to every CPU after each graph (clear_numa_thread_affinity). common/arg.cpp reads LLAMA_ARG_NUMA when the
    # command has no --numa, an empty value as "distribute".
    Engine("llama.cpp", _llama_cpp, (
        ("--numa", "LLAMA_ARG_NUMA", "llama.cpp's --numa resets its main thread's CPU affinity to all CPUs after "
                                     "each graph, outside the plan"),), "/health", LLAMA_CPP_API),
    Engine("vllm", _vllm, health_path="/health", nccl=True),
    Engine("sglang", _sglang, health_path="/health", nccl=True),
    Engine("trtllm", _trtllm, health_path="/health", nccl=True),
)}  # type: Dict[str, Engine]


def missing_programs(programs: Sequence[str], path: str) -> List[str]:
    """The ``programs`` no directory of ``path`` (a PATH value) holds as an executable file."""
    import os

    directories = [directory for directory in path.split(os.pathsep) if directory]
    return [program for program in programs
            if not any(os.path.isfile(os.path.join(directory, program))
                       and os.access(os.path.join(directory, program), os.X_OK) for directory in directories)]


def with_engine_args(argv: Sequence[str], args: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(``argv`` with the recipe's ``args`` after it, the recipe's flags left out): a flag the
    command already gives, in either ``--flag value`` or ``--flag=value`` form, stays as the
    command has it, and its values with it."""
    given = {arg.partition("=")[0] for arg in argv[1:] if arg.startswith("--")}
    added = []  # type: List[str]
    kept = []  # type: List[str]
    for group in _flag_groups(args):
        if group[0] in given:
            kept.append(group[0])
        else:
            added.extend(group)
    return list(argv) + added, kept


def _flag_groups(args: Sequence[str]) -> List[List[str]]:
    """``["--a", "1", "2", "--b"]`` -> ``[["--a", "1", "2"], ["--b"]]``."""
    groups = []  # type: List[List[str]]
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


def health_url(engine: str, port: Optional[int], given: Optional[str] = None) -> Optional[str]:
    """The URL an instance's readiness is asked at: ``given`` (its ``{port}`` filled in) when set, else the
    engine's health path on 127.0.0.1:port; None when there is neither (a generic server: probe its port)."""
    if given:
        return given.replace("{port}", str(port)) if port is not None else given
    path = ENGINES[engine].health_path
    return "http://127.0.0.1:%d%s" % (port, path) if path and port is not None else None
