"""A host's files under a root prefix, as root reads and writes them: the one way to them outside read/kernel_files.

``root`` is the one path taken on trust. Below it every component is opened relative to its parent's
descriptor with O_NOFOLLOW (safe_fs.walk), so a symlink planted anywhere under root cannot send a read
or a write elsewhere, and a swap between a check and its use fails instead of escaping. Where links are
part of a format (sysctl.d, tuned), ``resolve`` follows them itself, inside root, and the result is
opened the same way. ``follow_links`` is the one in-root link resolver: read/kernel_files.Root follows
links with it too, a directory descriptor at a time.

The drop-ins root keeps for boot (balancing's sysctl.d file, the weights' tmpfiles.d file) are trusted
by one rule, ``dropin_distrust``. Writes are safe_fs's: atomic, under a random hidden name.

numa-pin exec imports this module (through read/kernel_files) at every server start, so ``typing`` is
imported for type checkers only.
"""
from __future__ import annotations

import errno
import os
import posixpath
import stat

from . import safe_fs
from ..base.errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional

# The kernel's own limit on symbolic links followed in one path lookup (MAXSYMLINKS).
MAX_SYMLINKS = 40
# Far above any configuration file or drop-in; a larger file is not what its name claims, and is not read.
MAX_TEXT_BYTES = 1 << 20
# The mode of a drop-in root writes: what systemd and sysctl read, root alone writes.
DROPIN_MODE = 0o644
# Hidden and not *.conf: neither systemd-sysctl nor systemd-tmpfiles reads a temporary file a crash left.
TEMPORARY_PREFIX = ".inferops-numa-"
BECOME_FIX = "run the module as root (become: true)"

# A path the layer will not go through: a symlink, a non-regular file, an oversized file.
Refused = safe_fs.Refused


def host_path(root: str, path: str) -> str:
    """``path`` (absolute on the target) under the ``root`` prefix."""
    return os.path.normpath(os.path.join(root, path.lstrip("/")))


def components(path: str) -> List[str]:
    """The names of ``path`` last first (a stack to pop), without the empty and "." ones."""
    return [name for name in reversed(path.split("/")) if name not in ("", ".")]


def follow_links(path: str, link_target: Callable[[List[str], str], Optional[str]]) -> List[str]:
    """The names ``path`` leads to inside a root once its links are followed, as in a chroot at that root.

    ``link_target(parents, name)`` is the target of ``name`` in the directory ``parents`` leads to, or
    None when it is no link. An absolute target starts again at the root and '..' stops there, so no link
    leads out. More than MAX_SYMLINKS links is a loop: OSError ELOOP.
    """
    pending = components(path)
    resolved = []  # type: List[str]
    links = 0
    while pending:
        name = pending.pop()
        if name == "..":
            resolved = resolved[:-1]
            continue
        target = link_target(resolved, name)
        if target is None:
            resolved.append(name)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, "more than %d symbolic links: a link loop" % MAX_SYMLINKS)
        if target.startswith("/"):
            resolved = []
        pending.extend(components(target))
    return resolved


def resolve(root: str, path: str) -> str:
    """Root-relative path that ``path`` names once its symlinks are followed inside ``root``.

    A name that is not there stands as it is. Links that loop leave ``path`` as given: opening it then
    fails on the link.
    """
    def link_target(parents: List[str], name: str) -> Optional[str]:
        try:
            return os.readlink(os.path.join(root, *parents, name))
        except OSError:  # not a symlink, or not there
            return None
    try:
        return "/" + "/".join(follow_links(path, link_target))
    except OSError:
        return path


# ---------------------------------------------------------------- errors


def refusal(exc: Refused, action: str) -> NumaError:
    """One line: what was refused, which path was wrong, and how to make it right."""
    return NumaError("refusing to %s: %s; %s" % (action, exc, exc.fix))


def write_error(path: str, exc: OSError) -> NumaError:
    """One line for a file root could not write or remove at ``path``."""
    if isinstance(exc, Refused):
        return refusal(exc, "write " + path)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return NumaError("cannot write %s (%s): %s" % (path, exc.strerror, BECOME_FIX))
    return NumaError("cannot write %s (%s)" % (path, exc.strerror or exc))


# ---------------------------------------------------------------- reaching files


def open_dir(root: str, path: str, create: bool = False, root_only: bool = False,
             rule: Optional[safe_fs.TrustRule] = None) -> int:
    """Descriptor of directory ``path`` (absolute on the target) under ``root``, without following links.

    ``root_only`` refuses a directory below root that another user may write (safe_fs.SYSCTL_DIR), ``rule``
    judges by another of safe_fs's rules; with either, ``create`` makes missing directories as that rule makes them.
    """
    rule = rule or (safe_fs.SYSCTL_DIR if root_only else None)
    directory, problem, _owner = safe_fs.open_directory(root, safe_fs.names_of(root, path), rule, create,
                                                        judge_start=False)
    if problem:
        info = problem.info
        raise Refused(problem.path, "writable by others (owner uid %d, group gid %d, mode %04o)"
                      % (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)),
                      "make it owned by root and writable by root only (chmod 0755)")
    return directory


def open_in(directory: int, name: str, flags: int, shown: str, mode: int = 0o600) -> int:
    """Descriptor of the regular file ``name`` in ``directory``, never through a symlink (Refused); ``mode``
    (less the umask) is the one a file made by O_CREAT in ``flags`` gets."""
    try:
        handle = os.open(name, flags | safe_fs.NO_FOLLOW, mode, dir_fd=directory)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(shown, safe_fs.LINK, "replace the symlink with a regular file", errno.ELOOP) from None
        raise OSError(exc.errno, exc.strerror, shown) from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise Refused(shown, "not a regular file", "expected a regular file there")
    return handle


def open_under(root: str, path: str, flags: int) -> int:
    """Descriptor of the regular file ``path`` under ``root``; no component may be a symlink."""
    parent, name = posixpath.split(path)
    directory = open_dir(root, parent)
    try:
        return open_in(directory, name, flags, host_path(root, path))
    finally:
        os.close(directory)


def read_handle(handle: int, limit: int, path: str) -> str:
    """All of an open file, decoded; one over ``limit`` bytes is refused rather than cut."""
    data = b""
    while len(data) <= limit:
        chunk = os.read(handle, limit + 1 - len(data))
        if not chunk:
            return data.decode("utf-8", "replace")
        data += chunk
    raise Refused(path, "larger than %d bytes" % limit, "expected a short text file there")


def read_under(root: str, path: str, limit: int = MAX_TEXT_BYTES) -> str:
    handle = open_under(root, path, os.O_RDONLY)
    try:
        return read_handle(handle, limit, host_path(root, path))
    finally:
        os.close(handle)


def write_under(root: str, path: str, data: bytes) -> None:
    """``data`` written over the regular file ``path`` under ``root`` in place: a kernel knob, not a file
    root keeps (those are written atomically, safe_fs.write_atomically)."""
    handle = open_under(root, path, os.O_WRONLY | os.O_TRUNC)
    try:
        safe_fs.write_all(handle, data)
    finally:
        os.close(handle)


def lstat_under(root: str, path: str) -> Optional[os.stat_result]:
    """The entry ``path`` under ``root`` itself (a symlink is not followed); None when unreachable."""
    parent, name = posixpath.split(path)
    try:
        directory = open_dir(root, parent)
    except OSError:
        return None
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(directory)


def read_config(root: str, path: str) -> str:
    """A configuration file under ``root``, its symlinks followed inside root (OSError when unreadable)."""
    return read_under(root, resolve(root, path))


def _is_kind(root: str, path: str, is_kind: Callable[[int], bool]) -> bool:
    info = lstat_under(root, resolve(root, path))
    return info is not None and is_kind(info.st_mode)


def is_file(root: str, path: str) -> bool:
    return _is_kind(root, path, stat.S_ISREG)


def is_dir(root: str, path: str) -> bool:
    return _is_kind(root, path, stat.S_ISDIR)


# ---------------------------------------------------------------- directories under a descriptor


def open_below(directory: int, names: List[str], shown: str, make_last: Optional[int] = None) -> int:
    """An O_PATH descriptor of ``names`` below ``directory``, each opened from its parent without following
    a link (safe_fs.Refused); ``make_last``: the mode the last name is made with when missing (the ones
    before it are never made: in resctrl's file system a directory made is a group)."""
    fd = os.dup(directory)
    try:
        for position, name in enumerate(names):
            shown = os.path.join(shown, name)
            mode = make_last if position == len(names) - 1 else None
            parent, fd = fd, safe_fs.step(fd, name, shown, mode)
            os.close(parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove(directory: int, name: str) -> None:
    """The file ``name`` in ``directory`` removed (a link itself, never its target); FileNotFoundError when
    there is none."""
    os.unlink(name, dir_fd=directory)


def put_link(directory: int, name: str, target: str, prefix: str) -> None:
    """``name`` in ``directory`` made a symlink to ``target`` at once: made under a random name, renamed over
    whatever was there (a file or a link itself, never a link's target), the rename synced."""
    temporary = safe_fs.temporary_name(prefix, ".tmp")
    os.symlink(target, temporary, dir_fd=directory)
    safe_fs.rename_into_place(directory, temporary, name)
    os.fsync(directory)


def remove_directory(directory: int, name: str) -> None:
    """The empty directory ``name`` in ``directory`` removed; OSError (ENOTEMPTY) when it holds anything."""
    os.rmdir(name, dir_fd=directory)


def remove_directory_under(root: str, path: str) -> None:
    """The empty directory ``path`` (relative to ``root``) removed, its parent reached without following a
    link; OSError (ENOTEMPTY) when it holds anything."""
    parent, name = posixpath.split(path)
    directory, _problem, _owner = safe_fs.walk(root, safe_fs.names_of(root, parent), None)
    try:
        remove_directory(directory, name)
    finally:
        os.close(directory)


# ---------------------------------------------------------------- the drop-in trust rule


def dropin_distrust(info: os.stat_result) -> Optional[str]:
    """Why the file ``info`` describes is not a drop-in root may apply at boot, or None when it is.

    The one rule for every drop-in the collection keeps: a regular file (a link could point anywhere,
    a FIFO would hang the boot), owned by the user this runs as (root), that no group or other user may
    write (they could put any setting in it that root then applies).
    """
    if stat.S_ISLNK(info.st_mode):
        return safe_fs.LINK
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != os.geteuid():
        return "owned by uid %d" % info.st_uid
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "mode %04o, writable by others than its owner" % stat.S_IMODE(info.st_mode)
    return None
