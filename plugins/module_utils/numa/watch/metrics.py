"""Continuous proof, read: each deployed instance's locality and the host's NUMA state as one snapshot.

``collect`` reads, for every plan record a deployment left (``<plan_dir>/<service>@<i>.plan.json``,
written by the inference_service role), where the instance's pages really are (audit.py, from
``numa_maps``) and whether its threads stay on the plan's CPUs, and for the host
``kernel.numa_balancing``, each node's CPUs, GPUs, free memory and allocation counters
(numastat.py). exposition.py turns the snapshot into node_exporter's textfile; drift.py acts on the
instances whose pages drifted. The numa_metrics module (the fleet report) imports this module alone.

numa-pin runs this as root from a systemd timer. So the plan records and the services' audit
settings it acts on are trusted only as root wrote them (regular files, owned by root, writable by
no one else, named as the role names them, their fields of the types it writes), in a plan directory
that root alone may write all the way up from ``/`` (whoever may write a directory above it could put
other records in its place, and choose which unit root restarts).
"""

import math
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..read import audit, resctrl, systemctl
from ..inputs import judging
from ..system import trusted_files
from ..base.cpulist import MAX_CPUS, format_cpulist, parse_integer
from ..base.sizes import MAX_BYTES
from ..decide import roofline, weights
from ..base.errors import NumaError, shown
from .table import gate_rate
from ..decide.records import (AB_GATES, PLAN_SUFFIX, REDEPLOY, audit_record_name, is_count, plan_fields,
                              plan_problem, plan_record_parts, plan_record_unit)

PLAN_DIR = "/etc/inferops-numa"
ON_DRIFT = ("none", "evict", "restart")
# What a service is held to when the deployment left no audit settings for it: the role's defaults (bytes_per_token:
# the model's size, from its plan record).
DEFAULT_SETTINGS = dict(judging.DEFAULTS, audit=True, on_drift="none", bytes_per_token=None)
# A plan record's fields the placement table lists that plan_fields leaves out, each with its largest value.
LISTED = {"threads": MAX_CPUS, "port": 65535}
NUMASTAT_COUNTERS = ("numa_hit", "numa_miss", "numa_foreign", "other_node", "local_node", "interleave_hit")


Snapshot = Dict[str, Any]


# --- reading --------------------------------------------------------------------------------------


def collect(root: str = "/", plan_dir: str = PLAN_DIR, run: Optional[systemctl.CommandRunner] = None,
            topology: Optional[Dict[str, Any]] = None, page_size: Optional[int] = None,
            clock: Callable[[], float] = time.time) -> Snapshot:
    """The host's NUMA state and every recorded instance's locality, as one dict (see exposition.render)."""
    began = clock()
    warnings = []  # type: List[str]
    if topology is None:
        from ..read.topology import read

        topology = read(root)
    host = _host(root, topology, warnings)
    records = read_records(plan_dir, warnings)
    instances = _instances(root, records, run or systemctl.run_command, page_size, began, warnings)
    add_bandwidth(root, instances)
    add_roofline(root, topology, instances)
    return {"root": root, "plan_dir": plan_dir, "host": host, "instances": instances, "warnings": warnings,
            "timestamp_seconds": round(began, 3), "duration_seconds": round(max(clock() - began, 0.0), 6)}


def _host(root: str, topology: Mapping[str, Any], warnings: List[str]) -> Dict[str, Any]:
    from ..read.numastat import read_counters

    try:
        counters = read_counters(root)["nodes"]
    except NumaError as exc:
        counters = {}
        warnings.append(str(exc))
    nodes = []
    for node in topology.get("nodes", []):
        nodes.append({"id": node["id"], "cpus": len(node.get("cpus") or []), "gpus": len(node.get("gpus") or []),
                      "memory_total_bytes": _kib(node.get("memory_total_kb")),
                      "memory_free_bytes": _kib(node.get("memory_free_kb")),
                      "counters": counters.get(node["id"], {})})
    warnings.extend(topology.get("warnings") or [])
    return {"numa_balancing": (topology.get("kernel") or {}).get("numa_balancing"), "nodes": nodes,
            "node_count": len(nodes), "cpu_count": sum(node["cpus"] for node in nodes),
            "gpu_count": len(topology.get("gpus") or []), "device_irqs": _device_irqs(root, warnings)}


def _device_irqs(root: str, warnings: List[str]) -> List[Dict[str, Any]]:
    """numa_irqs' devices, each with how many of its interrupts are served outside its CPUs."""
    from ..act.device_irqs import served_elsewhere

    try:
        return served_elsewhere(root)
    except NumaError as exc:
        warnings.append(str(exc))
        return []


def _kib(value: Any) -> Optional[int]:
    return value * 1024 if isinstance(value, int) and not isinstance(value, bool) else None


def read_records(plan_dir: str, warnings: List[str]) -> List[Dict[str, Any]]:
    """Every instance's plan record and its service's audit settings, sorted by unit; a record that
    cannot be trusted or read, or is misnamed, or names the same unit as another, is left out with a
    warning. Every file is opened in the directory checked, so none can be swapped in between."""
    try:
        fd = trusted_files.open_plan_directory(plan_dir)
    except NumaError as exc:
        warnings.append("%s: no instance is measured" % exc)
        return []
    if fd is None:
        return []
    try:
        return _records_in(fd, plan_dir, warnings)
    finally:
        os.close(fd)


def _records_in(fd: int, plan_dir: str, warnings: List[str]) -> List[Dict[str, Any]]:
    try:
        names = [name for name in os.listdir(fd) if name.endswith(PLAN_SUFFIX)]
    except OSError as exc:
        warnings.append("cannot list the plan directory %s (%s): no instance is measured" % (plan_dir, exc.strerror))
        return []
    records = []
    settings = {}  # type: Dict[str, Dict[str, Any]]
    verdicts = _gates_written(fd, plan_dir, warnings)
    gates = ab_gates(verdicts, plan_dir, warnings)
    for name in _unambiguous(names, plan_dir, warnings):
        path = os.path.join(plan_dir, name)
        try:
            service, index = plan_record_unit(name, plan_dir)
            written, mtime = trusted_files.read_trusted_json(fd, name, path, REDEPLOY)
            plan = _plan(written, path)
            if service not in settings:
                settings[service] = service_settings(fd, plan_dir, service)
        except NumaError as exc:
            warnings.append(str(exc))
            continue
        unit = "%s@%d.service" % (service, index)
        records.append({"service": service, "index": index, "unit": unit, "plan": plan, "plan_mtime": mtime,
                        "settings": settings[service], "ab_gate": gates.get(unit),
                        # What numa_audit's placement table shows besides the plan's fields: the threads and the
                        # port the record holds (whole numbers, or left out), the rate the gate left running.
                        "listed": {key: written[key] for key, largest in LISTED.items()
                                   if is_count(written.get(key), largest)},
                        "tokens_per_second": gate_rate(verdicts.get(unit)) if unit in gates else None,
                        "model_bytes": _model_bytes(written)})
    return sorted(records, key=lambda record: (record["service"], record["index"]))


def _model_bytes(written: Mapping[str, Any]) -> Optional[int]:
    """The model's size the plan was made for (its request's model_size, in bytes), or None."""
    inputs = written.get("inputs")
    size = inputs.get("model_size") if isinstance(inputs, Mapping) else None
    return size if _is_size(size) else None


def _is_size(value: Any) -> bool:
    """A whole number of bytes above 0 a record may hold (a model's size, the bytes a token reads)."""
    return is_count(value, MAX_BYTES) and value > 0


def _gates_written(plan_fd: int, plan_dir: str, warnings: List[str]) -> Dict[str, Any]:
    """``ab-gates.json`` as the role wrote it (unit -> verdict), {} when there is none or it cannot be trusted."""
    try:
        written, _mtime = trusted_files.read_trusted_json(plan_fd, AB_GATES, os.path.join(plan_dir, AB_GATES),
                                                          REDEPLOY)
    except FileNotFoundError:
        return {}
    except NumaError as exc:
        warnings.append(str(exc))
        return {}
    return written


def ab_gates(written: Mapping[str, Any], plan_dir: str, warnings: List[str]) -> Dict[str, Dict[str, Any]]:
    """unit -> the A/B gate's last verdict on it (``written``, ``ab-gates.json``): {kept, gain_percent}
    (None: nothing to compare with); a verdict that is not two such values is left out with a warning."""
    path = os.path.join(plan_dir, AB_GATES)
    verdicts = {}
    for unit, verdict in written.items():
        gain = verdict.get("gain_percent") if isinstance(verdict, dict) else None
        measured = gain is None or (isinstance(gain, (int, float)) and not isinstance(gain, bool)
                                    and math.isfinite(gain) and abs(gain) < 1e6)
        if not (isinstance(verdict, dict) and isinstance(verdict.get("kept"), bool) and measured):
            warnings.append("%s: the verdict on %s is not {kept: true|false, gain_percent: a number or null}; left "
                            "out; %s" % (path, shown(unit), REDEPLOY))
            continue
        verdicts[str(unit)] = {"kept": verdict["kept"], "gain_percent": None if gain is None else float(gain)}
    return verdicts


def _unambiguous(names: Sequence[str], plan_dir: str, warnings: List[str]) -> List[str]:
    """The record names, sorted, less those that name the same unit as another: which one the deployment
    meant is unknown, so neither is acted on."""
    by_unit = {}  # type: Dict[Tuple[str, int], List[str]]
    for name in names:
        parts = plan_record_parts(name)
        key = (parts[0], int(parts[1])) if parts else (name, -1)
        by_unit.setdefault(key, []).append(name)
    kept = []
    for (service, index), group in sorted(by_unit.items()):
        if len(group) == 1:
            kept.append(group[0])
            continue
        warnings.append("ignoring the plan records %s in %s: they all name unit %s; remove them and %s"
                        % (", ".join(shown(name) for name in sorted(group)), plan_dir,
                           shown("%s@%d.service" % (service, index)), REDEPLOY))
    return sorted(kept)


def _plan(written: Mapping[str, Any], path: str) -> Dict[str, Any]:
    """The fields of a plan record the metrics show and the audit compares with (decide/records.plan_fields);
    NumaError naming the first that is not as the role writes it."""
    problem = plan_problem(written)
    if problem:
        raise NumaError("ignoring %s: %s; %s" % (path, problem, REDEPLOY))
    return plan_fields(written)


def service_settings(plan_fd: int, plan_dir: str, service: str) -> Dict[str, Any]:
    """``<service>.audit.json`` in the plan directory (the role writes it): how the service is judged and
    what drift does; the role's defaults where there is none."""
    name = audit_record_name(service)
    path = os.path.join(plan_dir, name)
    try:
        written, _mtime = trusted_files.read_trusted_json(plan_fd, name, path, REDEPLOY)
    except FileNotFoundError:
        return dict(DEFAULT_SETTINGS)
    settings = dict(DEFAULT_SETTINGS)
    settings.update((key, written[key]) for key in DEFAULT_SETTINGS if key in written)
    try:
        judging.check(settings["min_local_percent"], settings["pages"])
    except NumaError as exc:
        raise NumaError("%s: %s" % (path, exc)) from None
    if settings["on_drift"] not in ON_DRIFT or not isinstance(settings["audit"], bool):
        raise NumaError("%s: on_drift must be one of %s and audit true or false; %s"
                        % (path, ", ".join(ON_DRIFT), REDEPLOY))
    if settings["bytes_per_token"] is not None and not _is_size(settings["bytes_per_token"]):
        raise NumaError("%s: bytes_per_token must be a positive number of bytes; %s" % (path, REDEPLOY))
    return settings


def _instances(root: str, records: List[Dict[str, Any]], run: systemctl.CommandRunner, page_size: Optional[int],
               now: float, warnings: List[str]) -> List[Dict[str, Any]]:
    if not records:
        return []
    try:
        shown = systemctl.show_units([record["unit"] for record in records], run)
    except NumaError as exc:
        warnings.append(str(exc))
        shown = {}
    return [_instance(root, record, shown.get(record["unit"], {}), page_size, now) for record in records]


def _instance(root: str, record: Mapping[str, Any], props: Mapping[str, str], page_size: Optional[int],
              now: float) -> Dict[str, Any]:
    plan, settings = record["plan"], record["settings"]
    entry = {"unit": record["unit"], "service": record["service"], "index": record["index"],
             "policy": plan["policy"] or "unknown", "mem_nodes": plan["mem_nodes"],
             "nodes": format_cpulist(plan["mem_nodes"]), "cpulist": plan["cpulist"],
             "plan_age_seconds": round(max(now - record["plan_mtime"], 0.0), 3),
             "min_local_percent": settings["min_local_percent"], "pages": settings["pages"],
             "on_drift": settings["on_drift"], "judged": settings["audit"],
             "state": props.get("ActiveState") or "unknown", "up": False, "pids": [],
             "local_ratio": {"anon": None, "file": None, "judged": None},
             "interleave_ratio": {}, "interleave_weight_ratio": {},
             "resident_bytes": {"anon": None, "file": None}, "remote_bytes": {"anon": None, "file": None},
             "affinity_match": None, "off_plan_thread_ratio": None, "drift": False, "remote_nodes": {}, "message": "",
             "ab_gate": record.get("ab_gate"), "main_pid": _main_pid(props), "memory_bandwidth": None,
             "tokens_per_second": record.get("tokens_per_second"),
             "bytes_per_token": settings["bytes_per_token"] or record.get("model_bytes"), "roofline": None}
    if entry["state"] != "active" or not entry["main_pid"]:
        entry["message"] = "%s is not running (ActiveState=%s)" % (record["unit"], entry["state"])
        return entry
    try:
        report = audit.audit_props(root, record["unit"], props, [], plan, settings["min_local_percent"],
                                   settings["pages"], page_size)
    except NumaError as exc:
        entry["message"] = str(exc)
        return entry
    _add_report(entry, report)
    return entry


def _main_pid(props: Mapping[str, str]) -> Optional[int]:
    pid = parse_integer(props.get("MainPID") or "")
    return pid if pid is not None and pid > 0 else None


def add_bandwidth(root: str, instances: Sequence[Dict[str, Any]]) -> None:
    """Each running instance's memory traffic as the hardware counts it for its own resctrl group
    (read/resctrl.py); where there is no such count, None and the reason."""
    if not any(entry["up"] for entry in instances):
        return
    hierarchy = resctrl.read_hierarchy(root)
    for entry in instances:
        if entry["up"]:
            entry["memory_bandwidth"] = resctrl.instance_bandwidth(root, hierarchy, entry["main_pid"], entry["pids"])


def add_roofline(root: str, topology: Mapping[str, Any], instances: Sequence[Dict[str, Any]]) -> None:
    """Each instance's memory-bandwidth bound and its measured tokens/s's share of it (decide/roofline), from the
    bandwidth numa_cost recorded on the host, else HMAT's."""
    if not instances:
        return
    from ..measure.cost import RECORD_DIR, read_record

    try:
        bandwidths, reasons = weights.choose(topology, read_record(os.path.join(root, RECORD_DIR.lstrip("/"))))
    except NumaError as exc:  # a record root cannot trust: HMAT's figures, if the firmware has them
        bandwidths, reasons = weights.choose(topology, None, "hmat")
        reasons.insert(0, "measured: %s" % exc)
    for entry in instances:
        entry["roofline"] = roofline.roofline(bandwidths, "; ".join(reasons), entry["policy"], entry["mem_nodes"],
                                              entry["bytes_per_token"], entry["tokens_per_second"])


def _add_report(entry: Dict[str, Any], report: Mapping[str, Any]) -> None:
    local = set(entry["mem_nodes"])
    for kind in ("anon", "file"):
        on_node = dict((int(node), counts[kind + "_bytes"]) for node, counts in report["nodes"].items())
        entry["resident_bytes"][kind] = sum(on_node.values())
        entry["remote_bytes"][kind] = sum(count for node, count in on_node.items() if node not in local)
    entry["remote_nodes"] = dict(
        (node, {"anon_bytes": counts["anon_bytes"], "file_bytes": counts["file_bytes"]})
        for node, counts in report["nodes"].items() if int(node) not in local
        and counts["anon_bytes"] + counts["file_bytes"])
    entry["local_ratio"] = {"anon": _ratio(report.get("anon_local_percent")),
                            "file": _ratio(report.get("file_local_percent")),
                            "judged": _ratio(report.get("local_percent"))}
    # An interleaved instance's split over its nodes, and what the kernel's weights make it should be.
    entry["interleave_ratio"] = {node: _ratio(share) for node, share in (report.get("interleave_percent") or {}).items()}
    entry["interleave_weight_ratio"] = {node: _ratio(share) for node, share in
                                        (report.get("interleave_weight_percent") or {}).items()}
    entry["pids"] = [process["pid"] for process in report["processes"]]
    entry["up"] = True
    entry["affinity_match"] = not any(process["threads_outside"] for process in report["processes"])
    entry["off_plan_thread_ratio"] = off_plan_ratio(report["processes"])
    judged = report.get("local_percent")
    entry["drift"] = bool(entry["judged"] and entry["policy"] in judging.ENFORCED_POLICIES and judged is not None
                          and judged < entry["min_local_percent"])
    entry["message"] = report["msg"]


def off_plan_ratio(processes: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """The share of the instance's threads last seen on a CPU outside its plan; None without a plan's CPUs."""
    counts = [process.get("threads_off_plan") for process in processes]
    threads = sum(process["thread_count"] for process in processes)
    if not threads or any(count is None for count in counts):
        return None
    return round(sum(counts) / float(threads), 4)


def _ratio(percent: Optional[float]) -> Optional[float]:
    return None if percent is None else round(percent / 100.0, 4)
