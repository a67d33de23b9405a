"""Automatic NUMA balancing: desired value, boot-time conflicts, and the plan of changes.

The kernel's automatic NUMA balancing unmaps pages to sample accesses and migrates
them. On a service whose CPUs and memory are bound on purpose it only adds hinting
faults and moves pages away from where they were bound, so the kernel documentation
says to disable it for workloads that are already NUMA-bound.

This module decides; act/knobs applies. It reads ``<root>/proc/sys``, the sysctl
configuration and tuned's profiles under ``<root>`` (read/boot_config) and returns a
``BalancingPlan``: a ``knobs.KnobPlan`` (the runtime writes and the content of the one
drop-in file the collection owns, ``/etc/sysctl.d/60-inferops-numa.conf``), the
settings elsewhere that would undo it at boot, and what an active tuned profile does
to it. The Ansible module turns ``NumaError`` into ``fail_json``.

It runs as root on whatever tree ``root`` names, so nothing under ``root`` is reached
through a symlink it did not resolve itself (system/root_files reaches them all), and no
error quotes a file's content.
"""

import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import knobs
from ..base.errors import NumaError
from ..base.cpulist import format_cpulist
from ..read.boot_config import MASK_TARGET, boot_settings, find_conflicts, read_tuned, same_value
from ..read.kernel_files import read_vmstat
from ..read.topology import memory_tiers
from ..system.root_files import host_path, is_dir

BALANCING_KEY = "kernel.numa_balancing"
ZONE_RECLAIM_KEY = "vm.zone_reclaim_mode"
STATE_VALUES = {"disabled": 0, "enabled": 1, "tiering": 2}
# Not a value (a choice of the module, not of make_plan): what stood before the collection's first change, from
# knobs' originals record.
ORIGINAL = "original"
STATES = tuple(STATE_VALUES) + ("raw", "auto")

DROPIN_PATH = "/etc/sysctl.d/60-inferops-numa.conf"
KNOB = knobs.Knob("numa_balancing", "/proc/sys/", DROPIN_PATH,
                  "something rewrites it, see the tuned and conflicts results")
VMSTAT_COUNTERS = ("numa_pte_updates", "numa_hint_faults")


class BalancingRequest(NamedTuple):
    """What the caller asked for (the module's options)."""

    state: str = "disabled"
    value: Optional[int] = None
    persist: bool = True
    zone_reclaim_mode: Optional[int] = None
    on_conflict: str = "fail"
    force: bool = False  # replace (or remove) a drop-in that was masked on purpose


class StateChoice(NamedTuple):
    """The state written for the one requested (``auto`` decided on this host), and what to say about it."""

    state: str  # disabled, enabled, tiering or raw
    notes: List[str]
    warnings: List[str]


class BalancingPlan(NamedTuple):
    """Everything the module needs to act and report; built by ``make_plan``."""

    knob: knobs.KnobPlan  # the runtime writes and the drop-in, applied by knobs.apply
    supported: bool
    desired: Dict[str, int]  # sysctl name -> value, in drop-in order
    before: Dict[str, int]  # runtime values read now
    dropin_masked: bool  # masked on purpose and left alone (force is false)
    conflicts: List[Dict[str, object]]
    tuned: Optional[Dict[str, object]]
    error: Optional[str]  # set when on_conflict=fail and the boot config would undo us
    state: str  # what is written: the requested state, or what auto chose on this host

    @property
    def root(self) -> str:
        return self.knob.root

    @property
    def after(self) -> Dict[str, int]:
        merged = dict(self.before)
        merged.update(self.desired)
        return merged

    @property
    def runtime_changes(self) -> List[Tuple[str, int]]:
        return [(setting.name, self.desired[setting.name]) for setting in self.knob.runtime_changes]

    @property
    def dropin_after(self) -> Optional[str]:
        """The wanted drop-in content, None when it must not exist (or stays masked)."""
        return self.knob.dropin_after

    @property
    def dropin_flaw(self) -> Optional[str]:
        return self.knob.dropin_flaw

    @property
    def dropin_changed(self) -> bool:
        return self.knob.dropin_changed

    @property
    def changed(self) -> bool:
        return self.knob.changed

    @property
    def dropin_file(self) -> str:
        return self.knob.dropin_file

    @property
    def notes(self) -> List[str]:
        """Informational, folded into msg."""
        return self.knob.reasons

    @property
    def warnings(self) -> List[str]:
        return self.knob.warnings


# ---------------------------------------------------------------- paths and keys


def knob_file(key: str) -> str:
    """Path of a sysctl's /proc/sys file on the target, e.g. /proc/sys/kernel/numa_balancing."""
    return "/proc/sys/" + key.replace(".", "/")


def knob_path(root: str, key: str) -> str:
    return host_path(root, knob_file(key))


def choose_state(requested: str, tiers: List[Dict[str, Any]]) -> StateChoice:
    """What ``requested`` writes on a host with memory ``tiers`` (fastest first, as topology.memory_tiers).

    A host whose nodes sit in more than one tier (CXL, PMEM or HBM beside DRAM) gets ``tiering`` for ``auto``:
    mode 2 keeps promoting hot pages from the slower tiers without balancing pages across sockets, which
    ``disabled`` would stop too. Any other host gets ``disabled``, what NUMA-bound services want. Memory tiers
    came in Linux 6.1, after mode 2 (5.18), so a kernel that shows them has the mode. ``disabled`` asked for on a
    tiered host is written, with a warning that promotion stops."""
    holding = [tier for tier in tiers if tier["nodes"]]  # an empty tier (a captured tree's) ranks no node
    slower = sorted(node for tier in holding[1:] for node in tier["nodes"])
    if requested == "auto" and slower:
        return StateChoice("tiering", ["state auto: memory tiers, node(s) %s slower: tiering (mode 2) promotes their "
                                       "hot pages without balancing across sockets" % format_cpulist(slower)], [])
    if requested == "auto":
        return StateChoice("disabled", ["state auto: no slower memory tier, so disabled"], [])
    if requested == "disabled" and slower:
        return StateChoice("disabled", [], [
            "%s = 0 on a host with memory tiers also stops promoting hot pages from the slower node(s) %s: state "
            "tiering (or auto) keeps that without balancing across sockets" % (BALANCING_KEY, format_cpulist(slower))])
    return StateChoice(requested, [], [])


def desired_value(state: str, value: Optional[int]) -> int:
    if state == "raw":
        if value is None:
            raise NumaError("state=raw needs value: set value to the integer to write to %s" % BALANCING_KEY)
        if value < 0:
            raise NumaError("value must be >= 0 (got %d): %s is a bit mask" % (value, BALANCING_KEY))
        return value
    if value is not None:
        raise NumaError("value is only used with state=raw: drop value, or set state=raw")
    if state not in STATE_VALUES:
        raise NumaError("unknown state %r: use one of %s" % (state, ", ".join(STATES)))
    return STATE_VALUES[state]


def render_dropin(desired: Dict[str, int], state: str) -> str:
    lines = [
        "# Managed by Ansible: inferops.numa numa_balancing module. Local edits are overwritten;",
        "# change the module's options instead. See the collection's docs/numa_balancing.md.",
        "# Automatic NUMA balancing unmaps pages to sample accesses and migrates them: on",
        "# inference services whose CPUs and memory are bound on purpose it adds fault stalls",
        "# and moves bound pages, so the kernel docs advise disabling it for NUMA-bound work.",
        "# Requested state: %s." % state,
    ]
    lines.extend("%s = %d" % (key, value) for key, value in desired.items())
    return "\n".join(lines) + "\n"


def describe_mask(dropin: str) -> str:
    return ("%s is masked (a symlink to %s), so systemd-sysctl skips that name at boot and this value is not "
            "persisted; left alone on purpose: remove the mask, or set force: true to replace it (with "
            "persist: false, to remove it)" % (dropin, MASK_TARGET))


def _where(conflict: Dict[str, object]) -> str:
    return "%s = %s in %s (line %s)" % (conflict["key"], conflict["value"], conflict["file"], conflict["line"])


def describe_conflict(conflict: Dict[str, object], dropin: str, accepted: bool) -> str:
    tail = "Accepted because on_conflict=warn." if accepted else "Or set on_conflict=warn to accept it."
    return ("%s is applied after %s at boot and wins, so the setting comes back after a reboot. Fix: %s. %s"
            % (_where(conflict), dropin, conflict["fix"], tail))


def _describe_harmless(conflict: Dict[str, object], dropin: str) -> str:
    if conflict["applied_after_ours"]:
        return "%s is applied after %s but a later file sets the wanted value again" % (_where(conflict), dropin)
    return "%s is applied before %s, which overrides it" % (_where(conflict), dropin)


def describe_tuned(tuned: Dict[str, object], setting: Dict[str, str], ours_persisted: bool) -> str:
    head = ("tuned profile '%s' sets %s = %s in %s; tuned writes it when it starts (after systemd-sysctl) "
            "and on every profile switch. " % (setting["profile"], setting["key"], setting["value"], setting["file"]))
    if tuned["reapply_sysctl"] and ours_persisted:
        effect = ("With reapply_sysctl on it then re-applies /etc/sysctl.d, so this module's value returns, "
                  "but the knob flips in between. ")
    else:
        effect = "Its value stays in force until this module runs again. "
    return head + effect + ("Fix: remove the line from the profile, or activate a custom profile that includes "
                            "'%s' and sets %s to the wanted value." % (setting["profile"], setting["key"]))


# ---------------------------------------------------------------- runtime knobs


def read_runtime(root: str, key: str) -> Optional[int]:
    """Current value of a /proc/sys knob; None when this kernel does not have it."""
    text = knobs.read_value(root, key, knob_file(key))
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise NumaError("%s does not hold an integer (expected one such as 0 or 1): is %s the procfs of a "
                        "Linux host?" % (knob_path(root, key), root)) from None


def _settings(desired: Dict[str, int], before: Dict[str, int]) -> Tuple[knobs.Setting, ...]:
    return tuple(knobs.Setting(key, knob_file(key), None if key not in before else str(before[key]), str(value),
                               " (tiering mode needs Linux >= 5.18)" if key == BALANCING_KEY and value >= 2 else "")
                 for key, value in desired.items())


# ---------------------------------------------------------------- /proc/vmstat


def balancing_counters(root: str) -> Dict[str, Optional[int]]:
    """VMSTAT_COUNTERS from /proc/vmstat; None for a counter the kernel lacks (or an unreadable file)."""
    counters = read_vmstat(root)
    return {name: counters.get(name) for name in VMSTAT_COUNTERS}


def sample_vmstat(root: str, seconds: float,
                  sleep: Callable[[float], None] = time.sleep) -> Dict[str, Optional[float]]:
    """Growth of the balancing counters over ``seconds``; None for a counter the kernel lacks.

    With balancing off the scanner stops, so both must stay flat.
    """
    first = balancing_counters(root)
    sleep(seconds)
    second = balancing_counters(root)
    delta = {"seconds": seconds}  # type: Dict[str, Optional[float]]
    for name in VMSTAT_COUNTERS:
        start, end = first[name], second[name]
        delta[name] = None if start is None or end is None else end - start
    return delta


def verify(plan: BalancingPlan, seconds: float, check_mode: bool,
           sleep: Callable[[float], None] = time.sleep) -> Tuple[Dict[str, Optional[float]], Optional[str]]:
    """Sample the counters after acting; a warning when they move although balancing is off."""
    if seconds <= 0:
        raise NumaError("verify_seconds must be > 0 (got %s): drop it to skip the check" % seconds)
    delta = sample_vmstat(plan.root, seconds, sleep)
    # In check mode nothing was written, so only an already-disabled knob must be flat.
    now = plan.before[BALANCING_KEY] if check_mode else plan.after[BALANCING_KEY]
    return delta, vmstat_warning(delta) if now == 0 else None


def vmstat_warning(delta: Dict[str, Optional[float]]) -> Optional[str]:
    moving = ["%s +%d" % (name, delta[name]) for name in VMSTAT_COUNTERS if delta[name]]
    missing = [name for name in VMSTAT_COUNTERS if delta[name] is None]
    if moving:
        return ("NUMA balancing is still scanning after it was disabled (%s in %ss): something re-enabled it; "
                "see conflicts and tuned" % (", ".join(moving), delta["seconds"]))
    if missing:
        return "/proc/vmstat has no %s: the balancing counters could not be checked" % ", ".join(missing)
    return None


# ---------------------------------------------------------------- plan


def _unsupported(root: str, desired: Dict[str, int], state: str) -> BalancingPlan:
    if not is_dir(root, "/proc/sys/kernel"):
        why = "%s does not exist (is procfs mounted under root?)" % host_path(root, "/proc/sys/kernel")
    else:
        why = ("this kernel has no %s (built without CONFIG_NUMA_BALANCING, or a non-NUMA VM kernel)"
               % knob_path(root, BALANCING_KEY))
    note = "NUMA balancing is not supported: %s; nothing to disable, nothing written" % why
    return BalancingPlan(knobs.KnobPlan(KNOB, root, (), None, None, None, [note], []), False, desired, {}, False, [],
                         None, None, state)


def _read_before(root: str, desired: Dict[str, int]) -> Dict[str, int]:
    before = {}  # type: Dict[str, int]
    for key in (BALANCING_KEY, ZONE_RECLAIM_KEY):
        value = read_runtime(root, key)
        if value is not None:
            before[key] = value
        elif key in desired:
            raise NumaError("zone_reclaim_mode was requested but %s does not exist on this kernel: "
                            "drop the option" % knob_path(root, key))
    return before


def _boot_review(root: str, request: BalancingRequest, desired: Dict[str, int], at_boot: Optional[str],
                 unpersisted: Optional[str], notes: List[str],
                 warnings: List[str]) -> Tuple[List[Dict[str, object]], Optional[str]]:
    """Conflicts with what boot applies under our name (``at_boot``; None: nothing there).

    ``unpersisted`` says why our value is not persisted; conflicts then only warn.
    """
    settings, position = boot_settings(root, list(desired), DROPIN_PATH, at_boot, warnings)
    conflicts = find_conflicts(root, settings, position, desired)
    ours = host_path(root, DROPIN_PATH)
    losing = [c for c in conflicts if c["wins_at_boot"]]
    notes.extend(_describe_harmless(c, ours) for c in conflicts if not c["wins_at_boot"])
    if unpersisted is not None:
        warnings.extend("%s: %s sets it at boot" % (unpersisted, _where(c)) for c in losing)
        return conflicts, None
    if request.on_conflict == "warn":
        warnings.extend(describe_conflict(c, ours, True) for c in losing)
        return conflicts, None
    error = " ".join(describe_conflict(c, ours, False) for c in losing) or None
    return conflicts, error


def _tuned_review(root: str, desired: Dict[str, int], persisted: bool,
                  warnings: List[str]) -> Optional[Dict[str, object]]:
    tuned = read_tuned(root, list(desired), warnings)
    if tuned is None:
        return None
    for setting in tuned["settings"]:  # type: ignore[attr-defined]
        if not same_value(setting["value"], desired[setting["key"]]):
            warnings.append(describe_tuned(tuned, setting, persisted))
    return tuned


def make_plan(root: str, request: BalancingRequest) -> BalancingPlan:
    """Read the host under ``root`` and decide what to change; writes nothing."""
    if request.on_conflict not in ("fail", "warn"):
        raise NumaError("on_conflict must be fail or warn, not %r" % request.on_conflict)
    if request.zone_reclaim_mode is not None and request.zone_reclaim_mode < 0:
        raise NumaError("zone_reclaim_mode must be >= 0 (a bit mask: 1 reclaim, 2 write dirty pages, 4 swap)")
    choice = choose_state(request.state, memory_tiers(root) if request.state in ("auto", "disabled") else [])
    desired = {BALANCING_KEY: desired_value(choice.state, request.value)}
    if request.zone_reclaim_mode is not None:
        desired[ZONE_RECLAIM_KEY] = request.zone_reclaim_mode
    if read_runtime(root, BALANCING_KEY) is None:
        return _unsupported(root, desired, choice.state)
    before = _read_before(root, desired)
    found = knobs.inspect_dropin(root, DROPIN_PATH)
    keep_mask = found.masked and not request.force
    dropin_after = render_dropin(desired, choice.state) if request.persist and not keep_mask else None
    notes = list(choice.notes)
    warnings = choice.warnings + ([describe_mask(host_path(root, DROPIN_PATH))] if keep_mask else [])
    unpersisted = "persist is false" if not request.persist else "the drop-in is masked" if keep_mask else None
    # A mask left in place still hides same-named files at boot, and sets nothing itself.
    at_boot = "" if keep_mask else dropin_after
    conflicts, error = _boot_review(root, request, desired, at_boot, unpersisted, notes, warnings)
    tuned = _tuned_review(root, desired, dropin_after is not None, warnings)
    knob = knobs.KnobPlan(KNOB, root, _settings(desired, before), found.content, dropin_after,
                          None if keep_mask else knobs.rewrite_reason(found), notes, warnings)
    return BalancingPlan(knob, True, desired, before, keep_mask, conflicts, tuned, error, choice.state)


# ---------------------------------------------------------------- reporting


def summary(plan: BalancingPlan, check_mode: bool) -> str:
    if not plan.supported:
        return "; ".join(plan.notes)
    parts = ["%s %s %d -> %d" % ("would set" if check_mode else "set", key, plan.before[key], value)
             for key, value in plan.runtime_changes]
    if not plan.runtime_changes:
        parts.append("runtime already %s" % ", ".join("%s = %d" % item for item in plan.desired.items()))
    if plan.dropin_changed:
        parts.append(_dropin_action(plan, check_mode))
    elif plan.dropin_masked:
        parts.append("%s is masked, left alone" % plan.dropin_file)
    elif plan.dropin_after is not None:
        parts.append("%s up to date" % plan.dropin_file)
    return "; ".join(parts + plan.notes)


def _dropin_action(plan: BalancingPlan, check_mode: bool) -> str:
    if plan.dropin_after is None:
        verbs = ("would remove", "removed")
    elif plan.dropin_flaw is not None:
        verbs = ("would replace", "replaced")
    else:
        verbs = ("would write", "wrote")
    action = "%s %s" % (verbs[0] if check_mode else verbs[1], plan.dropin_file)
    if plan.dropin_flaw is None:
        return action
    return "%s (it %s %s)" % (action, "is" if check_mode else "was", plan.dropin_flaw)


def result(plan: BalancingPlan, check_mode: bool) -> Dict[str, object]:
    """The module's return values (without diff and vmstat_delta)."""
    return {
        "changed": plan.changed,
        "supported": plan.supported,
        "state": plan.state,
        "before": plan.before,
        "after": plan.after if plan.supported else {},
        "persisted_file": plan.dropin_file if plan.dropin_after is not None else None,
        "dropin_masked": plan.dropin_masked,
        "conflicts": plan.conflicts,
        "tuned": plan.tuned,
        "msg": summary(plan, check_mode),
    }


def restore_conflict(request: BalancingRequest) -> Optional[str]:
    """Why ``request`` cannot put the originals back as asked (state=original sets what was recorded, nothing else)."""
    given = [name for name, value in (("value", request.value), ("zone_reclaim_mode", request.zone_reclaim_mode))
             if value is not None]
    if given:
        return ("%s not used with state=original, which puts back the values recorded before the first change: drop "
                "%s" % (" and ".join(given) + (" are" if len(given) > 1 else " is"), " and ".join(given)))
    return None


def _number(text: Optional[str]) -> object:
    """A sysctl's text as the integer it holds (a record's text that is no integer is shown as it is)."""
    try:
        return int(text or "")
    except ValueError:
        return text


def restore_result(plan: knobs.RestorePlan, check_mode: bool) -> Dict[str, object]:
    """The module's return values for state=original: the keys ``result`` returns."""
    before = {s.name: _number(s.before) for s in plan.knob.settings if s.before is not None}
    after = dict(before, **{s.name: _number(s.after) for s in plan.knob.settings if s.after is not None})
    kind = plan.dropin.kind if plan.dropin is not None else None
    return {
        "changed": plan.changed, "supported": True, "state": ORIGINAL, "before": before, "after": after,
        "persisted_file": plan.knob.dropin_file if kind == knobs.FILE else None,
        "dropin_masked": kind == knobs.MASK, "conflicts": [], "tuned": None,
        "msg": knobs.restore_summary(plan, check_mode),
    }


def diff(plan: BalancingPlan) -> List[Dict[str, str]]:
    """Ansible diff entries: the drop-in file, then the runtime knobs."""
    return knobs.diff(plan.knob)
