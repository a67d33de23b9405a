"""Set the kernel's weighted-interleave weights from what each memory node delivers, and keep them across reboots.

decide/weights.py chooses the weights (numa_cost's recorded bandwidth, else HMAT's, else the kernel's ``auto``); this
module reads what the kernel has now and the one file the collection owns for them, a systemd-tmpfiles drop-in
(``/etc/tmpfiles.d/60-inferops-numa-weights.conf``: ``w`` lines that systemd-tmpfiles-setup writes to sysfs at boot,
before any service starts), and returns a ``WeightsPlan`` whose ``knobs.KnobPlan`` act/knobs applies, changing only
what differs. A drop-in that boot must not apply as it is (root_files.dropin_distrust) is refused
(knobs.read_trusted), where numa_balancing rewrites its own (knobs.rewrite_reason).
"""

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import knobs
from ..base.errors import NumaError
from ..decide import weights as choice
from ..measure import cost
from ..read import topology

# Not a bandwidth (a choice of the module, not of make_plan): the weights and drop-in that stood before the first
# change, from knobs' originals record.
ORIGINAL = "original"
SOURCES = ("auto",) + choice.SOURCES
RECORD_DIR = cost.RECORD_DIR
WEIGHTS_DIR = "/sys/kernel/mm/mempolicy/weighted_interleave"
DROPIN_NAME = "60-inferops-numa-weights.conf"
DROPIN_PATH = "/etc/tmpfiles.d/" + DROPIN_NAME
KNOB = knobs.Knob("numa_weights", WEIGHTS_DIR, DROPIN_PATH, "something else writes " + WEIGHTS_DIR)


class WeightsPlan(NamedTuple):
    knob: knobs.KnobPlan              # the runtime writes and the drop-in, applied by knobs.apply
    supported: bool
    source: Optional[str]             # measured, hmat or kernel; None: nothing to weigh by
    bandwidth: Dict[int, float]       # per memory node, in the source's unit
    before: Dict[int, int]            # the kernel's weights now
    desired: Dict[int, int]           # what they become (empty when the kernel computes them)
    auto_before: Optional[bool]       # the kernel's auto mode now (None: this kernel has none)
    auto_after: Optional[bool]

    @property
    def dropin_after(self) -> Optional[str]:
        return self.knob.dropin_after

    @property
    def reasons(self) -> List[str]:
        return self.knob.reasons

    @property
    def warnings(self) -> Tuple[str, ...]:
        """A numa_cost record there but unusable: said, and the next source taken."""
        return tuple(self.knob.warnings)

    @property
    def runtime_changes(self) -> Dict[int, int]:
        return {node: weight for node, weight in self.desired.items() if self.before.get(node) != weight}

    @property
    def auto_changed(self) -> bool:
        return self.auto_after is not None and self.auto_after != self.auto_before

    @property
    def dropin_changed(self) -> bool:
        return self.knob.dropin_changed

    @property
    def changed(self) -> bool:
        return self.knob.changed


def _auto_text(auto: Optional[bool]) -> Optional[str]:
    return None if auto is None else "true" if auto else "false"


def _settings(before: Dict[int, int], desired: Dict[int, int], auto_before: Optional[bool],
              auto_after: Optional[bool]) -> Tuple[knobs.Setting, ...]:
    """auto first (writing a node's weight turns it off), then every node the kernel or the plan has."""
    auto = () if auto_before is None else (knobs.Setting("auto", WEIGHTS_DIR + "/auto", _auto_text(auto_before),
                                                         _auto_text(auto_after)),)
    return auto + tuple(knobs.Setting("node%d" % node, "%s/node%d" % (WEIGHTS_DIR, node),
                                      None if node not in before else str(before[node]),
                                      None if node not in desired else str(desired[node]))
                        for node in sorted(set(before) | set(desired)))


def _plan(root: str, supported: bool, source: Optional[str], bandwidth: Dict[int, float], before: Dict[int, int],
          desired: Dict[int, int], auto_before: Optional[bool], auto_after: Optional[bool],
          dropin_before: Optional[str], dropin_after: Optional[str], reasons: List[str],
          warnings: Tuple[str, ...] = ()) -> WeightsPlan:
    knob = knobs.KnobPlan(KNOB, root, _settings(before, desired, auto_before, auto_after), dropin_before,
                          dropin_after, None, reasons, list(warnings))
    return WeightsPlan(knob, supported, source, bandwidth, before, desired, auto_before, auto_after)


def make_plan(root: str, source: str = "auto", persist: bool = True, record_dir: str = RECORD_DIR,
              read_record: Callable[[str], Optional[Dict[str, Any]]] = cost.read_record) -> WeightsPlan:
    """What to write for ``source`` (SOURCES) on the host under ``root``; NumaError when ``source`` cannot be had."""
    if source not in SOURCES:
        raise NumaError("unknown weights source %r: choose one of %s" % (source, ", ".join(SOURCES)))
    facts = topology.read(root)
    features = (facts.get("kernel") or {}).get("features") or {}
    before = {int(node): weight for node, weight in ((facts["kernel"].get("weighted_interleave")) or {}).items()}
    auto_before = features.get("weighted_interleave_auto")
    dropin_before = knobs.read_trusted(root, KNOB)
    base = dict(root=root, supported=False, source=None, bandwidth={}, before=before, desired={},
                auto_before=auto_before, auto_after=None, dropin_before=dropin_before, dropin_after=dropin_before)
    if not features.get("weighted_interleave"):
        release = features.get("release") or "release unknown"
        return _plan(reasons=["the kernel (%s) has no weighted interleave (Linux 6.9+): interleaved instances "
                              "get plain interleave, equal pages on each node" % release], **base)
    base["supported"] = True
    found, reasons, unusable = _bandwidths(facts, source, record_dir, read_record)
    if unusable:
        base["warnings"] = ("the numa_cost record is not used, the next source is: %s" % unusable,)
    if found is None and (source == "kernel" or (source == "auto" and auto_before is not None)):
        return _kernel_plan(base, reasons, persist)
    if found is None:
        reasons.append("kernel: this kernel does not compute weights (weighted_interleave/auto, Linux 6.16+)")
        if source != "auto":
            raise NumaError("no %s bandwidth to weigh by: %s; choose another source, or run numa_cost with record: "
                            "true first" % (source, "; ".join(reasons)))
        return _plan(reasons=reasons + ["weights left as they are"], **base)
    desired = choice.weights_from_bandwidth(found.by_node)
    base.update(source=found.source, bandwidth=found.by_node, desired=desired,
                auto_after=False if auto_before is not None else None,
                dropin_after=dropin_text(found.source, desired, None) if persist else None)
    return _plan(reasons=reasons + [_weights_reason(found, desired)], **base)


def _bandwidths(facts: Dict[str, Any], source: str, record_dir: str,
                read_record: Callable[[str], Optional[Dict[str, Any]]]
                ) -> Tuple[Optional[choice.Bandwidths], List[str], Optional[str]]:
    """(the bandwidths, why each source was passed over, why a numa_cost record that is there was not used)."""
    if source == "kernel":
        return None, [], None
    record, reasons, unusable = None, [], None  # type: Optional[Dict[str, Any]], List[str], Optional[str]
    if source in ("auto", "measured"):
        try:
            record = read_record(record_dir)
        except NumaError as exc:
            if source == "measured":
                raise
            reasons.append("measured: %s" % exc)
            unusable = str(exc)
    found, passed_over = choice.choose(facts, record, source)
    if record is not None and (found is None or found.source != "measured"):
        unusable = choice.measured_bandwidths(facts, record).reason
    # An unreadable record already said why; "no record" would only repeat it.
    reasons += [reason for reason in passed_over if not (reasons and reason.startswith("measured:"))]
    return found, reasons, unusable


def _kernel_plan(base: Dict[str, Any], reasons: List[str], persist: bool) -> WeightsPlan:
    if base["auto_before"] is None:
        raise NumaError("the kernel computes no weights itself (weighted_interleave/auto needs Linux 6.16+): choose "
                        "source hmat or measured")
    base.update(source="kernel", auto_after=True, dropin_after=dropin_text("kernel", {}, True) if persist else None)
    return _plan(reasons=reasons + ["the kernel computes the weights from HMAT (weighted_interleave/auto)"], **base)


def _weights_reason(found: choice.Bandwidths, desired: Dict[int, int]) -> str:
    unit = "GB/s" if found.source == "measured" else "MB/s"
    return "weights from %s bandwidth: %s" % (found.source, ", ".join(
        "node %d %g %s -> %d" % (node, found.by_node[node], unit, desired[node]) for node in sorted(desired)))


def dropin_text(source: str, desired: Dict[int, int], auto: Optional[bool]) -> str:
    """The tmpfiles.d drop-in that sets the same weights at every boot (tmpfiles.d(5) ``w``: write to a file)."""
    lines = ["# Written by inferops.numa (numa_weights, from %s): the weighted-interleave weights, written again at "
             "every boot by systemd-tmpfiles-setup." % source]
    if auto:
        lines.append("w %s/auto - - - - true" % WEIGHTS_DIR)
    lines.extend("w %s/node%d - - - - %d" % (WEIGHTS_DIR, node, weight) for node, weight in sorted(desired.items()))
    return "\n".join(lines) + "\n"


def result(plan: WeightsPlan, check_mode: bool) -> Dict[str, Any]:
    would = "would " if check_mode else ""
    changes = ["node%d %s -> %d" % (node, plan.before.get(node, "unset"), weight)
               for node, weight in sorted(plan.runtime_changes.items())]
    if plan.auto_changed:
        changes.insert(0, "auto %s -> %s" % (plan.auto_before, plan.auto_after))
    if plan.dropin_changed:
        changes.append(("write " if plan.dropin_after is not None else "remove ") + DROPIN_PATH)
    what = "%sset %s" % (would, "; ".join(changes)) if changes else "weights already as wanted"
    return {
        "changed": plan.changed, "supported": plan.supported, "source": plan.source,
        "weights": {str(node): weight for node, weight in sorted(plan.desired.items())},
        "weights_before": {str(node): weight for node, weight in sorted(plan.before.items())},
        "bandwidth": {str(node): value for node, value in sorted(plan.bandwidth.items())},
        "auto": plan.auto_after if plan.auto_after is not None else plan.auto_before,
        "dropin": DROPIN_PATH, "reasons": plan.reasons,
        "msg": "%s (%s)" % (what, plan.reasons[-1]) if plan.reasons else what,
    }


def restore_result(plan: knobs.RestorePlan, check_mode: bool) -> Dict[str, Any]:
    """The module's return values for source=original: the keys ``result`` returns."""
    def weights(values: Dict[str, Optional[str]]) -> Dict[str, Any]:
        return {name[len("node"):]: int(text) if text.isdigit() else text
                for name, text in sorted(values.items()) if name.startswith("node") and text is not None}
    before = {s.name: s.before for s in plan.knob.settings}
    after = dict(before, **{s.name: s.after for s in plan.knob.settings if s.after is not None})
    auto = after.get("auto")
    return {
        "changed": plan.changed, "supported": True, "source": ORIGINAL, "weights": weights(after),
        "weights_before": weights(before), "bandwidth": {}, "auto": None if auto is None else auto == "true",
        "dropin": DROPIN_PATH, "reasons": plan.knob.reasons, "msg": knobs.restore_summary(plan, check_mode),
    }


def diff(plan: WeightsPlan) -> List[Dict[str, str]]:
    """Ansible diff entries: the drop-in, then the kernel's weights (and auto, where the kernel has it)."""
    return knobs.diff(plan.knob)
