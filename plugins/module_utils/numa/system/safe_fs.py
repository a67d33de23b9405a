"""The one layer through which the package creates, walks to and writes files as root.

Root keeps files where others may have a say: the sysctl drop-in (balancing), the per-node model
copies in a service's directory (replica), the textfile, the drift state and the plan records
(metrics). Each of them is reached the same way, here:

- a directory is walked to one name at a time, each name opened relative to the descriptor of
  the directory before it with O_NOFOLLOW and O_DIRECTORY, so no symbolic link planted on the way
  is followed and no rename between a check and its use sends the walk elsewhere (``walk``);
- each directory reached is judged by the caller's :class:`TrustRule` through its own descriptor:
  who may own it, who may write it, whether a sticky bit excuses that, which directories count;
- a file is written whole or not at all: created under a random name, O_EXCL and O_NOFOLLOW, in
  the target directory's descriptor, synced, renamed over the target, and the directory synced
  (``write_atomically``).

The directory rules differ between callers where what the directory holds differs (a service's
replica directory is its user's, the sysctl.d one root's alone); they are named once, in the table
below, so that a fix to one is made where all of them are read. system/root_files builds a host's
files under a root prefix on these walks; other modules write, rename and remove files only through
the two (tests/unit/test_root_file_layer.py). What is refused comes back as a value (:class:`Distrust`)
or an OSError subclass carrying the path (:class:`Refused`, :class:`CreateFailed`): each caller words
its own one-line message with its own fix.

numa-pin exec imports replica (hence this module) at a server start, so ``typing`` is imported
for type checkers only.
"""
from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

# A directory on the way: a descriptor only for *at() calls, so search permission suffices.
WALK_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The directory reached, opened for listing, fsync and *at() calls: "." of a walked descriptor.
OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted where a file belongs cannot make an open or a read hang.
NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
READ_FLAGS = os.O_RDONLY | os.O_NOCTTY | NO_FOLLOW
# A new file under a name nothing else holds: an existing one, a planted link too, fails (so it is
# always a new regular file, and O_NONBLOCK has nothing to guard against).
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# What open(O_TMPFILE) fails with where the file system (EOPNOTSUPP) or the kernel (EISDIR) lacks it.
NO_TMPFILE = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL)
# Random hex digits of a temporary name: 64 bits, no one guesses them in advance.
TOKEN_LENGTH = 16

# --- the trust rules ------------------------------------------------------------------------------
#
# Owners: who may own a directory (or file) judged.
ROOT_ALONE = "root"
ROOT_OR_SELF = "root or this process's user"
# The service's user is this process's; when that is root, the first other owner met on the way
# (systemd gives StateDirectory= to the unit's User=), and root while there is none.
ROOT_OR_SERVICE = "root or the service's user"
# Group write: refused, or allowed when the group is root's or this process's.
GROUP_REFUSED = "refused"
GROUP_OF_ROOT_OR_SELF = "allowed to root's or this process's group"
# Which directories of the walk are judged.
EVERY = "every directory"
LAST = "the last directory"
# Owner and mode: whose result is named in messages.
OWNER = "owner"
WRITABLE = "writable"


class TrustRule:
    """Who may own a directory on the way to a file root keeps, and who may write it.

    ``sticky_excuses``: a sticky bit makes group or other write acceptable (sshd's StrictModes).
    ``create_mode``: the mode of a directory the walk makes (None: never made).
    ``missing_first``: the walk goes on past an untrusted directory, so that one missing below it
    is FileNotFoundError (nothing there to read) rather than a refusal; otherwise it stops there.
    """

    __slots__ = ("name", "owners", "group_write", "sticky_excuses", "judged", "create_mode", "missing_first")

    def __init__(self, name: str, owners: str, group_write: str, sticky_excuses: bool, judged: str,
                 create_mode: Optional[int], missing_first: bool = False) -> None:
        self.name = name
        self.owners = owners
        self.group_write = group_write
        self.sticky_excuses = sticky_excuses
        self.judged = judged
        self.create_mode = create_mode
        self.missing_first = missing_first

    def first_owner(self) -> int:
        """The uid besides root that may own what the rule judges, before the walk learns any other."""
        return 0 if self.owners == ROOT_ALONE else os.geteuid()

    def learn_owner(self, owner: int, info: os.stat_result) -> int:
        """The service's user once ``info``'s owner is met: a root process takes the first other owner."""
        return info.st_uid if self.owners == ROOT_OR_SERVICE and owner == 0 else owner

    def distrust(self, info: os.stat_result, owner: int) -> str:
        """OWNER or WRITABLE: why ``info`` is not trusted under this rule with ``owner``; "" when it is."""
        if info.st_uid not in (0, owner):
            return OWNER
        writers = info.st_mode & stat.S_IWOTH
        if self.group_write == GROUP_REFUSED or info.st_gid not in (0, os.getegid()):
            writers |= info.st_mode & stat.S_IWGRP
        if writers and not (self.sticky_excuses and info.st_mode & stat.S_ISVTX):
            return WRITABLE
        return ""


# The table: each caller's rule as it was when the copies were merged into this module. Where they
# differ (group write, the sticky bit, made 0755 or 0750, which directories are judged), the
# difference is kept, named here, for making them one to be decided on its own.
#: /etc/sysctl.d under balancing's root (the root prefix itself is taken on trust).
SYSCTL_DIR = TrustRule("sysctl.d", ROOT_OR_SELF, GROUP_OF_ROOT_OR_SELF, False, EVERY, 0o755)
#: A replica directory, from / down: the service's user owns the last ones.
REPLICA_DIR = TrustRule("replica", ROOT_OR_SERVICE, GROUP_REFUSED, True, EVERY, 0o750)
#: The textfile and state directories: reached without links, only the last one judged.
PRIVATE_DIR = TrustRule("private", ROOT_OR_SELF, GROUP_REFUSED, False, LAST, 0o755)
#: The plan records' directory, from / down, sticky ones too: its records choose what root restarts.
RECORD_DIR = TrustRule("records", ROOT_OR_SELF, GROUP_REFUSED, False, EVERY, None, missing_first=True)
#: A file root trusts that was written as root (a plan record, the drift state): the same owners and bits.
TRUSTED_FILE = RECORD_DIR
#: A deployment's units, drop-ins and records (act/change_files), from / down, made 0755 when missing: what root
#: writes there decides what every server runs, and the record of a change not judged yet what a rollback restores.
DEPLOYED = TrustRule("deployed", ROOT_OR_SELF, GROUP_REFUSED, False, EVERY, 0o755)
#: The originals of the kernel knobs root changed (act/knobs), reached from root's prefix down, made 0700 when missing:
#: a restore writes what they hold back into the kernel and the boot drop-ins, so no one but root may have a say.
ORIGINALS_DIR = TrustRule("originals", ROOT_OR_SELF, GROUP_REFUSED, False, EVERY, 0o700)
#: numa-pin's installed code and launcher, from / down, by path and by realpath; a missing part is
#: not installed yet. Kept by roles/numa_host/files/installed_stamp.py, which runs on the host
#: before this package is there (tests/unit/test_safe_fs.py holds the two to the same verdicts).
INSTALL_PATH = TrustRule("install", ROOT_ALONE, GROUP_REFUSED, False, EVERY, None)


class Distrust:
    """A directory the rule does not trust: its path as shown, its status, OWNER or WRITABLE, and the
    owner the rule allowed there (the service's user of ROOT_OR_SERVICE)."""

    __slots__ = ("path", "info", "why", "owner")

    def __init__(self, path: str, info: os.stat_result, why: str, owner: int) -> None:
        self.path = path
        self.info = info
        self.why = why
        self.owner = owner


class Refused(OSError):
    """A path the layer will not go through: a symlink, '..', or what a caller refuses (not a regular file).

    ``found`` says what is there ("a symlink"), ``fix`` what to do; ``info`` is its lstat when known.
    """

    def __init__(self, path: str, found: str, fix: str, code: int = errno.EINVAL,
                 info: Optional[os.stat_result] = None) -> None:
        super().__init__(code, "%s is %s" % (path, found))
        self.path = path
        self.found = found
        self.fix = fix
        self.info = info

    def __str__(self) -> str:
        return str(self.strerror)


class CreateFailed(OSError):
    """mkdir of a directory on the way failed (errno and strerror of the mkdir, the path as shown)."""


LINK = "a symlink"
OUTSIDE = "outside root"


# --- walking --------------------------------------------------------------------------------------


def names_of(start: str, path: str) -> List[str]:
    """The names of ``path`` to walk from ``start``; Refused (OUTSIDE) at a '..', which could climb out."""
    names = [name for name in path.split("/") if name not in ("", ".")]
    if ".." in names:
        shown = os.path.join(start, *names[:names.index("..") + 1])
        raise Refused(shown, OUTSIDE, "name a path inside root")
    return names


def walk(start: str, names: List[str], rule: Optional[TrustRule], create: bool = False,
         judge_start: bool = True) -> Tuple[int, Optional[Distrust], int]:
    """(an O_PATH descriptor of ``start``/``names``, the first Distrust of ``rule``, the owner it settled on).

    ``start`` is taken on trust as the way to it goes (a link to it is followed); it is judged too when
    ``judge_start``. Each name is then opened in the directory before it, never through a link
    (Refused; NotADirectoryError for anything else), and made with ``rule.create_mode`` when missing
    and ``create`` (CreateFailed when mkdir fails). Without ``rule`` nothing is judged. The walk stops
    at the first Distrust unless ``rule.missing_first``; the descriptor is then that directory's, for
    the caller to close and refuse. Every OSError names the path as shown.
    """
    owner = rule.first_owner() if rule else os.geteuid()
    create_mode = rule.create_mode if rule and create else None
    fd = os.open(start, WALK_FLAGS & ~os.O_NOFOLLOW)
    current = start
    problem = None  # type: Optional[Distrust]
    try:
        for position in range(len(names) + 1):
            if position:
                current = os.path.join(current, names[position - 1])
                child = step(fd, names[position - 1], current, create_mode)
                os.close(fd)
                fd = child
            if rule is None or not (position or judge_start) or (rule.judged == LAST and position < len(names)):
                continue
            # Judged through its own descriptor: what the name pointed to when judged is what is used.
            info = os.fstat(fd)
            owner = rule.learn_owner(owner, info)
            why = rule.distrust(info, owner)
            problem = problem or (Distrust(current, info, why, owner) if why else None)
            if problem and not rule.missing_first:
                break
    except BaseException:
        os.close(fd)
        raise
    return fd, problem, owner


def open_directory(start: str, names: List[str], rule: Optional[TrustRule], create: bool = False,
                   judge_start: bool = True) -> Tuple[int, Optional[Distrust], int]:
    """``walk``, with the directory reached opened for reading; no descriptor (-1) with a Distrust."""
    fd, problem, owner = walk(start, names, rule, create, judge_start)
    try:
        return (-1 if problem else os.open(".", OPEN_FLAGS, dir_fd=fd)), problem, owner
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, os.path.join(start, *names)) from None
    finally:
        os.close(fd)


def step(parent: int, name: str, shown: str, create_mode: Optional[int]) -> int:
    """The directory ``name`` in ``parent``, made with ``create_mode`` if missing (None: never)."""
    try:
        return _enter(parent, name, shown)
    except FileNotFoundError:
        if create_mode is None:
            raise
    try:
        os.mkdir(name, create_mode, dir_fd=parent)
    except FileExistsError:  # made meanwhile by another process
        pass
    except OSError as exc:
        raise CreateFailed(exc.errno, exc.strerror, shown) from None
    return _enter(parent, name, shown)


def _enter(parent: int, name: str, shown: str) -> int:
    try:
        return os.open(name, WALK_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise OSError(exc.errno, exc.strerror, shown) from None
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        raise Refused(shown, LINK, "replace the symlink with a real directory", errno.ELOOP, info)
    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)


# --- writing --------------------------------------------------------------------------------------


def temporary_name(prefix: str, suffix: str = "") -> str:
    """``prefix``, TOKEN_LENGTH random hex digits, ``suffix``: a name no one can plant in advance."""
    return prefix + os.urandom(TOKEN_LENGTH // 2).hex() + suffix


def is_temporary_name(name: str, prefix: str, suffix: str = "") -> bool:
    """Whether ``name`` is one ``temporary_name(prefix, suffix)`` makes."""
    token = name[len(prefix):len(name) - len(suffix)]
    return (name.startswith(prefix) and name.endswith(suffix) and len(token) == TOKEN_LENGTH
            and all(digit in "0123456789abcdef" for digit in token))


def open_temporary(directory: int, mode: int, prefix: str, suffix: str = "",
                   unnamed: bool = False) -> Tuple[int, Optional[str]]:
    """(a new file in ``directory`` open for writing, created with ``mode`` less the umask, its name).

    ``unnamed``: an O_TMPFILE where the file system has them (name None: ``link_temporary`` names it
    once it is whole), so a crash leaves nothing behind; else a random name made O_EXCL.
    """
    if unnamed:
        try:
            # os.O_TMPFILE read here, not at import: tests stand in a kernel without it.
            return os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode, dir_fd=directory), None
        except OSError as exc:
            if exc.errno not in NO_TMPFILE:
                raise
    name = temporary_name(prefix, suffix)
    return os.open(name, CREATE_FLAGS, mode, dir_fd=directory), name


def link_temporary(directory: int, fd: int, prefix: str, suffix: str = "") -> str:
    """A random name in ``directory`` for the unnamed file ``fd``; the name."""
    name = temporary_name(prefix, suffix)
    os.link("/proc/self/fd/%d" % fd, name, dst_dir_fd=directory)
    return name


def write_all(fd: int, data: bytes) -> None:
    unwritten = memoryview(data)
    while unwritten:  # a write may be short
        unwritten = unwritten[os.write(fd, unwritten):]


def create_temporary(directory: int, data: bytes, mode: int, prefix: str, suffix: str = ".tmp") -> str:
    """A new file in ``directory`` holding ``data`` on disk, mode ``mode``, under a random name; that name.

    Created O_EXCL without following links, so nothing planted in the directory is written through;
    removed again when writing fails.
    """
    fd, name = open_temporary(directory, mode, prefix, suffix)
    try:
        os.fchmod(fd, mode)  # explicit, whatever the umask
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        remove_quietly(directory, name)  # type: ignore[arg-type]
        raise
    finally:
        os.close(fd)
    return name  # type: ignore[return-value]


def rename_into_place(directory: int, temporary: str, name: str) -> None:
    """Rename ``temporary`` over ``name`` in ``directory``; removed when that fails.

    rename() replaces a symlink at ``name`` itself, never its target, and the file keeps its owner and mode.
    """
    try:
        os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        remove_quietly(directory, temporary)
        raise


def write_atomically(directory: int, name: str, data: bytes, mode: int, prefix: str, suffix: str = ".tmp") -> None:
    """``name`` in ``directory`` holds ``data`` whole or not at all, and the rename survives a crash."""
    rename_into_place(directory, create_temporary(directory, data, mode, prefix, suffix), name)
    os.fsync(directory)


def remove_quietly(directory: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=directory)
    except OSError:
        pass
