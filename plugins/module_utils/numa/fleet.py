"""One host's page of the fleet report: its metrics snapshot, a summary of its topology, and where the
services it is given (inference_service_list entries) would run, planned without deploying anything.

The entries are the inference_service role's: ``layout`` gives the instances (one per node with CPUs,
one per GPU, or one), and the request is built as the role's tasks/service.yml builds it (the GPUs a
layout implies, the model path as the size, per-node anchors), so the report shows the placement a
deployment would make.
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import audit, metrics
from .cpulist import format_cpulist
from .errors import NumaError

LAYOUTS = ("single", "per_node", "per_gpu", "gpu_groups")
# The role's entry keys that are request options of the same name.
REQUEST_KEYS = ("node", "memory_headroom", "smt", "reserve_cpus", "scope", "policy", "on_unfit", "page_cache",
                "replica_dir", "port_base", "engine")


def host_page(root: str = "/", plan_dir: Optional[str] = None, services: Sequence[Mapping[str, Any]] = (),
              run: Optional[audit.CommandRunner] = None) -> Dict[str, Any]:
    """The snapshot, the topology summary and the planned services of the host under ``root``."""
    from .topology import read

    topology = read(root)
    snapshot = metrics.collect(root, plan_dir or _under(root, metrics.PLAN_DIR), run, topology=topology)
    snapshot["topology"] = summary(topology)
    snapshot["planned"] = [planned for entry in services for planned in plan_service(topology, entry)]
    return snapshot


def _under(root: str, path: str) -> str:
    return path if root in ("", "/") else root.rstrip("/") + path


def summary(topology: Mapping[str, Any]) -> Dict[str, Any]:
    """Nodes with their CPUs, memory and GPUs (the topology lists a node's GPUs by PCI address), and the GPUs
    without a node. Not the distance matrix: a 64-node host's would be 4096 numbers in every result the
    controller keeps."""
    nodes = [{"id": node["id"], "cpulist": node.get("cpulist") or "", "cpus": len(node.get("cpus") or []),
              "memory_total_bytes": (node.get("memory_total_kb") or 0) * 1024,
              "gpus": list(node.get("gpus") or [])} for node in topology.get("nodes", [])]
    return {"nodes": nodes,
            "gpus_without_node": [gpu.get("address") for gpu in topology.get("gpus") or []
                                  if gpu.get("numa_node") is None],
            "cpus_online": (topology.get("cpus") or {}).get("online", "")}


def plan_service(topology: Mapping[str, Any], entry: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Each instance's placement for one inference_service_list entry, or one row naming why it has none."""
    name = str(entry.get("name") or "?")
    layout = entry.get("layout") or "single"
    if layout not in LAYOUTS:
        return [_unplanned(name, "layout %r is none of %s" % (layout, ", ".join(LAYOUTS)))]
    with_cpus = [node["id"] for node in topology.get("nodes", []) if node.get("has_cpus")]
    count = _instance_count(layout, len(with_cpus), len(topology.get("gpus") or []), entry.get("gpus"))
    if count == 0:
        return [_unplanned(name, "layout %s gives no instance here (%d GPUs, %d nodes with CPUs)"
                           % (layout, len(topology.get("gpus") or []), len(with_cpus)))]
    options = request_options(entry, layout, count, with_cpus)
    from .placement import plan_instances
    from .request import build_request

    try:
        request = build_request(dict(options, instance=0))
    except NumaError as exc:
        return [_unplanned(name, str(exc))]
    return [_planned(name, index, result) for index, result in enumerate(plan_instances(dict(topology), request))]


def _instance_count(layout: str, cpu_nodes: int, gpus: int, per_instance: Any) -> int:
    """How many instances the role's layout gives: per node with CPUs, per GPU, per group of ``gpus`` GPUs, or one."""
    if layout == "per_node":
        return cpu_nodes
    if layout == "per_gpu":
        return gpus
    if layout == "gpu_groups":
        size = str(per_instance)
        return gpus // int(size) if size.isdigit() and int(size) > 0 else 0
    return 1


def request_options(entry: Mapping[str, Any], layout: str, count: int, with_cpus: List[int]) -> Dict[str, Any]:
    """The request numa-pin gets for the entry (the role's "Build the placement request")."""
    options = dict((key, entry.get(key)) for key in REQUEST_KEYS)
    gpus = entry.get("gpus")
    options["gpus"] = gpus if gpus is not None else 1 if layout == "per_gpu" else "none" if layout == "per_node" \
        else "auto"
    model = entry.get("model_path")
    options["model"] = [model] if model else []
    options["model_size"] = entry.get("model_size") if entry.get("model_size") is not None else model
    options["instances"] = count
    options["anchors"] = ",".join(str(node) for node in with_cpus) if layout == "per_node" else None
    return dict((key, value) for key, value in options.items() if value is not None)


def _planned(name: str, index: int, result: Any) -> Dict[str, Any]:
    if isinstance(result, NumaError):
        return _unplanned(name, str(result), index)
    placement = result.to_dict()
    return {"service": name, "index": index, "unit": "%s@%d.service" % (name, index), "error": None,
            "policy": placement["policy"], "mem_nodes": placement["mem_nodes"],
            "nodes": format_cpulist(placement["mem_nodes"]), "cpulist": placement["cpulist"],
            "threads": placement["threads"], "gpus": placement["gpus"], "port": placement["port"]}


def _unplanned(name: str, why: str, index: Optional[int] = None) -> Dict[str, Any]:
    return {"service": name, "index": index, "unit": None if index is None else "%s@%d.service" % (name, index),
            "error": why, "policy": None, "mem_nodes": [], "nodes": "", "cpulist": "", "threads": 0, "gpus": [],
            "port": None}
