"""Set the cpufreq governor of a host's CPUs (all, or those of a list), keep it across reboots, and put back the host's.

A decode step is a burst of a few milliseconds per token: a governor that ramps the clock with load (powersave under
intel_pstate, schedutil, ondemand) answers each burst late, and ``performance`` holds the clock up. cpufreq governs
by policy: ``/sys/devices/system/cpu/cpufreq/policyN`` holds one ``scaling_governor`` for the CPUs of its
``related_cpus``, and each CPU's ``cpufreq`` is a link to its policy. So the runtime files are the policies'; a policy
that also governs CPUs outside the list is set all the same, and a reason says which. The drop-in is a
systemd-tmpfiles ``w`` line per policy (``/etc/tmpfiles.d/60-inferops-numa-governor.conf``), written at every boot
before any service starts. act/knobs applies the plan, records the governors that stood before the first change and
puts them back (``ORIGINAL``).
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import knobs
from ..base.cpulist import format_cpulist, parse_cpulist
from ..base.errors import NumaError, shown
from ..measure import ab_gate
from ..read.kernel_files import Root
from ..system.root_files import host_path

POLICY_DIR = "/sys/devices/system/cpu/cpufreq"
DROPIN_PATH = "/etc/tmpfiles.d/60-inferops-numa-governor.conf"
KNOB = knobs.Knob("numa_governor", POLICY_DIR, DROPIN_PATH,
                  "something else sets the governor (tuned, power-profiles-daemon, cpupower.service): stop it, or "
                  "have it set this governor")
# The governor value that puts back the ones recorded before the first change, not a governor of the kernel's.
ORIGINAL = "original"
# The change the A/B gate rolled back (each policy's governor and the drop-in it would have written) and why.
REJECTED_PATH = "/etc/inferops-numa/governor.rejected"
# A kernel governor's name (cpufreq_governor.name is at most 15 characters of these).
_NAME_CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789_-"


class Policy(NamedTuple):
    """One cpufreq policy as the kernel shows it."""

    name: str  # policyN
    cpus: Tuple[int, ...]  # related_cpus: the CPUs its governor clocks
    governor: Optional[str]  # scaling_governor now; None where it cannot be read
    available: Tuple[str, ...]  # scaling_available_governors


class GovernorPlan(NamedTuple):
    knob: knobs.KnobPlan
    governor: str
    policies: Tuple[Policy, ...]  # those the plan sets
    supported: bool  # the host has cpufreq policies

    @property
    def changed(self) -> bool:
        return self.knob.changed


def read_policies(root: str) -> List[Policy]:
    """The host's cpufreq policies, by number; none where it has no cpufreq (a VM, no driver loaded)."""
    relative = POLICY_DIR.lstrip("/")
    with Root(root) as tree:
        try:
            names = [name for name in tree.listdir(relative) if name[:6] == "policy" and name[6:].isdigit()]
        except OSError:
            return []
        return [_policy(tree, relative + "/" + name, name) for name in sorted(names, key=lambda name: int(name[6:]))]


def _policy(tree: Root, directory: str, name: str) -> Policy:
    def text(file: str) -> str:
        try:
            return tree.read(directory + "/" + file, 4096).decode("ascii", "replace").strip()
        except OSError:
            return ""
    try:
        cpus = tuple(parse_cpulist(text("related_cpus").replace(" ", ",")))
    except NumaError:
        cpus = ()
    governor = text("scaling_governor")
    return Policy(name, cpus, governor if _is_name(governor) else None,
                  tuple(word for word in text("scaling_available_governors").split() if _is_name(word)))


def _is_name(word: str) -> bool:
    return 0 < len(word) <= 15 and not word.strip(_NAME_CHARACTERS)


def make_plan(root: str, governor: str, cpus: Optional[str] = None, persist: bool = True) -> GovernorPlan:
    """What to write so the policies of ``cpus`` (a CPU list; None: every policy) run ``governor``; NumaError naming
    the cause and the fix for a governor a policy does not offer, or CPUs no policy governs."""
    if not _is_name(governor):
        raise NumaError("governor %s is no cpufreq governor's name: give one such as performance or schedutil"
                        % shown(governor))
    policies = read_policies(root)
    dropin_before = knobs.read_trusted(root, KNOB)
    if not policies:
        knob = knobs.KnobPlan(KNOB, root, (), dropin_before, dropin_before, None, [
            "no cpufreq policies under %s (a VM, or no cpufreq driver loaded): the clock is not this host's to "
            "govern, nothing is set" % host_path(root, POLICY_DIR)], [])
        return GovernorPlan(knob, governor, (), False)
    chosen, reasons = _chosen(policies, cpus)
    unable = ["%s (CPUs %s) offers %s" % (policy.name, format_cpulist(policy.cpus), " ".join(policy.available)
                                          or "none") for policy in chosen if governor not in policy.available]
    if unable:
        raise NumaError("governor %s is not available: %s; choose one they offer (scaling_available_governors), or "
                        "load its module" % (governor, "; ".join(unable)))
    settings = tuple(knobs.Setting(policy.name, "%s/%s/scaling_governor" % (POLICY_DIR, policy.name),
                                   policy.governor, governor) for policy in chosen)
    clocked = format_cpulist(sorted(cpu for policy in chosen for cpu in policy.cpus))
    reasons.append("governor %s on %s (CPUs %s)" % (governor, ", ".join(policy.name for policy in chosen), clocked))
    knob = knobs.KnobPlan(KNOB, root, settings, dropin_before, dropin_text(governor, chosen) if persist else None,
                          None, reasons, [])
    return GovernorPlan(knob, governor, tuple(chosen), True)


def _chosen(policies: List[Policy], cpus: Optional[str]) -> Tuple[List[Policy], List[str]]:
    """The policies that govern ``cpus`` (all of them for None), and what the choice means beyond the list."""
    if cpus is None:
        return policies, []
    try:
        wanted = set(parse_cpulist(cpus))
    except NumaError as exc:
        raise NumaError("cpus: %s" % exc) from None
    if not wanted:
        raise NumaError("cpus is empty: give a CPU list such as 0-15, or leave it out for every CPU")
    chosen = [policy for policy in policies if wanted & set(policy.cpus)]
    ungoverned = wanted - {cpu for policy in chosen for cpu in policy.cpus}
    if ungoverned:
        raise NumaError("cpus %s are in no cpufreq policy (offline, or not this host's): give CPUs of %s"
                        % (format_cpulist(sorted(ungoverned)), format_cpulist(sorted(
                            cpu for policy in policies for cpu in policy.cpus))))
    beyond = [(policy, sorted(set(policy.cpus) - wanted)) for policy in chosen if set(policy.cpus) - wanted]
    return chosen, ["%s also clocks CPUs %s, which are not in cpus: they get the governor too" % (
        policy.name, format_cpulist(others)) for policy, others in beyond]


# ---------------------------------------------------------------- the A/B gate


def apply_gated(plan: GovernorPlan, gated: Sequence[Tuple[str, ab_gate.Gate]],
                rates: ab_gate.Rates = ab_gate.measure) -> Tuple[Dict[str, Dict[str, Any]], bool]:
    """The plan applied, judged as a placement change is (measure/ab_gate.before_and_after): when a gated instance is
    slower, the change is recorded (``rejected``: later runs keep the governors as they are) and every policy and the
    drop-in are put back as they were. (verdicts by unit, whether it was rolled back)."""
    back = _reversed(plan.knob)
    _done, verdicts, slower = ab_gate.before_and_after(
        gated, lambda: knobs.apply(plan.knob), lambda: knobs.apply(back), "the governors were put back as they were",
        rates)
    if slower:
        knobs.write_rejected(plan.knob.root, REJECTED_PATH, dict(_change(plan), verdict="; ".join(slower)))
        knobs.apply(back)
    return verdicts, bool(slower)


def _reversed(knob: knobs.KnobPlan) -> knobs.KnobPlan:
    """What takes ``knob`` back: each setting it changes to what it read, the drop-in to what stood there."""
    return knob._replace(settings=tuple(setting._replace(before=setting.after, after=setting.before)
                                        for setting in knob.runtime_changes),
                         dropin_before=knob.dropin_after, dropin_after=knob.dropin_before, dropin_flaw=None)


def _change(plan: GovernorPlan) -> Dict[str, Any]:
    return {"settings": {setting.name: setting.after for setting in plan.knob.settings},
            "dropin": plan.knob.dropin_after}


def rejected(root: str) -> Optional[Dict[str, Any]]:
    """The A/B gate's last rollback ({"settings", "dropin", "verdict"}), None when there was none; refused when the
    record cannot be trusted."""
    return knobs.read_rejected(root, REJECTED_PATH, KNOB.owner, _is_rejected_record)


def _is_rejected_record(record: Dict[str, Any]) -> bool:
    settings = record["settings"]
    return (isinstance(settings, dict) and all(isinstance(name, str) and isinstance(value, str)
                                               for name, value in settings.items())
            and isinstance(record["dropin"], (str, type(None))) and isinstance(record["verdict"], str))


def unless_rejected(plan: GovernorPlan, root: str) -> GovernorPlan:
    """``plan``, or, when the A/B gate rolled this same change back before, a plan that changes nothing and says
    why."""
    last = rejected(root) if plan.changed else None
    if last is None or {key: last[key] for key in ("settings", "dropin")} != _change(plan):
        return plan
    knob = plan.knob._replace(settings=tuple(setting._replace(after=setting.before) for setting in plan.knob.settings),
                              dropin_after=plan.knob.dropin_before, dropin_flaw=None, reasons=plan.knob.reasons + [
                                  "the A/B gate rolled this change back before (%s): the governors stay as they are; "
                                  "it is measured again when the request changes, or once %s is removed"
                                  % (last["verdict"], REJECTED_PATH)])
    return plan._replace(knob=knob)


def dropin_text(governor: str, policies: List[Policy]) -> str:
    """The tmpfiles.d drop-in that sets the same governor at every boot (tmpfiles.d(5) ``w``: write to a file)."""
    lines = ["# Written by inferops.numa (numa_governor): the cpufreq governor, set again at every boot by "
             "systemd-tmpfiles-setup."]
    lines.extend("w %s/%s/scaling_governor - - - - %s" % (POLICY_DIR, policy.name, governor) for policy in policies)
    return "\n".join(lines) + "\n"


def result(plan: GovernorPlan, check_mode: bool, verdicts: Optional[Dict[str, Dict[str, Any]]] = None,
           rolled_back: bool = False) -> Dict[str, Any]:
    would = "would " if check_mode else ""
    changes = ["%s %s -> %s" % (setting.name, setting.before, setting.after) for setting in plan.knob.runtime_changes]
    if plan.knob.dropin_changed:
        changes.append(("write " if plan.knob.dropin_after is not None else "remove ") + DROPIN_PATH)
    what = "%sset %s" % (would, "; ".join(changes)) if changes else "governor already as wanted"
    if rolled_back:
        what = "rolled back, slower by the A/B gate: %s (recorded in %s: the same change is not tried again)" % (
            "; ".join("%s %s" % (unit, verdict["msg"]) for unit, verdict in sorted((verdicts or {}).items())
                      if not verdict["kept"]), REJECTED_PATH)
    return {"changed": plan.changed, "supported": plan.supported, "governor": plan.governor,
            "policies": _policies(plan.knob.settings, {policy.name: policy.cpus for policy in plan.policies}),
            "dropin": DROPIN_PATH, "reasons": plan.knob.reasons, "ab_gate": verdicts or {}, "rolled_back": rolled_back,
            "msg": "%s (%s)" % (what, plan.knob.reasons[-1]) if plan.knob.reasons else what}


def restore_result(plan: knobs.RestorePlan, check_mode: bool) -> Dict[str, Any]:
    """The module's return values for governor=original: the keys ``result`` returns."""
    return {"changed": plan.changed, "supported": True, "governor": ORIGINAL, "policies": _policies(
        plan.knob.settings, {}), "dropin": DROPIN_PATH, "reasons": plan.knob.reasons, "ab_gate": {},
        "rolled_back": False, "msg": knobs.restore_summary(plan, check_mode)}


def _policies(settings: Tuple[knobs.Setting, ...], cpus: Dict[str, Tuple[int, ...]]) -> Dict[str, Dict[str, Any]]:
    return {setting.name: {"cpus": format_cpulist(cpus.get(setting.name, ())), "before": setting.before,
                           "after": setting.before if setting.after is None else setting.after}
            for setting in settings}
