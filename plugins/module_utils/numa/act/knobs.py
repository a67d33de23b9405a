"""A persisted kernel knob: runtime files under /proc or /sys, and the one drop-in that sets them again at boot.

The NUMA balancing sysctl (act/balancing, a sysctl.d drop-in) and the weighted-interleave weights
(act/interleave_weights, a tmpfiles.d drop-in) are knobs on this shape. Each decides what to write by its own rules
and returns a ``KnobPlan``; this module is the one way a knob's drop-in is read and judged, its plan applied and
verified, and shown in diff mode. A new knob is one module that builds a ``KnobPlan``.

Nothing records a runtime value before the first change, so removing a drop-in (``dropin_after`` None) leaves the
running kernel as it is and the host's other boot files decide the value at the next boot.

Files under ``root`` are reached through system/root_files: never through a symlink, the drop-in's directories
writable by root only, the drop-in judged by ``root_files.dropin_distrust`` and written atomically, and no error
quotes a file's content.
"""

import errno
import os
import posixpath
import stat
from typing import Dict, List, NamedTuple, Optional, Tuple

from ..base.errors import NumaError
from ..read.boot_config import MASK_TARGET  # systemd's one way to disable a drop-in's name, tmpfiles.d's too
from ..system import safe_fs
from ..system.root_files import (BECOME_FIX, DROPIN_MODE, MAX_TEXT_BYTES, TEMPORARY_PREFIX, Refused, dropin_distrust,
                                 host_path, open_dir, open_in, read_handle, read_under, refusal, remove, resolve,
                                 write_error, write_under)

_MAX_VALUE_BYTES = 4096


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
    path, name = plan.dropin_file, posixpath.basename(plan.knob.dropin_path)
    try:
        directory = open_dir(plan.root, posixpath.dirname(plan.knob.dropin_path), create=plan.dropin_after is not None,
                             root_only=True)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        if plan.dropin_after is None:
            _remove_quietly(directory, name)
            os.fsync(directory)  # the removal must survive a crash, or boot applies the old file
        else:
            safe_fs.write_atomically(directory, name, plan.dropin_after.encode("utf-8"), DROPIN_MODE, TEMPORARY_PREFIX)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        os.close(directory)


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


def _write_error(root: str, setting: Setting, exc: OSError) -> NumaError:
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


def _write_setting(root: str, setting: Setting) -> None:
    try:
        write_under(root, setting.path, ("%s\n" % setting.after).encode("ascii"))
    except OSError as exc:
        raise _write_error(root, setting, exc) from None


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
    """Make the running kernel and the drop-in match the plan, then check that the kernel holds the values."""
    for setting in plan.runtime_changes:
        _write_setting(plan.root, setting)
    if plan.dropin_changed:
        write_dropin(plan)
    verify(plan)


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
