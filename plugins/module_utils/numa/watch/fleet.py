"""One host's page of the fleet report: its metrics snapshot, a summary of its topology, and where the
services it is given (inference_service_list entries) would run, planned without deploying anything.

The entries are the inference_service role's, defaults merged as the role merges them; their requests
come from service_entry.service_requests, the function the role's tasks call, and are planned by
decide/services.plan_service, as the preflight plans them, so the report shows the placement a deployment
would make.
"""

from typing import Any, Dict, Mapping, Optional, Sequence

from . import metrics
from ..read import systemctl
from ..decide.services import plan_service


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
