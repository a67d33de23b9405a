# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report's model (controller side), from every host's registered numa_metrics result.

``numa_fleet_report(hostvars, hosts, var)`` gives one entry per host: its nodes (CPUs, memory, free
memory, GPUs), balancing state, deployed instances (policy, nodes, locality anon/file, drift,
affinity), the services it would run (planned, not deployed) and warnings. Hosts without a result
(unreachable, failed, skipped) and hosts whose result breaks host_results.METRICS_RESULT are listed
with the reason; one host never stops the report of the others. report_pages.py lays the model out.
``report_dir(given)`` is where the report goes: the directory given, else the current one; never
inside an installed collection.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.inferops.numa.plugins.module_utils.numa.decide import roofline
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch.metrics import DEFAULT_SETTINGS
from ansible_collections.inferops.numa.plugins.plugin_utils import host_results

BALANCING = {0: "off", 1: "ON (NUMA hinting faults migrate pages)", 2: "memory tiering", 3: "ON + memory tiering"}
GIB = 1024.0 ** 3


class ReportError(Exception):
    """A report that cannot be written where it was asked for, with the cause and the fix."""


def numa_fleet_report(hostvars: Any, hosts: Sequence[str], var: str = "fleet_report_result") -> Dict[str, Any]:
    """The report model: counts, one entry per host that answered, and the hosts that did not."""
    return model(host_results.registered(hostvars, hosts, var), hosts)


def model(results: Mapping[str, Any], hosts: Sequence[str]) -> Dict[str, Any]:
    answered = []
    missing = []
    for name in hosts:
        entry = _checked_entry(str(name), results.get(name))
        (missing if "error" in entry else answered).append(entry)
    instances = [row for host in answered for row in host["instances"]]
    _flag_far_below(answered)
    return {"host_count": len(hosts), "answered": answered, "missing": missing,
            "instance_count": len(instances),
            "drifted": sum(1 for row in instances if row["drift"]),
            "balancing_on": sum(1 for host in answered if host["balancing_on"]),
            "warned_hosts": sum(1 for host in answered if host["warnings"])}


def _flag_far_below(answered: List[Dict[str, Any]]) -> None:
    """A warning on each host for its instances whose roofline share is far below the fleet's typical one
    (decide/roofline.far_below: under half the median over every instance with a share)."""
    shares = {(host["name"], row["unit"]): row["roofline_share"] for host in answered for row in host["instances"]
              if row["roofline_share"] is not None}
    typical = roofline.typical_share(shares)
    flagged = set(roofline.far_below(shares))
    for host in answered:
        for row in host["instances"]:
            if (host["name"], row["unit"]) in flagged:
                host["warnings"].append("%s runs at %s of its memory-bandwidth bound, under half the fleet's typical "
                                        "%s: look for remote pages, stragglers or slow memory on this host"
                                        % (row["unit"], _ratio(row["roofline_share"]), _ratio(typical)))


def _checked_entry(name: str, result: Any) -> Dict[str, Any]:
    """The host's entry, or {"name", "error"} saying why it has none."""
    clean = host_results.reading(result, host_results.METRICS_RESULT, "numa_metrics", "host")
    return host_entry(name, clean) if isinstance(clean, Mapping) else {"name": name, "error": clean}


def host_entry(name: str, result: Mapping[str, Any]) -> Dict[str, Any]:
    host = result["host"]
    topology = result.get("topology") or {}
    free = dict((node["id"], node.get("memory_free_bytes")) for node in host.get("nodes") or [])
    nodes = [{"id": node["id"], "cpus": node.get("cpus"), "cpulist": node.get("cpulist") or "",
              "memory": _gib(node.get("memory_total_bytes")), "free": _gib(free.get(node["id"])),
              "gpus": ", ".join(node.get("gpus") or []) or "-"} for node in topology.get("nodes") or []]
    balancing = host.get("numa_balancing")
    instances = [_instance_row(entry) for entry in result.get("instances") or []]
    planned = [_planned_row(entry) for entry in result.get("planned") or []]
    warnings = _warnings(balancing, instances, planned, result)
    return {"name": name, "node_count": host.get("node_count"), "cpu_count": host.get("cpu_count"),
            "gpu_count": host.get("gpu_count"), "nodes": nodes,
            "balancing": BALANCING.get(balancing, "unknown (not readable)") if balancing is not None
            else "unknown (not readable)",
            "balancing_on": balancing in (1, 3), "instances": instances, "planned": planned, "warnings": warnings}


def _or(value: Any, otherwise: Any) -> Any:
    return otherwise if value is None else value


def _gib(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else "%.1f" % (value / GIB)


def _ratio(value: Any) -> str:
    return "-" if value is None else "%.2f %%" % (100.0 * value)


def _instance_row(entry: Mapping[str, Any]) -> Dict[str, Any]:
    local = entry.get("local_ratio") or {}
    return {"unit": entry.get("unit"), "policy": entry.get("policy"), "nodes": entry.get("nodes"),
            "cpulist": entry.get("cpulist"), "state": "up" if entry.get("up") else entry.get("state") or "down",
            "anon": _ratio(local.get("anon")), "file": _ratio(local.get("file")),
            "judged": _ratio(local.get("judged")),
            "minimum": "%g %%" % _or(entry.get("min_local_percent"), DEFAULT_SETTINGS["min_local_percent"]),
            "drift": bool(entry.get("drift")),
            "affinity": {True: "yes", False: "NO", None: "-"}[entry.get("affinity_match")],
            "off_plan": _ratio(entry.get("off_plan_thread_ratio")),
            "roofline": _roofline(entry.get("roofline")), "roofline_share": (entry.get("roofline") or {}).get("share"),
            "gain": _gain(entry.get("ab_gate")), "message": entry.get("message") or ""}


def _roofline(found: Optional[Mapping[str, Any]]) -> str:
    """The measured tokens/s as a share of the memory-bandwidth bound, and the bound."""
    if not found or found.get("bound_tokens_per_second") is None:
        return "-"
    bound = "%.1f tok/s" % found["bound_tokens_per_second"]
    return bound if found.get("share") is None else "%s of %s" % (_ratio(found["share"]), bound)


def _gain(verdict: Optional[Mapping[str, Any]]) -> str:
    """The A/B gate's measured gain of the instance's last placement change, and what became of the change."""
    if not verdict:
        return "-"
    measured = "not measured" if verdict.get("gain_percent") is None else "%+.1f %%" % verdict["gain_percent"]
    return "%s, %s" % (measured, "kept" if verdict.get("kept") else "rolled back")


def _planned_row(entry: Mapping[str, Any]) -> Dict[str, Any]:
    return {"unit": entry.get("unit") or entry.get("service"), "policy": entry.get("policy") or "-",
            "nodes": entry.get("nodes") or "-", "cpulist": entry.get("cpulist") or "-",
            "threads": entry.get("threads") or 0, "gpus": ", ".join(entry.get("gpus") or []) or "-",
            "port": entry.get("port") if entry.get("port") is not None else "-",
            "error": entry.get("error") or ""}


def _warnings(balancing: Any, instances: List[Dict[str, Any]], planned: List[Dict[str, Any]],
              result: Mapping[str, Any]) -> List[str]:
    lines = []
    if balancing in (1, 3):
        lines.append("automatic NUMA balancing is on: the kernel moves pinned services' pages (numa_host turns it off)")
    for row in instances:
        if row["drift"]:
            lines.append("%s drifted: %s of its pages on node(s) %s, below %s"
                         % (row["unit"], row["judged"], row["nodes"], row["minimum"]))
        if row["affinity"] == "NO":
            lines.append("%s: a thread may run outside the plan's CPUs %s" % (row["unit"], row["cpulist"]))
        if row["state"] != "up":
            lines.append("%s is not running: %s" % (row["unit"], row["message"]))
    lines.extend("%s cannot be placed: %s" % (row["unit"], row["error"]) for row in planned if row["error"])
    lines.extend(result.get("read_warnings") or [])
    return lines


def report_dir(given: Any = None) -> str:
    """The report's directory: ``given`` (relative to the current one), else the current directory.

    Refused inside an installed collection (a directory holding MANIFEST.json above it), which
    ansible-galaxy may replace or that its users may not own.
    """
    directory = os.path.abspath(str(given) if given else os.getcwd())
    probe = directory
    while True:
        if os.path.isfile(os.path.join(probe, "MANIFEST.json")) and os.path.isdir(os.path.join(probe, "plugins")):
            raise ReportError("the report directory %s is inside the installed collection %s: write the report "
                              "elsewhere, e.g. -e fleet_report_dir=$PWD/reports" % (directory, probe))
        parent = os.path.dirname(probe)
        if parent == probe:
            return directory
        probe = parent
