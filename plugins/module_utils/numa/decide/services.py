"""Every instance of one inference_service_list entry planned on a host's topology: the rows the fleet report
shows and the preflight checks, one function for both. An instance that cannot be placed is a row naming why.

The entry's requests come from inputs/service_entry.service_requests, the function the role's tasks call.
"""

from typing import Any, Dict, List, Mapping, Optional

from .placement import plan_instances
from ..base.cpulist import format_cpulist
from ..base.engines import ENGINES
from ..base.errors import NumaError
from ..inputs.request import build_request
from ..inputs.service_entry import service_requests


def plan_service(topology: Mapping[str, Any], entry: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Each instance's placement for one inference_service_list entry, or one row naming why it has none."""
    name = str(entry.get("name") or "?")
    wanted = service_requests(entry, topology)
    if wanted["error"]:
        return [_unplanned(name, wanted["error"])]
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
            "threads": placement["threads"], "gpus": placement["gpus"], "port": placement["port"],
            # The map lists each GPU's NICs on its worker's node; a GPU with none talks to other hosts across the
            # socket link (the preflight warns), where its engine talks to other hosts at all: those told the NICs.
            "gpus_without_nic": [gpu["gpu"] for gpu in placement["gpu_map"] if not gpu["nics"]]
            if ENGINES[placement["engine"]["engine"]].nccl else []}


def _unplanned(name: str, why: str, index: Optional[int] = None) -> Dict[str, Any]:
    return {"service": name, "index": index, "unit": None if index is None else "%s@%d.service" % (name, index),
            "error": why, "policy": None, "mem_nodes": [], "nodes": "", "cpulist": "", "threads": 0, "gpus": [],
            "port": None, "gpus_without_nic": []}
