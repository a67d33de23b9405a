"""One host's page of the fleet report: its metrics snapshot, a summary of its topology, and where the
services it is given (inference_service_list entries) would run, planned without deploying anything.

The entries are the inference_service role's, defaults merged as the role merges them; their requests
come from service_entry.service_requests, the function the role's tasks call, so the report shows the
placement a deployment would make.
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import metrics
from ..read import systemctl
from ..base.cpulist import format_cpulist
from ..base.errors import NumaError
from ..inputs.service_entry import service_requests


def host_page(root: str = "/", plan_dir: Optional[str] = None, services: Sequence[Mapping[str, Any]] = (),
              run: Optional[systemctl.CommandRunner] = None) -> Dict[str, Any]:
    """The snapshot, the topology summary and the planned services of the host under ``root``."""
    from ..read.topology import read

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
    wanted = service_requests(entry, topology)
    if wanted["error"]:
        return [_unplanned(name, wanted["error"])]
    from ..decide.placement import plan_instances
    from ..inputs.request import build_request

    try:
        request = build_request(dict(wanted["request"], instance=0))
    except NumaError as exc:
        return [_unplanned(name, str(exc))]
    return [_planned(name, index, result) for index, result in enumerate(plan_instances(dict(topology), request))]


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
