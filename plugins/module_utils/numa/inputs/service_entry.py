"""From one inference_service_list entry to the requests of its instances: the one place the role's
layouts are turned into placement requests. The role (its ``service_requests`` filter), the fleet
report (numa_metrics on each host) and the tests all ask here, so the report plans a service exactly
as a deployment of it would.

The entry is the role's with its defaults merged (meta/argument_specs.yml's, then
``inference_service_defaults``, then the entry's own keys; the numa_service_entries filter merges
them). ``layout`` gives the instances: one per node with CPUs (``per_node``), one per package with
CPUs over all of its nodes (``per_socket``), one per GPU (``per_gpu``), one per group of ``gpus`` GPUs
(``gpu_groups``), or one (``single``).

Pure: the topology is the numa_facts dict, nothing is read.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping

LAYOUTS = ("single", "per_node", "per_socket", "per_gpu", "gpu_groups")
# A package's sub-NUMA nodes (SNC, NPS) are used together, never mixed with another package's: the
# instance's scope is its socket and its memory interleaved over the socket's nodes, unless the entry says.
PER_SOCKET_DEFAULTS = {"scope": "socket", "policy": "interleave"}
# meta/argument_specs.yml's default, for an entry given without its defaults merged (tests hold them equal).
DEFAULT_LAYOUT = "single"
# The entry's keys that are request options of the same name (request.OPTIONS).
SAME_NAME_KEYS = ("model", "node", "memory_headroom", "smt", "cores", "reserve_cpus", "scope", "policy", "on_unfit",
                  "engine", "page_cache", "replica_dir", "port_base")


def service_requests(entry: Mapping[str, Any], topology: Mapping[str, Any]) -> Dict[str, Any]:
    """``{"instances": N, "request": {...}, "error": None}`` for the entry on this topology (the request's
    unset options are None, as numa_plan_args and numa_pin_flags take it), or ``{"instances": 0, "request":
    None, "error": why}`` when its layout gives no instance here."""
    layout = entry.get("layout") or DEFAULT_LAYOUT
    if layout not in LAYOUTS:
        return _no_instance("layout %r is none of %s" % (layout, ", ".join(LAYOUTS)))
    with_cpus = [node["id"] for node in topology.get("nodes") or [] if node.get("has_cpus")]
    anchors = _socket_anchors(topology, with_cpus) if layout == "per_socket" else with_cpus
    gpus = len(topology.get("gpus") or [])
    count = _instance_count(layout, len(anchors), gpus, entry.get("gpus"))
    if count == 0:
        return _no_instance(_no_instance_reason(layout, len(with_cpus), gpus, entry.get("gpus")))
    return {"instances": count, "request": _request(entry, layout, count, anchors), "error": None}


def _socket_anchors(topology: Mapping[str, Any], with_cpus: List[int]) -> List[int]:
    """The lowest node with CPUs of each package that has one, in package order: an instance's anchor, from
    which scope socket takes the package's other nodes."""
    cpu_nodes = set(with_cpus)
    anchors = []  # type: List[int]
    for package in (topology.get("cpus") or {}).get("packages") or []:
        mine = sorted(cpu_nodes.intersection(package.get("nodes") or []))
        if mine and mine[0] not in anchors:
            anchors.append(mine[0])
    return anchors


def _instance_count(layout: str, anchors: int, gpus: int, per_instance: Any) -> int:
    if layout in ("per_node", "per_socket"):
        return anchors
    if layout == "per_gpu":
        return gpus
    if layout == "gpu_groups":
        size = _group_size(per_instance)
        return gpus // size if size else 0
    return 1


def _group_size(per_instance: Any) -> int:
    """gpu_groups' GPUs per instance: a positive count written without a leading zero (a number or its
    text, as ``-e`` gives it); 0 for anything else."""
    text = str(per_instance)
    return int(text) if text.isdecimal() and text.isascii() and text[0] != "0" else 0


def _no_instance_reason(layout: str, cpu_nodes: int, gpus: int, per_instance: Any) -> str:
    group = ", gpus %s per instance" % per_instance if layout == "gpu_groups" else ""
    fix = "use layout single or per_node"
    if layout == "gpu_groups":
        fix += ", or give gpu_groups a GPU count no larger than the host has"
    return "layout %s gives no instance here (%d GPUs, %d nodes with CPUs%s): %s" % (
        layout, gpus, cpu_nodes, group, fix)


def _request(entry: Mapping[str, Any], layout: str, count: int, anchors: List[int]) -> Dict[str, Any]:
    request = {key: entry.get(key) for key in SAME_NAME_KEYS}
    if layout == "per_socket":
        request.update({key: value for key, value in PER_SOCKET_DEFAULTS.items() if request[key] is None})
    request.update({
        # per_gpu gives each instance one GPU; per_node and per_socket are CPU layouts (no GPU unless asked).
        "gpus": entry.get("gpus") if entry.get("gpus") is not None else
        1 if layout == "per_gpu" else "none" if layout in ("per_node", "per_socket") else None,
        "model_size": entry.get("model_size") if entry.get("model_size") is not None else entry.get("model"),
        "instances": count,
        # per_node means instance i on the i-th node with CPUs, per_socket on the i-th package's first. Fixed at
        # deploy time so the spread stays stable: planned again later (next deploy, next start), the running
        # instances' own memory would otherwise count against their nodes and could swap them.
        "anchors": ",".join(str(node) for node in anchors) if layout in ("per_node", "per_socket") else None,
        # The runtime whose run command the entry's command is (numa-pin adds the plan's flags after its run).
        "container_runtime": (entry.get("container") or {}).get("runtime"),
    })
    return request


def _no_instance(why: str) -> Dict[str, Any]:
    return {"instances": 0, "request": None, "error": why}
