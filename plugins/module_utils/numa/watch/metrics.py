"""Continuous proof: each deployed instance's locality and the host's NUMA state as Prometheus metrics.

``collect`` reads, for every plan record a deployment left (``<plan_dir>/<service>@<i>.plan.json``,
written by the inference_service role), where the instance's pages really are (audit.py, from
``numa_maps``) and whether its threads stay on the plan's CPUs, and for the host
``kernel.numa_balancing``, each node's CPUs, GPUs, free memory and allocation counters
(numastat.py). ``render`` turns that snapshot into node_exporter's textfile format; ``write_textfile``
puts it in the textfile collector's directory atomically (an unpredictable temporary name in that
directory, fsync, rename), so a scrape never sees half a file.

Drift: a ``bind`` instance whose share of pages on its plan's nodes falls below its
``min_local_percent`` shows ``inferops_numa_instance_drift 1``; ``drift_actions`` says in the journal
which pages are where and, where the service opted in (``on_drift``), acts at most once per
``interval`` per instance: ``evict`` moves the instance's pages on other nodes back to its plan's nodes
(migrate_pages(2), as ``migratepages`` does), ``restart`` restarts the unit (numa-pin exec places it
again and drops remote page cache of its model at start).

numa-pin runs this as root from a systemd timer. So the plan records and the services' audit
settings it acts on are trusted only as root wrote them (regular files, owned by root, writable by
no one else, named as the role names them, their fields of the types it writes), in a plan directory
that root alone may write all the way up from ``/`` (whoever may write a directory above it could put
other records in its place, and choose which unit root restarts). The textfile and state directories
are reached from ``/`` one directory at a time without following a link (so no directory above them
can swap in another) and refused when anyone but root owns them or may write them: Debian's
/var/lib/prometheus belongs to prometheus, its node-exporter directory to root.

An action is taken only once the state directory holds it: when that write fails (a full /var) no
action is taken, so the interval holds across runs, reboots and full disks, and the textfile is still
written.
"""

import copy
import json
import math
import os
import re
import stat
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..read import audit, systemctl
from ..inputs import judging
from ..system import safe_fs
from ..base.cpulist import MAX_CPUS, MAX_NODES, format_cpulist, parse_cpulist
from ..base.errors import NumaError, shown

PLAN_DIR = "/etc/inferops-numa"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
STATE_DIR = "/var/lib/inferops-numa"
TEXTFILE_NAME = "inferops_numa.prom"
STATE_NAME = "drift-actions.json"
PREFIX = "inferops_numa_"
ON_DRIFT = ("none", "evict", "restart")
DEFAULT_DRIFT_INTERVAL = 3600
# What a service is held to when the deployment left no audit settings for it: the role's defaults.
DEFAULT_SETTINGS = dict(judging.DEFAULTS, audit=True, on_drift="none")
NUMASTAT_COUNTERS = ("numa_hit", "numa_miss", "numa_foreign", "other_node", "local_node", "interleave_hit")
MAX_JSON_BYTES = 1 << 20

PLAN_SUFFIX = ".plan.json"
# The A/B gates' verdicts of the last placement change (inference_service/tasks/main.yml writes it).
AB_GATES = "ab-gates.json"
# Every name a record could have, read for the unit it would name: svc@1 and svc@01 both name svc@1.service.
_RECORD_NAME = re.compile(r"(.*)@([0-9]+)\.plan\.json", re.DOTALL)
# The names the inference_service role writes: unit_text.unit_prefix's service names, less a leading '-'
# (systemctl would read the unit as an option), and an index in canonical decimal, so that a unit has
# one record name and a restart names only <service>@<index>.service of validated parts.
_SERVICE = re.compile(r"(?!\.\.?$)(?!-)[A-Za-z0-9_.-]{1,200}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,4}")
_POLICY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
MAX_CPULIST_CHARS = 1 << 16
# Far beyond any Unix time of this machine's life, and small enough for float arithmetic.
MAX_STATE_SECONDS = 1 << 40
MAX_STATE_COUNT = 1 << 53
REDEPLOY = "deploy the service again with the inference_service role"

Snapshot = Dict[str, Any]
Migrate = Callable[[int, Sequence[int], Sequence[int]], int]
# Writes the drift state durably before an action is taken; NumaError when it cannot.
Record = Callable[[Mapping[str, Dict[str, Any]]], Any]


# --- reading --------------------------------------------------------------------------------------


def collect(root: str = "/", plan_dir: str = PLAN_DIR, run: Optional[systemctl.CommandRunner] = None,
            topology: Optional[Dict[str, Any]] = None, page_size: Optional[int] = None,
            clock: Callable[[], float] = time.time) -> Snapshot:
    """The host's NUMA state and every recorded instance's locality, as one dict (see render)."""
    began = clock()
    warnings = []  # type: List[str]
    if topology is None:
        from ..read.topology import read

        topology = read(root)
    host = _host(root, topology, warnings)
    records = read_records(plan_dir, warnings)
    instances = _instances(root, records, run or systemctl.run_command, page_size, began, warnings)
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
            "gpu_count": len(topology.get("gpus") or [])}


def _kib(value: Any) -> Optional[int]:
    return value * 1024 if isinstance(value, int) and not isinstance(value, bool) else None


def read_records(plan_dir: str, warnings: List[str]) -> List[Dict[str, Any]]:
    """Every instance's plan record and its service's audit settings, sorted by unit; a record that
    cannot be trusted or read, or is misnamed, or names the same unit as another, is left out with a
    warning. Every file is opened in the directory checked, so none can be swapped in between."""
    try:
        fd = open_record_directory(plan_dir)
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
    gates = ab_gates(fd, plan_dir, warnings)
    for name in _unambiguous(names, plan_dir, warnings):
        path = os.path.join(plan_dir, name)
        try:
            service, index = record_unit(name, plan_dir)
            written, mtime = read_trusted_json(fd, name, path)
            plan = plan_fields(written, path)
            if service not in settings:
                settings[service] = service_settings(fd, plan_dir, service)
        except NumaError as exc:
            warnings.append(str(exc))
            continue
        unit = "%s@%d.service" % (service, index)
        records.append({"service": service, "index": index, "unit": unit, "plan": plan, "plan_mtime": mtime,
                        "settings": settings[service], "ab_gate": gates.get(unit)})
    return sorted(records, key=lambda record: (record["service"], record["index"]))


def ab_gates(plan_fd: int, plan_dir: str, warnings: List[str]) -> Dict[str, Dict[str, Any]]:
    """unit -> the A/B gate's last verdict on it (``ab-gates.json``, the role writes it): {kept, gain_percent}
    (None: nothing to compare with); a verdict that is not two such values is left out with a warning."""
    path = os.path.join(plan_dir, AB_GATES)
    try:
        written, _mtime = read_trusted_json(plan_fd, AB_GATES, path)
    except FileNotFoundError:
        return {}
    except NumaError as exc:
        warnings.append(str(exc))
        return {}
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
        match = _RECORD_NAME.fullmatch(name)
        key = (match.group(1), int(match.group(2))) if match else (name, -1)
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


def record_unit(name: str, plan_dir: str) -> Tuple[str, int]:
    """(service, index) of a record named ``<service>@<index>.plan.json`` as the role names it."""
    match = _RECORD_NAME.fullmatch(name)
    if not match or not _SERVICE.fullmatch(match.group(1)) or not _INDEX.fullmatch(match.group(2)):
        raise NumaError("ignoring the plan record %s in %s: not named <service>@<index>%s with a systemd service "
                        "name (letters, digits, '_', '.', '-', not first) and an index from 0 to 99999 without "
                        "leading zeros; remove it and %s" % (shown(name), plan_dir, PLAN_SUFFIX, REDEPLOY))
    return match.group(1), int(match.group(2))


def plan_fields(written: Mapping[str, Any], path: str) -> Dict[str, Any]:
    """The fields of a plan record the metrics show and the audit compares with, each of the type the role
    writes and in range: a policy name, node and CPU ids, a cpu list. NumaError naming the first that is not."""
    policy, mem_nodes, cpus, cpulist = (written.get(key) for key in ("policy", "mem_nodes", "cpus", "cpulist"))
    problem = (_policy_problem(policy) or _ids_problem("mem_nodes", mem_nodes, MAX_NODES)
               or _ids_problem("cpus", cpus, MAX_CPUS) or _cpulist_problem(cpulist))
    if problem:
        raise NumaError("ignoring %s: %s; %s" % (path, problem, REDEPLOY))
    fields = {"policy": policy or None, "mem_nodes": sorted(set(mem_nodes or [])), "cpulist": cpulist or ""}
    if cpus:
        fields["cpus"] = sorted(set(cpus))
    return fields


def _policy_problem(policy: Any) -> str:
    if policy in (None, "") or (isinstance(policy, str) and _POLICY.fullmatch(policy)):
        return ""
    return "policy %s is not a policy name like bind" % shown(policy)


def _ids_problem(field: str, ids: Any, limit: int) -> str:
    if ids is None or (isinstance(ids, list) and all(_is_count(item, limit - 1) for item in ids)):
        return ""
    return "%s %s is not a list of ids from 0 to %d" % (field, shown(ids), limit - 1)


def _cpulist_problem(cpulist: Any) -> str:
    if cpulist is None:
        return ""
    if not isinstance(cpulist, str) or len(cpulist) > MAX_CPULIST_CHARS:
        return "cpulist %s is not a cpu list of at most %d characters" % (shown(cpulist), MAX_CPULIST_CHARS)
    try:
        parse_cpulist(cpulist, MAX_CPUS)
    except NumaError as exc:
        return str(exc)
    return ""


def _is_count(value: Any, largest: int) -> bool:
    """A JSON integer from 0 to ``largest`` (true and false are no numbers)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= largest


def service_settings(plan_fd: int, plan_dir: str, service: str) -> Dict[str, Any]:
    """``<service>.audit.json`` in the plan directory (the role writes it): how the service is judged and
    what drift does; the role's defaults where there is none."""
    name = "%s.audit.json" % service
    path = os.path.join(plan_dir, name)
    try:
        written, _mtime = read_trusted_json(plan_fd, name, path)
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
    return settings


def read_trusted_json(dir_fd: int, name: str, path: str, fix: str = REDEPLOY) -> Tuple[Dict[str, Any], float]:
    """(a JSON object, its file's mtime) from the regular file ``name`` in the directory ``dir_fd`` (``path``
    in messages, which end with ``fix``), not through a link, that only root (or this process's user) may
    write; FileNotFoundError when there is none."""
    try:
        fd = os.open(name, safe_fs.READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise NumaError("cannot open %s (%s): it must be a regular file, not a symbolic link; %s"
                        % (path, exc.strerror, fix)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or safe_fs.TRUSTED_FILE.distrust(info, os.geteuid()):
            raise NumaError("ignoring %s (uid %d, mode %04o): only a regular file that root alone may write is "
                            "trusted; chown root and chmod go-w it, or %s"
                            % (path, info.st_uid, stat.S_IMODE(info.st_mode), fix))
        data = os.read(fd, MAX_JSON_BYTES + 1)
    finally:
        os.close(fd)
    try:
        value = json.loads(data.decode("utf-8")) if len(data) <= MAX_JSON_BYTES else None
    except (UnicodeDecodeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise NumaError("ignoring %s: not a JSON object of at most %d bytes in UTF-8; %s" % (path, MAX_JSON_BYTES, fix))
    return value, info.st_mtime


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
             "resident_bytes": {"anon": None, "file": None}, "remote_bytes": {"anon": None, "file": None},
             "affinity_match": None, "drift": False, "remote_nodes": {}, "message": "",
             "ab_gate": record.get("ab_gate")}
    if entry["state"] != "active" or int(props.get("MainPID") or 0) <= 0:
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
    entry["pids"] = [process["pid"] for process in report["processes"]]
    entry["up"] = True
    entry["affinity_match"] = not any(process["threads_outside"] for process in report["processes"])
    judged = report.get("local_percent")
    entry["drift"] = bool(entry["judged"] and entry["policy"] in audit.ENFORCED_POLICIES and judged is not None
                          and judged < entry["min_local_percent"])
    entry["message"] = report["msg"]


def _ratio(percent: Optional[float]) -> Optional[float]:
    return None if percent is None else round(percent / 100.0, 4)


# --- the textfile ----------------------------------------------------------------------------------


class Family:
    """One metric family: its name, type, HELP text and samples (labels, value)."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help_text = PREFIX + name, kind, help_text
        self.samples = []  # type: List[Tuple[Dict[str, str], float]]

    def add(self, labels: Mapping[str, Any], value: Any) -> None:
        if value is not None:
            self.samples.append((dict((key, str(item)) for key, item in labels.items()), value))

    def text(self) -> str:
        lines = ["# HELP %s %s" % (self.name, _help_escape(self.help_text)), "# TYPE %s %s" % (self.name, self.kind)]
        for labels, value in self.samples:
            inner = ",".join('%s="%s"' % (key, _label_escape(item)) for key, item in sorted(labels.items()))
            lines.append("%s%s %s" % (self.name, "{%s}" % inner if inner else "", _number(value)))
        return "\n".join(lines) + "\n"


def _help_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def render(snapshot: Mapping[str, Any], actions: Optional[Mapping[str, Mapping[str, Any]]] = None) -> str:
    """The snapshot in Prometheus' text exposition format (what node_exporter's textfile collector reads):
    base units (bytes, seconds, ratios 0-1), counters ending in ``_total``, one HELP and TYPE per family."""
    families = _host_families(snapshot["host"]) + _instance_families(snapshot["instances"], actions or {})
    own = [Family("metrics_timestamp_seconds", "gauge", "When numa-pin metrics last read the host (Unix time)."),
           Family("metrics_duration_seconds", "gauge", "How long numa-pin metrics took to read the host."),
           Family("metrics_warnings", "gauge", "Problems numa-pin metrics met reading the host (see its journal).")]
    own[0].add({}, snapshot["timestamp_seconds"])
    own[1].add({}, snapshot["duration_seconds"])
    own[2].add({}, len(snapshot["warnings"]))
    return "".join(family.text() for family in families + own if family.samples)


def _host_families(host: Mapping[str, Any]) -> List[Family]:
    balancing = Family("kernel_numa_balancing", "gauge",
                       "kernel.numa_balancing: 0 off, 1 on (the kernel migrates pages towards the CPUs using them), "
                       "2 memory tiering, 3 both.")
    balancing.add({}, host["numa_balancing"])
    nodes = Family("nodes", "gauge", "NUMA nodes of the host.")
    nodes.add({}, host["node_count"])
    cpus = Family("node_cpus", "gauge", "CPUs of the NUMA node.")
    gpus = Family("node_gpus", "gauge", "GPUs attached to the NUMA node (PCI locality).")
    total = Family("node_memory_total_bytes", "gauge", "Memory of the NUMA node.")
    free = Family("node_memory_free_bytes", "gauge", "Free memory of the NUMA node.")
    counters = dict((name, Family("node_%s_total" % name, "counter",
                                  "Pages allocated, kernel numastat %s of the node (%s)." % (name, meaning)))
                    for name, meaning in _COUNTER_MEANINGS)
    for node in host["nodes"]:
        labels = {"node": node["id"]}
        cpus.add(labels, node["cpus"])
        gpus.add(labels, node["gpus"])
        total.add(labels, node["memory_total_bytes"])
        free.add(labels, node["memory_free_bytes"])
        for name, family in counters.items():
            family.add(labels, node["counters"].get(name))
    return [balancing, nodes, cpus, gpus, total, free] + list(counters.values())


_COUNTER_MEANINGS = (
    ("numa_hit", "placed on the node its memory policy intended"),
    ("numa_miss", "placed here although the policy intended another node"),
    ("numa_foreign", "intended for this node, placed on another"),
    ("other_node", "placed here for a task running on another node"),
    ("local_node", "placed here for a task running on this node"),
    ("interleave_hit", "interleave policy pages placed on the node it intended"),
)


def _instance_families(instances: Sequence[Mapping[str, Any]],
                       actions: Mapping[str, Mapping[str, Any]]) -> List[Family]:
    up = Family("instance_up", "gauge", "1 when the instance's unit is active and its processes were measured.")
    local = Family("instance_local_ratio", "gauge",
                   "Share of the instance's resident pages (memory=anon or file) on its plan's nodes.")
    judged = Family("instance_judged_local_ratio", "gauge",
                    "Share of the pages its min_local_percent judges (pages=all: anon + file) on its plan's nodes.")
    minimum = Family("instance_min_local_ratio", "gauge", "The instance's min_local_percent as a ratio.")
    drift = Family("instance_drift", "gauge",
                   "1 when a bound instance's judged local ratio is below its min_local_ratio.")
    resident = Family("instance_resident_bytes", "gauge", "Resident anon or file memory of the instance.")
    remote = Family("instance_remote_bytes", "gauge", "Resident anon or file memory of the instance off its plan's nodes.")
    affinity = Family("instance_affinity_match", "gauge",
                      "1 when every thread of the instance may run only on its plan's CPUs and last ran on one.")
    age = Family("instance_plan_age_seconds", "gauge", "Seconds since the instance's plan record was written.")
    taken = Family("instance_drift_actions_total", "counter", "Drift actions (evict, restart) taken on the instance.")
    gain = Family("instance_ab_gain_ratio", "gauge",
                  "Tokens/s change the A/B gate measured at the instance's last placement change (0.65: 65 % faster).")
    kept = Family("instance_ab_kept", "gauge", "1 when the A/B gate kept that change, 0 when it rolled it back.")
    for entry in instances:
        labels = {"unit": entry["unit"], "service": entry["service"], "policy": entry["policy"],
                  "nodes": entry["nodes"]}
        up.add(labels, entry["up"])
        age.add(labels, entry["plan_age_seconds"])
        minimum.add(labels, round(entry["min_local_percent"] / 100.0, 6))
        taken_here = (actions.get(entry["unit"]) or {}).get("counts") or {}
        for action in ON_DRIFT[1:]:
            taken.add(dict(labels, action=action), int(taken_here.get(action, 0)))
        if entry.get("ab_gate"):
            kept.add(labels, entry["ab_gate"]["kept"])
            if entry["ab_gate"]["gain_percent"] is not None:
                gain.add(labels, round(entry["ab_gate"]["gain_percent"] / 100.0, 6))
        if not entry["up"]:
            continue
        for kind in ("anon", "file"):
            local.add(dict(labels, memory=kind), entry["local_ratio"][kind])
            resident.add(dict(labels, memory=kind), entry["resident_bytes"][kind])
            remote.add(dict(labels, memory=kind), entry["remote_bytes"][kind])
        judged.add(dict(labels, pages=entry["pages"]), entry["local_ratio"]["judged"])
        drift.add(labels, entry["drift"])
        affinity.add(labels, entry["affinity_match"])
    return [up, local, judged, minimum, drift, resident, remote, affinity, age, taken, gain, kept]


# --- files written as root -------------------------------------------------------------------------


def open_private_directory(path: str, what: str) -> int:
    """A descriptor of directory ``path`` (made 0755 if missing), reached from ``/`` one directory at a
    time without following a link; refused when anyone but root (or this user) owns it or may write it.

    Each step opens a name relative to the descriptor of the directory before it, never through a
    link, and the last directory is checked through its own descriptor (safe_fs.PRIVATE_DIR); so
    whoever owns a directory above it cannot swap in another one, and only the last one's owner and
    mode matter."""
    return _open_directory(path, what, safe_fs.PRIVATE_DIR, create=True)


def open_record_directory(path: str) -> Optional[int]:
    """A descriptor of the plan directory ``path``, reached as open_private_directory reaches its own but
    never made (None when it is missing: nothing is deployed), and refused unless every directory from ``/``
    to it is owned by root (or this user) and writable by no one else, sticky ones too (safe_fs.RECORD_DIR).
    The records decide which unit root restarts, so no one else may put another directory in its place,
    nor another record."""
    try:
        return _open_directory(path, "plan directory", safe_fs.RECORD_DIR)
    except FileNotFoundError:
        return None


def _open_directory(path: str, what: str, rule: safe_fs.TrustRule, create: bool = False) -> int:
    """A readable descriptor of the ``what`` directory ``path``, walked by safe_fs under ``rule``; NumaError
    naming its trust problem, FileNotFoundError when it is missing (and not ``create``)."""
    if not os.path.isabs(path):
        raise NumaError("the %s %s is not an absolute path: give one like %s" % (what, path, TEXTFILE_DIR))
    try:
        names = safe_fs.names_of("/", path)
    except safe_fs.Refused:
        raise NumaError("the %s %s holds '..': give the directory's own path" % (what, path)) from None
    try:
        fd, problem, _owner = safe_fs.open_directory("/", names, rule, create)
    except FileNotFoundError as exc:
        if not create:
            raise
        raise NumaError("the %s %s was removed while it was being made: run again" % (what, exc.filename)) from None
    except safe_fs.CreateFailed as exc:
        raise NumaError("cannot create the %s %s: %s" % (what, exc.filename, exc.strerror)) from None
    except (safe_fs.Refused, NotADirectoryError) as exc:
        raise NumaError("refusing the %s %s: it is a symbolic link or not a directory; give a real directory "
                        "that only root may write" % (what, getattr(exc, "path", exc.filename))) from None
    except OSError as exc:
        raise NumaError("cannot open the %s %s: %s" % (what, exc.filename, exc.strerror)) from None
    if problem:
        raise NumaError(_directory_problem(problem, problem.path == os.path.join("/", *names), path, what))
    return fd


def _directory_problem(problem: safe_fs.Distrust, last: bool, path: str, what: str) -> str:
    """Why the directory on the way to the ``what`` ``path`` (or that one, ``last``) is not trusted: anyone
    but root (or this user) owns it, or its group or others may write it."""
    subject = "it" if last else "%s above it" % problem.path
    if problem.why == safe_fs.OWNER:
        return ("refusing the %s %s: %s is owned by uid %d, who could swap the files root keeps there; chown root "
                "%s, or give a directory that only root may write"
                % (what, path, subject, problem.info.st_uid, problem.path))
    return ("refusing the %s %s: %s (mode %04o) may be written by its group or others, who could swap the files "
            "root keeps there; chmod go-w %s, or give a directory that only root may write"
            % (what, path, subject, stat.S_IMODE(problem.info.st_mode), problem.path))


def write_atomically(directory: str, name: str, text: str, what: str, mode: int = 0o644) -> str:
    """Write ``directory/name`` whole or not at all (safe_fs.write_atomically): an unpredictable temporary
    name there (never ``*.prom``, which the collector would read), fsync, rename, fsync the directory. Its path."""
    fd = open_private_directory(directory, what)
    try:
        safe_fs.write_atomically(fd, name, text.encode("utf-8"), mode, ".%s." % name)
    except OSError as exc:
        raise NumaError("cannot write %s in the %s %s: %s; check the disk and that root may write there"
                        % (name, what, directory, exc.strerror)) from None
    finally:
        os.close(fd)
    return os.path.join(directory, name)


def write_textfile(directory: str, text: str) -> str:
    return write_atomically(directory, TEXTFILE_NAME, text, "textfile directory")


# --- drift ----------------------------------------------------------------------------------------


def read_actions(state_dir: str) -> Dict[str, Dict[str, Any]]:
    """unit -> {"last_seconds": when its last action was taken, "counts": {action: n}}; {} when none yet.
    NumaError when the state cannot be read or trusted: when each unit last acted is then unknown."""
    path = os.path.join(state_dir, STATE_NAME)
    fix = "remove it to start every drift interval again"
    try:
        fd = _open_directory(state_dir, "state directory", safe_fs.PRIVATE_DIR)
    except FileNotFoundError:
        return {}
    try:
        value, _mtime = read_trusted_json(fd, STATE_NAME, path, fix)
    except FileNotFoundError:
        return {}
    finally:
        os.close(fd)
    for unit, entry in value.items():
        if not _is_state_entry(entry):
            raise NumaError("ignoring %s: the entry of %s is not {\"last_seconds\": seconds, \"counts\": {action: n}} "
                            "of %s; %s" % (path, shown(unit), ", ".join(ON_DRIFT[1:]), fix))
    return value


def _is_state_entry(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("counts"), dict):
        return False
    last = entry.get("last_seconds")
    # NaN compares false, so it is no number here; a huge one would overflow the float arithmetic.
    if isinstance(last, bool) or not isinstance(last, (int, float)) or not 0 <= last <= MAX_STATE_SECONDS:
        return False
    return all(action in ON_DRIFT[1:] and _is_count(count, MAX_STATE_COUNT)
               for action, count in entry["counts"].items())


def act_on_drift(snapshot: Snapshot, state_dir: str, interval: float, now: float, run: systemctl.CommandRunner,
                 migrate: Optional[Migrate] = None) -> Tuple[List[str], Dict[str, Dict[str, Any]]]:
    """The timer's drift step: drift_actions with the state of ``state_dir``, each action written there before
    it is taken. State that cannot be read or trusted is a warning of the snapshot and no action.
    (The journal lines, the action counts to render.)"""
    try:
        actions = read_actions(state_dir)
    except NumaError as exc:
        snapshot["warnings"].append("no on_drift action is taken: %s" % exc)
        return drift_actions(snapshot["instances"], {}, interval, now, run, act=False)[0], {}
    lines, _changed = drift_actions(snapshot["instances"], actions, interval, now, run, migrate,
                                    record=lambda marked: write_actions(state_dir, marked))
    return lines, actions


def drift_actions(instances: Sequence[Mapping[str, Any]], actions: Dict[str, Dict[str, Any]], interval: float,
                  now: float, run: systemctl.CommandRunner, migrate: Optional[Migrate] = None,
                  act: bool = True, record: Optional[Record] = None) -> Tuple[List[str], bool]:
    """Journal lines for every drifted instance; with ``act``, the on_drift action of each that opted in
    and last acted more than ``interval`` seconds ago, counted in ``actions``. The counts are handed to
    ``record`` (which writes them durably) before any action is taken, and none is taken when that fails
    or there is no ``record``: an action not remembered would be taken again at every run.
    (The lines, whether ``actions`` changed.)"""
    lines = []
    due = []  # type: List[Tuple[Mapping[str, Any], str]]
    for entry in instances:
        if not entry["drift"]:
            continue
        lines.append("drift: %s" % entry["message"])  # the audit's words: the share, and the remote pages per node
        action = entry["on_drift"]
        if action == "none" or not act:
            continue
        last = (actions.get(entry["unit"]) or {}).get("last_seconds")
        if last is not None and now - last < interval:
            lines.append("drift: %s: on_drift %s not taken: the last action was %.0f s ago, within the %g s "
                         "interval" % (entry["unit"], action, now - last, interval))
            continue
        due.append((entry, action))
    if not due:
        return lines, False
    marked = _marked(actions, due, now)
    problem = _recorded(record, marked)
    if problem:
        lines.append("drift: on_drift %s not taken: it could not be recorded first: %s"
                     % (", ".join("%s of %s" % (action, entry["unit"]) for entry, action in due), problem))
        return lines, False
    actions.update(marked)
    lines.extend(_act(entry, action, run, migrate) for entry, action in due)
    return lines, True


def _marked(actions: Mapping[str, Dict[str, Any]], due: Sequence[Tuple[Mapping[str, Any], str]],
            now: float) -> Dict[str, Dict[str, Any]]:
    """The state with each due action taken at ``now``; ``actions`` itself changes only once that is recorded."""
    marked = copy.deepcopy(dict(actions))
    for entry, action in due:
        counts = marked.setdefault(entry["unit"], {"counts": {}})["counts"]
        marked[entry["unit"]]["last_seconds"] = now
        counts[action] = int(counts.get(action, 0)) + 1
    return marked


def _recorded(record: Optional[Record], marked: Mapping[str, Dict[str, Any]]) -> str:
    """Why ``marked`` is not durably recorded; "" once it is."""
    if record is None:
        return "no state directory was given to record it in"
    try:
        record(marked)
    except NumaError as exc:
        return str(exc)
    return ""


def _act(entry: Mapping[str, Any], action: str, run: systemctl.CommandRunner, migrate: Optional[Migrate]) -> str:
    unit = entry["unit"]
    if action == "restart":
        rc, out, err = run(["systemctl", "restart", "--", unit])
        if rc != 0:
            return "drift: %s: restart FAILED (rc %d): %s" % (unit, rc, (err or out).strip())
        return "drift: %s: restarted (on_drift restart)" % unit
    if migrate is None:
        from ..system.kernel import migrate_pages as migrate
    remote = sorted(int(node) for node in entry["remote_nodes"])
    notes = []
    for pid in entry["pids"]:
        try:
            left = migrate(pid, remote, entry["mem_nodes"])
            notes.append("PID %d: %s" % (pid, "moved" if not left else "%d pages could not be moved" % left))
        except NumaError as exc:
            notes.append("PID %d: NOT moved: %s" % (pid, exc))
    return "drift: %s: pages on node(s) %s moved to node(s) %s (on_drift evict): %s" % (
        unit, format_cpulist(remote), entry["nodes"], "; ".join(notes) or "no process")


def write_actions(state_dir: str, actions: Mapping[str, Any]) -> str:
    return write_atomically(state_dir, STATE_NAME, json.dumps(actions, indent=1, sort_keys=True) + "\n",
                            "state directory", mode=0o600)


def check_interval(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= audit.MAX_WAIT_SECONDS * 30:
        raise NumaError("drift interval %s is not a number of seconds from 0 to %d: give one like %d"
                        % (value, audit.MAX_WAIT_SECONDS * 30, DEFAULT_DRIFT_INTERVAL))
