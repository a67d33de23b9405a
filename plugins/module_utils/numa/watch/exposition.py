"""Continuous proof, shown: a metrics snapshot (metrics.collect) in node_exporter's textfile format.

``render`` writes the Prometheus text exposition; ``write_textfile`` puts it in the textfile collector's
directory atomically (an unpredictable temporary name in that directory, fsync, rename), so a scrape never
sees half a file. The directory is reached from ``/`` one directory at a time without following a link (so
no directory above it can swap in another) and refused when anyone but root owns it or may write it:
Debian's /var/lib/prometheus belongs to prometheus, its node-exporter directory to root.
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import metrics
from ..system import trusted_files

TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
TEXTFILE_NAME = "inferops_numa.prom"
PREFIX = "inferops_numa_"


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
    return [balancing, nodes, cpus, gpus, total, free] + list(counters.values()) + _irq_families(host)


def _irq_families(host: Mapping[str, Any]) -> List[Family]:
    interrupts = Family("device_interrupts", "gauge",
                        "MSI interrupts of a device whose interrupts numa_irqs serves on its node's CPUs.")
    outside = Family("device_interrupts_outside", "gauge",
                     "Those of them the kernel may run outside the device's CPUs (moved by another tool, or "
                     "managed by the kernel).")
    for device in host.get("device_irqs") or ():
        labels = {"device": device["device"], "cpus": device["cpus"]}
        interrupts.add(labels, device["interrupts"])
        outside.add(labels, device["outside"])
    return [interrupts, outside]


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
    off_plan = Family("instance_threads_off_plan_ratio", "gauge",
                      "Share of the instance's threads last seen on a CPU outside its plan (/proc/<pid>/task/*/stat).")
    bound = Family("instance_roofline_tokens_per_second", "gauge",
                   "The decode rate the plan's memory nodes allow: their bandwidth / the model's bytes per token.")
    roof_share = Family("instance_roofline_ratio", "gauge",
                        "The A/B gate's measured tokens/s as a share of instance_roofline_tokens_per_second.")
    age = Family("instance_plan_age_seconds", "gauge", "Seconds since the instance's plan record was written.")
    taken = Family("instance_drift_actions_total", "counter", "Drift actions (evict, restart) taken on the instance.")
    gain = Family("instance_ab_gain_ratio", "gauge",
                  "Tokens/s change the A/B gate measured at the instance's last placement change (0.65: 65 % faster).")
    kept = Family("instance_ab_kept", "gauge", "1 when the A/B gate kept that change, 0 when it rolled it back.")
    split = Family("instance_interleave_node_ratio", "gauge",
                   "Share of an interleaved instance's judged pages on its plan's nodes that is on this node.")
    weight = Family("instance_interleave_weight_ratio", "gauge",
                    "The share the kernel's weighted-interleave weights give this node of the instance's plan.")
    local_traffic = Family("instance_mbm_local_bytes_total", "counter",
                           "Bytes the instance's threads moved to and from the memory of the L3 domain they ran on "
                           "(resctrl mbm_local_bytes of its own monitor group).")
    all_traffic = Family("instance_mbm_bytes_total", "counter",
                         "Bytes the instance's threads moved to and from memory (resctrl mbm_total_bytes of its own "
                         "monitor group).")
    for entry in instances:
        labels = {"unit": entry["unit"], "service": entry["service"], "policy": entry["policy"],
                  "nodes": entry["nodes"]}
        up.add(labels, entry["up"])
        age.add(labels, entry["plan_age_seconds"])
        minimum.add(labels, round(entry["min_local_percent"] / 100.0, 6))
        taken_here = (actions.get(entry["unit"]) or {}).get("counts") or {}
        for action in metrics.ON_DRIFT[1:]:
            taken.add(dict(labels, action=action), int(taken_here.get(action, 0)))
        found = entry.get("roofline") or {}
        bound.add(labels, found.get("bound_tokens_per_second"))
        roof_share.add(labels, found.get("share"))
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
        off_plan.add(labels, entry.get("off_plan_thread_ratio"))
        for node, ratio in sorted((entry.get("interleave_ratio") or {}).items()):
            split.add(dict(labels, node=node), ratio)
        for node, ratio in sorted((entry.get("interleave_weight_ratio") or {}).items()):
            weight.add(dict(labels, node=node), ratio)
        counted = entry.get("memory_bandwidth") or {}
        local_traffic.add(labels, counted.get("local_bytes"))
        all_traffic.add(labels, counted.get("total_bytes"))
    return [up, local, judged, minimum, drift, resident, remote, affinity, off_plan, age, taken, gain, kept, split,
            weight, local_traffic, all_traffic, bound, roof_share]


# --- files written as root -------------------------------------------------------------------------


def write_textfile(directory: str, text: str) -> str:
    return trusted_files.write_atomically(directory, TEXTFILE_NAME, text, "textfile directory")
