"""A persisted kernel knob: runtime files under /proc or /sys, and the one drop-in that sets them again at boot.

The NUMA balancing sysctl (act/balancing, a sysctl.d drop-in) and the weighted-interleave weights
(act/interleave_weights, a tmpfiles.d drop-in) are knobs on this shape. Each decides what to write by its own rules
and returns a ``KnobPlan``; this module is the one way a knob's drop-in is read and judged, its plan applied and
verified, and shown in diff mode. A new knob is one module that builds a ``KnobPlan``.

Before a knob's first change, ``apply`` records what was there (``record_originals``): each runtime value the plan
sets and what stood at the drop-in's path, in ``ORIGINALS_DIR/<owner>.json`` under root. A value is recorded once:
a later run adds the settings it newly manages and never overwrites one, so the record keeps the host's own values
and not the collection's. ``plan_restore`` and ``restore`` put them back and delete the record. Removing a drop-in
alone (``dropin_after`` None) leaves the running kernel as it is and the host's other boot files decide the value at
the next boot.

Files under ``root`` are reached through system/root_files: never through a symlink, the drop-in's directories
writable by root only, the drop-in judged by ``root_files.dropin_distrust`` and written atomically, and no error
quotes a file's content.
"""

import errno
import json
import os
import posixpath
import stat
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..base.errors import NumaError
from ..read.boot_config import MASK_TARGET  # systemd's one way to disable a drop-in's name, tmpfiles.d's too
from ..system import safe_fs
from ..system.root_files import (BECOME_FIX, DROPIN_MODE, MAX_TEXT_BYTES, TEMPORARY_PREFIX, Refused, dropin_distrust,
                                 host_path, open_dir, open_in, put_link, read_handle, read_under, refusal, remove,
                                 resolve, write_error, write_under)

_MAX_VALUE_BYTES = 4096
# Where the originals of every knob are kept, one record per knob named by its owner; root's alone (ORIGINALS_DIR).
ORIGINALS_DIR = "/var/lib/inferops-numa/originals"
ORIGINALS_FORMAT = 1
ORIGINALS_MODE = 0o600
# What stood at the drop-in's path before the first change.
ABSENT, FILE, MASK = "absent", "file", "mask"


class Knob(NamedTuple):
    """Where a knob lives and who owns it."""

    owner: str  # the module that writes it, named when its drop-in is refused
    runtime_dir: str  # root-relative directory of its runtime files, the diff's runtime header
    dropin_path: str  # root-relative path of the one drop-in the collection keeps for it
    rewritten_by: str  # where to look when a written value does not stick


class Setting(NamedTuple):
    """One runtime file, as the text the kernel shows and takes."""

    name: str  # as shown, e.g. kernel.numa_balancing or node0
    path: str  # root-relative, under /proc or /sys
    before: Optional[str]  # None: the file is absent now
    after: Optional[str]  # None: left as it is
    rejected_hint: str = ""  # added when the kernel rejects the value, e.g. the kernel release it needs

    @property
    def changed(self) -> bool:
        return self.after is not None and self.after != self.before


class Dropin(NamedTuple):
    """What sits at a drop-in's path now."""

    content: Optional[str]  # None when absent, or not a regular file to read
    distrust: Optional[str]  # why boot must not apply it as it is (dropin_distrust, or where a link points)
    masked: bool  # a symlink to /dev/null: systemd skips the name on purpose
    mode: Optional[int]  # permission bits of a regular file


class KnobPlan(NamedTuple):
    """What every persisted knob plans: its runtime settings, its drop-in before and after, and why."""

    knob: Knob
    root: str
    settings: Tuple[Setting, ...]
    dropin_before: Optional[str]
    dropin_after: Optional[str]  # None: there must be none
    dropin_flaw: Optional[str]  # why the drop-in is rewritten (or removed) even with the right text
    reasons: List[str]
    warnings: List[str]

    @property
    def runtime_changes(self) -> List[Setting]:
        return [setting for setting in self.settings if setting.changed]

    @property
    def dropin_changed(self) -> bool:
        return self.dropin_before != self.dropin_after or self.dropin_flaw is not None

    @property
    def changed(self) -> bool:
        return bool(self.runtime_changes) or self.dropin_changed

    @property
    def dropin_file(self) -> str:
        return host_path(self.root, self.knob.dropin_path)


# ---------------------------------------------------------------- the drop-in


def _inspect_entry(root: str, path: str, directory: int) -> Dropin:
    name, shown = posixpath.basename(path), host_path(root, path)
    try:
        info = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return Dropin(None, None, False, None)
    if stat.S_ISLNK(info.st_mode):
        if resolve(root, path) == MASK_TARGET:
            return Dropin(None, "a mask: a symlink to " + MASK_TARGET, True, None)
        # Not read through: what it points to is not ours to show in a diff.
        return Dropin(None, "a symlink to %r" % os.readlink(name, dir_fd=directory), False, None)
    if not stat.S_ISREG(info.st_mode):
        raise Refused(shown, "not a regular file", "move it away; the drop-in goes there")
    handle = open_in(directory, name, os.O_RDONLY, shown)
    try:
        # Judged through the descriptor read: what was judged is what is used.
        judged = os.fstat(handle)
        return Dropin(read_handle(handle, MAX_TEXT_BYTES, shown), dropin_distrust(judged), False,
                      stat.S_IMODE(judged.st_mode))
    finally:
        os.close(handle)


def inspect_dropin(root: str, path: str) -> Dropin:
    """What sits at the drop-in ``path`` (root-relative); its directories must be real ones only root may write."""
    shown = host_path(root, path)
    directory = None
    try:
        directory = open_dir(root, posixpath.dirname(path), root_only=True)
        return _inspect_entry(root, path, directory)
    except FileNotFoundError:
        return Dropin(None, None, False, None)
    except Refused as exc:
        raise refusal(exc, "use " + shown) from None
    except OSError as exc:
        fix = ": " + BECOME_FIX if exc.errno in (errno.EACCES, errno.EPERM) else ""
        raise NumaError("cannot read %s (%s)%s" % (shown, exc.strerror or exc, fix)) from None
    finally:
        if directory is not None:
            os.close(directory)


def rewrite_reason(found: Dropin) -> Optional[str]:
    """Why a drop-in must be rewritten even with the right text: not trusted, or not the mode a write gives."""
    if found.distrust is not None or found.mode is None:
        return found.distrust
    return None if found.mode == DROPIN_MODE else "mode %04o, not %04o" % (found.mode, DROPIN_MODE)


def read_trusted(root: str, knob: Knob) -> Optional[str]:
    """The drop-in's text, None when there is none; refused when boot must not apply it as it is."""
    found = inspect_dropin(root, knob.dropin_path)
    if found.distrust is not None:
        raise NumaError("refusing to use %s: %s (a drop-in is trusted when root alone may write it); remove it, %s "
                        "writes the file there" % (host_path(root, knob.dropin_path), found.distrust, knob.owner))
    return found.content


def write_dropin(plan: KnobPlan) -> None:
    """Replace or remove the drop-in atomically: a half-written one would apply at boot."""
    put_file(plan.root, plan.knob.dropin_path, FILE if plan.dropin_after is not None else ABSENT, plan.dropin_after,
             DROPIN_MODE)


def put_file(root: str, dropin_path: str, kind: str, text: Optional[str], mode: int) -> None:
    """The root-relative ``dropin_path`` made to hold ``kind``: the file ``text`` with ``mode``, nothing, or a mask;
    in directories only root may write, made if missing, replaced atomically."""
    path, name = host_path(root, dropin_path), posixpath.basename(dropin_path)
    try:
        directory = open_dir(root, posixpath.dirname(dropin_path), create=kind != ABSENT, root_only=True)
    except OSError as exc:
        if kind == ABSENT and isinstance(exc, FileNotFoundError):  # no directory, no drop-in: nothing to remove
            return
        raise write_error(path, exc) from None
    try:
        if kind == ABSENT:
            _remove_quietly(directory, name)
            os.fsync(directory)  # the removal must survive a crash, or boot applies the old file
        elif kind == MASK:
            put_link(directory, name, MASK_TARGET, TEMPORARY_PREFIX)
        else:
            safe_fs.write_atomically(directory, name, (text or "").encode("utf-8"), mode, TEMPORARY_PREFIX)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        os.close(directory)


def read_rejected(root: str, path: str, owner: str, is_valid: Callable[[Dict[str, Any]], bool]
                  ) -> Optional[Dict[str, Any]]:
    """The A/B gate's record of a change it rolled back, kept by ``owner`` at the root-relative ``path``; None when
    there is none; refused, naming the fix, when root alone could not have written it or it is not one ``owner``
    writes (``is_valid`` may raise on a wrong shape)."""
    found = inspect_dropin(root, path)
    if found.distrust is not None:
        raise NumaError("refusing to use %s: %s; remove it (the next run measures the change again)"
                        % (host_path(root, path), found.distrust))
    if found.content is None:
        return None
    try:
        record = json.loads(found.content)
        valid = isinstance(record, dict) and is_valid(record)
    except (ValueError, KeyError, TypeError, AttributeError, NumaError):
        valid = False
    if not valid:
        raise NumaError("%s is not the A/B gate's record %s writes; remove it (the next run measures the change "
                        "again)" % (host_path(root, path), owner))
    return record


def write_rejected(root: str, path: str, record: Dict[str, Any]) -> None:
    """The A/B gate's record of a rolled-back change, written before the rollback (read_rejected)."""
    put_file(root, path, FILE, json.dumps(record, indent=1) + "\n", 0o600)


def forget(root: str, path: str, check: bool) -> bool:
    """Delete a record a module keeps at the root-relative ``path`` (unless ``check``); whether there was one."""
    if inspect_dropin(root, path) == Dropin(None, None, False, None):
        return False
    if not check:
        put_file(root, path, ABSENT, None, DROPIN_MODE)
    return True


def _remove_quietly(directory: int, name: str) -> None:
    try:
        remove(directory, name)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------- the runtime files


def read_value(root: str, name: str, path: str) -> Optional[str]:
    """The first word of the runtime file ``path`` (root-relative); None when this kernel has no such file."""
    shown = host_path(root, path)
    try:
        text = read_under(root, path, _MAX_VALUE_BYTES)
    except FileNotFoundError:
        return None
    except Refused as exc:
        raise refusal(exc, "read %s from %s" % (name, shown)) from None
    except PermissionError as exc:
        raise NumaError("cannot read %s (%s): %s" % (shown, exc.strerror, BECOME_FIX)) from None
    except OSError as exc:
        raise NumaError("cannot read %s (%s): check that /%s is mounted"
                        % (shown, exc.strerror or exc, path.lstrip("/").split("/")[0])) from None
    words = text.split()
    return words[0] if words else ""


def setting_error(root: str, setting: Setting, exc: OSError) -> NumaError:
    """The one-line error for writing ``setting`` failed with ``exc``, naming the cause and the fix."""
    path = host_path(root, setting.path)
    if isinstance(exc, Refused):
        return refusal(exc, "write %s to %s" % (setting.name, path))
    if exc.errno in (errno.EACCES, errno.EPERM):
        return NumaError("cannot write %s (%s): %s" % (path, exc.strerror, BECOME_FIX))
    if exc.errno == errno.EROFS:
        return NumaError("cannot write %s: /%s is read-only here (a container?); run the module on the host, %s is "
                         "not namespaced" % (path, setting.path.lstrip("/").split("/")[0], setting.name))
    if exc.errno == errno.EINVAL:
        return NumaError("the kernel rejected %s = %s%s: choose a value this kernel supports"
                         % (setting.name, setting.after, setting.rejected_hint))
    return NumaError("cannot write %s (%s)" % (path, exc.strerror or exc))


def write_setting(root: str, setting: Setting) -> None:
    try:
        write_under(root, setting.path, ("%s\n" % setting.after).encode("ascii"))
    except OSError as exc:
        raise setting_error(root, setting, exc) from None


def verify(plan: KnobPlan) -> None:
    """Fail unless every runtime file the plan sets reads back as planned."""
    now = [(setting, read_value(plan.root, setting.name, setting.path))
           for setting in plan.settings if setting.after is not None]
    wrong = [(setting, value) for setting, value in now if value != setting.after]
    if wrong:
        raise NumaError("%s: %s" % ("; ".join(
            "wrote %s to %s but the kernel reports %s" % (setting.after, host_path(plan.root, setting.path), value)
            for setting, value in wrong), plan.knob.rewritten_by))


def apply(plan: KnobPlan) -> None:
    """Make the running kernel and the drop-in match the plan, then check that the kernel holds the values.

    What was there is recorded first (``record_originals``), so a restore can put it back."""
    record_originals(plan)
    for setting in plan.runtime_changes:
        write_setting(plan.root, setting)
    if plan.dropin_changed:
        write_dropin(plan)
    verify(plan)


# ---------------------------------------------------------------- the originals


class DropinOriginal(NamedTuple):
    """What stood at the drop-in's path before the first change."""

    kind: str  # ABSENT, FILE or MASK
    content: Optional[str]  # FILE's text
    mode: int  # FILE's permission bits, never writable by others (the drop-in trust rule)


class Originals(NamedTuple):
    """A knob's originals record: its runtime values in the order apply writes them, and its drop-in."""

    settings: Tuple[Tuple[str, str, Optional[str]], ...]  # (name, root-relative path, value; None: file was absent)
    dropin: DropinOriginal


class RestorePlan(NamedTuple):
    """What putting a knob's originals back changes; ``refused``, a record not to be trusted, is the module's to
    report."""

    knob: KnobPlan  # settings in reverse order of apply, the drop-in's text before and after, for changed and diff
    record: Optional[str]  # the record's path as shown; None: there is none, nothing to restore
    dropin: Optional[DropinOriginal]
    refused: Optional[str] = None

    @property
    def changed(self) -> bool:
        return self.record is not None and self.refused is None  # the record at least is deleted


def originals_path(root: str, knob: Knob) -> str:
    return host_path(root, "%s/%s.json" % (ORIGINALS_DIR, knob.owner))


def _record_refusal(root: str, knob: Knob, cause: str) -> str:
    return ("refusing the originals record %s: %s; nothing was changed. Remove it and set %s by hand, or, if root "
            "wrote what it holds, make it a regular file of root's with mode 0600"
            % (originals_path(root, knob), cause, knob.owner))


def _open_originals_dir(root: str, create: bool) -> int:
    return open_dir(root, ORIGINALS_DIR, create=create, rule=safe_fs.ORIGINALS_DIR)


def read_originals(root: str, knob: Knob) -> Tuple[Optional[Originals], Optional[str]]:
    """(the knob's originals, None), (None, None) when it has no record, or (None, why the record is refused)."""
    name = knob.owner + ".json"
    try:
        directory = _open_originals_dir(root, create=False)
    except FileNotFoundError:
        return None, None
    except Refused as exc:
        return None, _record_refusal(root, knob, "%s (%s)" % (exc, exc.fix))
    except OSError as exc:
        return None, _record_refusal(root, knob, "its directory cannot be opened (%s)" % (exc.strerror or exc))
    try:
        text = _read_record(directory, name, originals_path(root, knob))
    except FileNotFoundError:
        return None, None
    except Refused as exc:
        return None, _record_refusal(root, knob, "it is %s" % exc.found)
    except OSError as exc:
        return None, _record_refusal(root, knob, "it cannot be read (%s)" % (exc.strerror or exc))
    finally:
        os.close(directory)
    originals = _parse_originals(text, knob)
    return (originals, None) if originals is not None else (None, _record_refusal(
        root, knob, "not the JSON record of %s's originals this collection writes" % knob.owner))


def _read_record(directory: int, name: str, shown: str) -> str:
    handle = open_in(directory, name, os.O_RDONLY, shown)  # Refused: a symlink, or not a regular file
    try:
        # Judged through the descriptor read: what was judged is what is restored.
        distrust = dropin_distrust(os.fstat(handle))
        if distrust is not None:
            raise Refused(shown, distrust, "")
        return read_handle(handle, MAX_TEXT_BYTES, shown)
    finally:
        os.close(handle)


def _parse_originals(text: str, knob: Knob) -> Optional[Originals]:
    """The record's content, None when it is not one this module wrote for ``knob``: every path it names must be
    the knob's own, so even a record that passed the trust rule cannot make root write elsewhere."""
    try:
        data = json.loads(text)
        dropin = data["dropin"]
        settings = tuple((str(item["name"]), str(item["path"]), _optional_text(item["value"]))
                         for item in data["settings"])
        original = DropinOriginal(dropin["kind"], _optional_text(dropin.get("content")), int(dropin.get("mode", 0)))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    runtime_dir = knob.runtime_dir.rstrip("/") + "/"
    if (data.get("format") != ORIGINALS_FORMAT or data.get("knob") != knob.owner
            or dropin.get("path") != knob.dropin_path or original.kind not in (ABSENT, FILE, MASK)
            or (original.kind == FILE) != (original.content is not None)
            or any(posixpath.normpath(path) != path or not path.startswith(runtime_dir) for _n, path, _v in settings)):
        return None
    return Originals(settings, original._replace(mode=original.mode & ~0o022 & 0o7777))


def _optional_text(value: object) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise TypeError("not text")
    return value


def _dropin_original(found: Dropin) -> DropinOriginal:
    """What to put back for the drop-in ``found``. A symlink that is no mask is recorded as absent: put back, root
    would apply at boot whatever it points to."""
    if found.masked:
        return DropinOriginal(MASK, None, 0)
    if found.content is None or found.mode is None:
        return DropinOriginal(ABSENT, None, 0)
    return DropinOriginal(FILE, found.content, found.mode & ~0o022)


def _originals_data(knob: Knob, originals: Originals) -> Dict[str, object]:
    dropin = {"path": knob.dropin_path, "kind": originals.dropin.kind}  # type: Dict[str, object]
    if originals.dropin.kind == FILE:
        dropin.update(content=originals.dropin.content, mode=originals.dropin.mode)
    return {"format": ORIGINALS_FORMAT, "knob": knob.owner, "dropin": dropin,
            "settings": [{"name": name, "path": path, "value": value} for name, path, value in originals.settings]}


def record_originals(plan: KnobPlan) -> None:
    """Record the plan's runtime files and the drop-in, as they are before it changes them; a setting or the
    drop-in already recorded keeps its record (it holds the host's value, what is there now may be ours)."""
    known, refused = read_originals(plan.root, plan.knob)
    if refused is not None:
        raise NumaError(refused)
    first = known is None
    if known is None:
        known = Originals((), _dropin_original(inspect_dropin(plan.root, plan.knob.dropin_path)))
    recorded = set(name for name, _path, _value in known.settings)
    # Every runtime file the plan names, set or not: a write may change another (a weight turns the kernel's auto off).
    added = tuple((s.name, s.path, s.before) for s in plan.settings if s.name not in recorded)
    if first or added:
        _write_originals(plan.root, plan.knob, known._replace(settings=known.settings + added))


def _write_originals(root: str, knob: Knob, originals: Originals) -> None:
    text = json.dumps(_originals_data(knob, originals), indent=1, sort_keys=True) + "\n"
    _in_originals_dir(root, knob, True, lambda directory, name: safe_fs.write_atomically(
        directory, name, text.encode("utf-8"), ORIGINALS_MODE, TEMPORARY_PREFIX))


def _in_originals_dir(root: str, knob: Knob, create: bool, act: Callable[[int, str], Any]) -> None:
    """``act(directory fd, record name)`` in the originals' directory (made when ``create``); any OSError on the
    way is the one-line write error naming the record."""
    path = originals_path(root, knob)
    try:
        directory = _open_originals_dir(root, create=create)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        act(directory, posixpath.basename(path))
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        os.close(directory)


def plan_restore(root: str, knob: Knob) -> RestorePlan:
    """What putting the recorded originals back changes; reads, writes nothing."""
    originals, refused = read_originals(root, knob)
    empty = KnobPlan(knob, root, (), None, None, None, [], [])
    if refused is not None or originals is None:
        reason = refused or "no originals recorded in %s: nothing to restore" % originals_path(root, knob)
        return RestorePlan(empty._replace(reasons=[reason]), None, None, refused)
    # Undone last to first: a later write may change an earlier one (a weight written turns the kernel's auto off).
    settings = tuple(Setting(name, path, read_value(root, name, path), value)
                     for name, path, value in reversed(originals.settings))
    found = inspect_dropin(root, knob.dropin_path)
    plan = empty._replace(settings=settings, dropin_before=found.content, dropin_after=originals.dropin.content,
                          dropin_flaw=_restore_flaw(originals.dropin, found),
                          reasons=["the originals recorded in %s" % originals_path(root, knob)])
    return RestorePlan(plan, originals_path(root, knob), originals.dropin)


def _restore_flaw(original: DropinOriginal, found: Dropin) -> Optional[str]:
    """Why the drop-in's path must change although its text is already the original's (or both have none)."""
    if original.kind == MASK:
        return None if found.masked else "the mask (a symlink to %s) is put back" % MASK_TARGET
    if original.kind == ABSENT:
        return found.distrust  # a mask or a link there: removed
    if found.distrust is not None:
        return found.distrust
    return None if found.mode == original.mode else "mode %04o, not %04o" % (found.mode or 0, original.mode)


def put_back(root: str, knob: Knob, check: bool, with_diff: bool,
             result_of: Callable[[RestorePlan, bool], Dict[str, Any]]) -> Tuple[Optional[str], Dict[str, Any]]:
    """A knob module's state/source ``original``: (why a record is refused, or None; the module's result by
    ``result_of``, with the diff when ``with_diff`` and something changes). Restored unless ``check``."""
    plan = plan_restore(root, knob)
    if plan.refused:
        return plan.refused, {}
    if plan.changed and not check:
        restore(plan)
    result = result_of(plan, check)
    if with_diff and plan.changed:
        result["diff"] = diff(plan.knob)
    return None, result


def restore(plan: RestorePlan) -> None:
    """Put the originals back (runtime values, then the drop-in), check the kernel holds them, delete the record."""
    if plan.dropin is None or plan.record is None:
        return
    for setting in plan.knob.runtime_changes:
        write_setting(plan.knob.root, setting)
    if plan.knob.dropin_changed:
        put_file(plan.knob.root, plan.knob.knob.dropin_path, plan.dropin.kind, plan.dropin.content, plan.dropin.mode)
    verify(plan.knob)
    remove_originals(plan.knob.root, plan.knob.knob)


def remove_originals(root: str, knob: Knob) -> None:
    """Delete the knob's originals record: what it held is put back."""
    def remove(directory: int, name: str) -> None:
        _remove_quietly(directory, name)
        os.fsync(directory)  # a record that came back after a crash would restore again, over later changes
    _in_originals_dir(root, knob, False, remove)


def restore_summary(plan: RestorePlan, check_mode: bool) -> str:
    """What a restore did (or would do), for the module's msg."""
    if plan.record is None:
        return "; ".join(plan.knob.reasons)
    parts = ["%s %s -> %s" % (s.name, s.before, s.after) for s in reversed(plan.knob.runtime_changes)]
    if plan.knob.dropin_changed and plan.dropin is not None:
        parts.append("%s %s" % (plan.knob.dropin_file, {ABSENT: "removed", FILE: "put back", MASK: "masked again"}
                                [plan.dropin.kind]))
    parts.append("record %s deleted" % plan.record)
    return "%s the originals of %s: %s" % ("would restore" if check_mode else "restored", plan.knob.knob.owner,
                                           "; ".join(parts))


# ---------------------------------------------------------------- reporting


def diff(plan: KnobPlan) -> List[Dict[str, str]]:
    """Ansible diff entries: the drop-in, then the runtime values."""
    runtime = host_path(plan.root, plan.knob.runtime_dir) + " (runtime)"
    return [
        {"before_header": plan.dropin_file, "after_header": plan.dropin_file,
         "before": plan.dropin_before or "", "after": plan.dropin_after or ""},
        {"before_header": runtime, "after_header": runtime,
         "before": "".join("%s = %s\n" % (s.name, s.before) for s in plan.settings if s.before is not None),
         "after": "".join("%s = %s\n" % (s.name, s.before if s.after is None else s.after)
                          for s in plan.settings if s.after is not None or s.before is not None)},
    ]
