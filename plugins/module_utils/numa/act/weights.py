"""Set the kernel's weighted-interleave weights from what each memory node delivers, and keep them across reboots.

decide/weights.py chooses the weights (numa_cost's recorded bandwidth, else HMAT's, else the kernel's ``auto``); this
module reads what the kernel has now and the one file the collection owns for them, a systemd-tmpfiles drop-in
(``/etc/tmpfiles.d/60-inferops-numa-weights.conf``: ``w`` lines that systemd-tmpfiles-setup writes to sysfs at boot,
before any service starts), and returns a ``WeightsPlan``; ``apply`` then changes only what differs.

Files under ``root`` are reached through system/root_files, as balancing.py reaches them: never through a symlink,
the drop-in's directories writable by root only, the drop-in trusted by the same rule as balancing's.
"""

import errno
import os
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import cost
from ..base.errors import NumaError
from ..decide import weights as choice
from ..read import topology
from ..system import root_files, safe_fs
from ..system.root_files import BECOME_FIX, DROPIN_MODE, TEMPORARY_PREFIX, Refused, host_path, refusal, write_error

SOURCES = ("auto",) + choice.SOURCES
RECORD_DIR = cost.RECORD_DIR
WEIGHTS_DIR = "/sys/kernel/mm/mempolicy/weighted_interleave"
DROPIN_DIR = "/etc/tmpfiles.d"
DROPIN_NAME = "60-inferops-numa-weights.conf"
DROPIN_PATH = DROPIN_DIR + "/" + DROPIN_NAME
_MAX_FILE_BYTES = 1 << 16


class WeightsPlan(NamedTuple):
    root: str
    supported: bool
    source: Optional[str]             # measured, hmat or kernel; None: nothing to weigh by
    bandwidth: Dict[int, float]       # per memory node, in the source's unit
    before: Dict[int, int]            # the kernel's weights now
    desired: Dict[int, int]           # what they become (empty when the kernel computes them)
    auto_before: Optional[bool]       # the kernel's auto mode now (None: this kernel has none)
    auto_after: Optional[bool]
    dropin_before: Optional[str]
    dropin_after: Optional[str]
    reasons: List[str]
    warnings: Tuple[str, ...] = ()    # a numa_cost record there but unusable: said, and the next source taken

    @property
    def runtime_changes(self) -> Dict[int, int]:
        return {node: weight for node, weight in self.desired.items() if self.before.get(node) != weight}

    @property
    def auto_changed(self) -> bool:
        return self.auto_after is not None and self.auto_after != self.auto_before

    @property
    def dropin_changed(self) -> bool:
        return self.dropin_before != self.dropin_after

    @property
    def changed(self) -> bool:
        return bool(self.runtime_changes) or self.auto_changed or self.dropin_changed


def make_plan(root: str, source: str = "auto", persist: bool = True, record_dir: str = RECORD_DIR,
              read_record: Callable[[str], Optional[Dict[str, Any]]] = cost.read_record) -> WeightsPlan:
    """What to write for ``source`` (SOURCES) on the host under ``root``; NumaError when ``source`` cannot be had."""
    if source not in SOURCES:
        raise NumaError("unknown weights source %r: choose one of %s" % (source, ", ".join(SOURCES)))
    facts = topology.read(root)
    features = (facts.get("kernel") or {}).get("features") or {}
    before = {int(node): weight for node, weight in ((facts["kernel"].get("weighted_interleave")) or {}).items()}
    auto_before = features.get("weighted_interleave_auto")
    dropin_before = read_dropin(root)
    base = dict(root=root, supported=False, source=None, bandwidth={}, before=before, desired={},
                auto_before=auto_before, auto_after=None, dropin_before=dropin_before, dropin_after=dropin_before)
    if not features.get("weighted_interleave"):
        return WeightsPlan(reasons=["the kernel (%s) has no weighted interleave (Linux 6.9+): interleaved instances "
                                    "get plain interleave, equal pages on each node" % (features.get("release")
                                                                                        or "release unknown")], **base)
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
        return WeightsPlan(reasons=reasons + ["weights left as they are"], **base)
    desired = choice.weights_from_bandwidth(found.by_node)
    base.update(source=found.source, bandwidth=found.by_node, desired=desired,
                auto_after=False if auto_before is not None else None,
                dropin_after=dropin_text(found.source, desired, None) if persist else None)
    return WeightsPlan(reasons=reasons + [_weights_reason(found, desired)], **base)


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
    return WeightsPlan(reasons=reasons + ["the kernel computes the weights from HMAT (weighted_interleave/auto)"], **base)


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


# ----------------------------------------------------------------- the drop-in


def read_dropin(root: str) -> Optional[str]:
    """The drop-in's text, None when there is none; refused when it or its directories are not root's alone."""
    path = host_path(root, DROPIN_PATH)
    try:
        directory = root_files.open_dir(root, DROPIN_DIR, root_only=True)
    except FileNotFoundError:
        return None
    except Refused as exc:
        raise refusal(exc, "use " + path) from None
    try:
        handle = root_files.open_in(directory, DROPIN_NAME, os.O_RDONLY, path)
    except FileNotFoundError:
        return None
    except Refused as exc:
        raise NumaError("refusing to use %s: %s; remove it, numa_weights writes the file there"
                        % (path, exc.found)) from None
    except OSError as exc:
        raise NumaError("cannot read %s (%s)" % (path, exc.strerror)) from None
    finally:
        os.close(directory)
    try:
        # Judged through the descriptor read: what was judged is what is used.
        distrust = root_files.dropin_distrust(os.fstat(handle))
        if distrust:
            raise NumaError("refusing to use %s: %s (a drop-in is trusted when root alone may write it); remove it, "
                            "numa_weights writes the file there" % (path, distrust))
        return root_files.read_handle(handle, _MAX_FILE_BYTES, path)
    except Refused as exc:
        raise NumaError("refusing to use %s: %s; remove it" % (path, exc.found)) from None
    finally:
        os.close(handle)


def _write_dropin(plan: WeightsPlan) -> None:
    path = host_path(plan.root, DROPIN_PATH)
    try:
        directory = root_files.open_dir(plan.root, DROPIN_DIR, create=plan.dropin_after is not None, root_only=True)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        if plan.dropin_after is None:
            safe_fs.remove_quietly(directory, DROPIN_NAME)
            os.fsync(directory)
        else:
            safe_fs.write_atomically(directory, DROPIN_NAME, plan.dropin_after.encode("utf-8"), DROPIN_MODE,
                                     TEMPORARY_PREFIX)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        os.close(directory)


# ----------------------------------------------------------------- the kernel


def _write_knob(root: str, name: str, text: str) -> None:
    path = host_path(root, "%s/%s" % (WEIGHTS_DIR, name))
    try:
        root_files.write_under(root, "%s/%s" % (WEIGHTS_DIR, name), text.encode("ascii") + b"\n")
    except Refused as exc:
        raise refusal(exc, "write " + path) from None
    except OSError as exc:
        fix = BECOME_FIX if exc.errno in (errno.EACCES, errno.EPERM) else "check the kernel's weighted interleave"
        raise NumaError("cannot write %s to %s (%s): %s" % (text, path, exc.strerror or exc, fix)) from None


def apply(plan: WeightsPlan) -> None:
    """Make the kernel and the drop-in match the plan, then check that the kernel holds the weights."""
    if plan.auto_changed:
        _write_knob(plan.root, "auto", "true" if plan.auto_after else "false")
    for node, weight in sorted(plan.runtime_changes.items()):
        _write_knob(plan.root, "node%d" % node, str(weight))
    if plan.dropin_changed:
        _write_dropin(plan)
    now = topology.read(plan.root)["kernel"].get("weighted_interleave") or {}
    wrong = {node: now.get(str(node)) for node, weight in plan.desired.items() if now.get(str(node)) != weight}
    if wrong:
        raise NumaError("wrote the weights but the kernel reports %s: something else writes %s"
                        % (", ".join("node%d=%s" % item for item in sorted(wrong.items())), WEIGHTS_DIR))


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


def diff(plan: WeightsPlan) -> List[Dict[str, str]]:
    """Ansible diff entries: the drop-in, then the kernel's weights."""
    runtime = host_path(plan.root, WEIGHTS_DIR) + " (runtime)"
    shown_before = "".join("node%d = %d\n" % item for item in sorted(plan.before.items()))
    after = dict(plan.before)
    after.update(plan.desired)
    return [
        {"before_header": DROPIN_PATH, "after_header": DROPIN_PATH,
         "before": plan.dropin_before or "", "after": plan.dropin_after or ""},
        {"before_header": runtime, "after_header": runtime, "before": shown_before,
         "after": "".join("node%d = %d\n" % item for item in sorted(after.items()))},
    ]
