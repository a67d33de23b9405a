"""Per-node copies of a model file, so that the servers of each node map their own page cache.

A file has one page cache, and each of its cached pages sits on one node however many
servers map it. Two servers bound to different nodes that mmap one model file cannot
both read it locally, and evicting cannot help while either of them runs. A copy is
another inode with its own page cache. numa-pin writes it after the plan's memory policy
is applied, so its pages are allocated on the plan's nodes as they are written, and the
server finds the weights cached and local.

The cost is one copy per node, on disk and in memory: the memory of ``--no-mmap`` per
node rather than per instance, shared by the instances of one node, and still cached
when a server restarts. A copy is fresh while it is a regular file of numa-pin's user
with the source's size and modification time, stamped (extended attribute
``user.inferops.numa.source``) with the source's device, inode, size and mtime. When the
source changes, the next start copies it again; so does every start on a file system
without user extended attributes.

numa-pin may run as root (``user: root`` services, ``hardening: false``, by hand) on a
replica directory another user owns, so it trusts no name it did not create. It walks
the replica path from ``/`` one directory at a time, relative to the parent's descriptor
and never through a symbolic link, and refuses, as sshd's StrictModes does, a directory
owned by anyone but root and the service's user, or that its group or others may write
without the sticky bit. The copy is written without a name (O_TMPFILE) or under an
unpredictable one, synced, then renamed into place. SIGTERM, SIGINT or SIGHUP during the
copy removes the partial copy before taking effect, and the next start removes those a
crash left (the node directory's lock says no one else is copying) and counts their
space as free.

The service's user is numa-pin's own; when that is root, the one other user owning a
directory of the replica path (systemd gives StateDirectory= to the unit's User=), or
root if there is none. The model is opened once, with that user's rights (a root
numa-pin opens it in a child that has only them), never through a symbolic link as its
last component, and the copy is readable by no class of users the model was not: root
never copies into a user's directory a file that user could not read.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import pwd
import stat

from ..system import root_files, safe_fs
from ..base.errors import NumaError
from ..system.safe_fs import READ_FLAGS

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Collection, List, Mapping, Optional, Sequence, Tuple

STATE_DIRECTORY_ENV = "STATE_DIRECTORY"
STAMP_ATTRIBUTE = "user.inferops.numa.source"
LOCK_NAME = ".lock"
# Partial copies: this prefix and 16 random hex digits. A copy's name starts with a digest, never a dot.
PARTIAL_PREFIX = ".partial-"
PARTIAL_TOKEN_LENGTH = safe_fs.TOKEN_LENGTH
# Bytes per sendfile call: a stop signal is acted on between two of them.
COPY_CHUNK = 64 << 20
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")

_DIRECTORY_FIX = ("chown root (or the service's user) and chmod go-w, or set replica_dir to a directory only root "
                  "and the service's user can write")


class _Stopped(Exception):
    """A stop signal arrived during the copy."""


def replica_root(configured: Optional[str]) -> str:
    """The directory for replicas: ``configured``, else systemd's StateDirectory= of the unit."""
    if configured:
        return configured
    # systemd sets $STATE_DIRECTORY (colon-separated when StateDirectory= names several).
    state = os.environ.get(STATE_DIRECTORY_ENV, "").split(":")[0]
    if not state:
        raise NumaError("page_cache replicate needs a directory for the per-node copies: pass --replica-dir DIR "
                        "(role: replica_dir), or run under a unit with StateDirectory= (role: state_directory: true)")
    return state


def replica_path(root: str, source: str, mem_nodes: Collection[int]) -> str:
    """``<root>/node<N>[+<M>...]/<hash of the source's path>-<name>``: one copy per node set and source."""
    real = os.path.realpath(source)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    nodes = "+".join(str(node) for node in sorted(mem_nodes))
    return os.path.join(root, "node" + nodes, "%s-%s" % (digest, os.path.basename(real)))


def ensure_replica(source: str, root: str, mem_nodes: Collection[int]) -> Tuple[str, bool]:
    """Make the node set's copy of ``source`` fresh; (its path, whether it was copied now).

    Call it with the plan's memory policy applied: the copy's page cache is allocated
    under that policy. Instances of one node wait for each other on a lock in the
    node's directory instead of writing the same copy twice.
    """
    target = replica_path(root, source, mem_nodes)
    node, service_uid = _open_directory(os.path.dirname(target))
    try:
        model, info = _open_model(source, service_uid)
        try:
            copied = _refresh(model, info, node, target)
        finally:
            os.close(model)
    except OSError as exc:
        raise NumaError("cannot replicate %s to %s: %s; check that the service's user may read the model and "
                        "write the replica directory" % (source, target, exc.strerror)) from None
    finally:
        os.close(node)
    return target, copied


def point_at_replicas(argv: Sequence[str], replicas: Mapping[str, str], mounted: bool = False) -> List[str]:
    """The server's arguments with each model path (alone, or after ``=``) replaced by its copy; for a container
    (``mounted``), only the host side of a ``HOST:CONTAINER`` volume: the server inside names the path it is
    mounted at, and a host path there would not exist.

    A model the arguments never name is a mistake: the server would read the shared file.
    """
    result = list(argv)
    for source, copy in replicas.items():
        found = False
        for index, arg in enumerate(result):
            if mounted:
                if arg.startswith(source + ":"):
                    result[index], found = copy + arg[len(source):], True
            elif arg == source:
                result[index], found = copy, True
            elif arg.endswith("=" + source):
                result[index], found = arg[:-len(source)] + copy, True
        if not found:
            raise NumaError("page_cache replicate: no %s is the model path %s, so the server would read the shared "
                            "file: %s" % ("volume's host side" if mounted else "server argument", source,
                                          "mount the model file itself, as " + source + ":PATH-IN-CONTAINER"
                                          if mounted else "write the model's path in the command exactly as in "
                                          "--model (a service entry's model)"))
    return result


# --- the replica directory ------------------------------------------------


def _open_directory(path: str) -> Tuple[int, int]:
    """(``path`` opened for reading, the service's user): walked from ``/`` one directory at a
    time, each made if missing and checked (safe_fs.REPLICA_DIR) before anything is looked up in it."""
    try:
        node, problem, service_uid = safe_fs.open_directory("/", safe_fs.names_of("/", os.path.abspath(path)),
                                                            safe_fs.REPLICA_DIR, create=True)
    except safe_fs.Refused as exc:
        raise NumaError("refusing the replica directory %s: it is a symbolic link (owner %s), which could point "
                        "anywhere; set replica_dir to a path without symbolic links"
                        % (exc.path, _user(exc.info.st_uid if exc.info else -1))) from None
    except NotADirectoryError as exc:
        raise NumaError("the replica directory %s is not a directory; remove it or set replica_dir elsewhere"
                        % exc.filename) from None
    except OSError as exc:
        raise NumaError("cannot create or open the replica directory %s: %s; make it writable for the service's "
                        "user or set replica_dir to a directory it owns" % (exc.filename or "/", exc.strerror)) from None
    if problem:
        raise _distrust_error(problem)
    return node, service_uid


def _distrust_error(problem: safe_fs.Distrust) -> NumaError:
    """StrictModes' refusal: a directory owned by neither root nor the service's user, or that its
    group or others may write without the sticky bit."""
    owner = problem.info.st_uid
    if problem.why == safe_fs.OWNER:
        return NumaError("refusing the replica directory %s: its owner %s is neither root nor the service's user "
                         "%s; %s" % (problem.path, _user(owner), _user(problem.owner), _DIRECTORY_FIX))
    return NumaError("refusing the replica directory %s (owner %s, mode %04o): its group or others may write it; "
                     "%s" % (problem.path, _user(owner), stat.S_IMODE(problem.info.st_mode), _DIRECTORY_FIX))


def _user(uid: int) -> str:
    try:
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except KeyError:
        return "uid %d" % uid


# --- the model --------------------------------------------------------------


def _open_model(source: str, service_uid: int) -> Tuple[int, os.stat_result]:
    """The model opened once, with the service user's rights, and its status: a regular file."""
    if service_uid == os.geteuid():
        error, fd = _open_for_reading(source)
    else:
        error, fd = _open_as(service_uid, source)
    if error:
        raise _model_error(source, error, service_uid)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NumaError("cannot replicate %s: page_cache replicate copies model files, and this is not a regular "
                        "file; pass each model file with --model" % source)
    return fd, info


def _open_for_reading(path: str) -> Tuple[int, int]:
    """(0, the descriptor), or (the errno, -1)."""
    try:
        return 0, os.open(path, READ_FLAGS)
    except OSError as exc:
        return exc.errno, -1


def _open_as(uid: int, path: str) -> Tuple[int, int]:
    """_open_for_reading in a child that has only the user's rights; the descriptor comes back
    over a socket. A check by the user followed by root's own open could be raced."""
    import array
    import socket  # here, not at the top: it imports enum, and only a root numa-pin comes here

    gid, groups = _account(uid)
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        _send_opened(theirs, path, uid, gid, groups)
    theirs.close()
    fds = array.array("i")
    try:
        message, ancillary, _flags, _address = ours.recvmsg(16, socket.CMSG_SPACE(fds.itemsize),
                                                            socket.MSG_CMSG_CLOEXEC)
    finally:
        ours.close()
        os.waitpid(pid, 0)
    for level, kind, data in ancillary:
        if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if not message:
        raise NumaError("cannot replicate %s: the child process taking the rights of the service's user %s failed"
                        % (path, _user(uid)))
    error = int(message)
    return (error, -1) if error or not fds else (0, fds[0])


def _send_opened(channel: socket.socket, path: str, uid: int, gid: int, groups: List[int]) -> None:
    """In the forked child: become the user, open ``path``, send the errno and the descriptor; exit."""
    import array
    import socket

    try:
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
        error, fd = _open_for_reading(path)
        rights = [] if error else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
        channel.sendmsg([b"%d" % error], rights)
    finally:
        os._exit(0)  # never back into the parent's code (or a test runner) in the child


def _account(uid: int) -> Tuple[int, List[int]]:
    """The user's group and supplementary groups, as its processes get them at login."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        raise NumaError("cannot replicate as root into a directory of uid %d: it has no user entry to read the "
                        "model with its rights; chown the replica directory to the server's user, or set "
                        "replica_dir to a directory only root can write" % uid) from None
    return entry.pw_gid, os.getgrouplist(entry.pw_name, entry.pw_gid)


def _model_error(source: str, error: int, service_uid: int) -> NumaError:
    if error == errno.ELOOP:
        return NumaError("cannot replicate %s: it is a symbolic link, and numa-pin copies only a file named by its "
                         "own path (a link can be re-pointed); give the path realpath prints in --model and in the "
                         "server command" % source)
    if error in (errno.EACCES, errno.EPERM) and service_uid != os.geteuid():
        return NumaError("cannot replicate %s: the service's user %s may not read it, and numa-pin, as root, copies "
                         "a model only for a user who could read it; let that user read the model, or set replica_dir "
                         "to a directory of the server's user" % (source, _user(service_uid)))
    return NumaError("cannot replicate %s: %s; check the model path" % (source, os.strerror(error)))


# --- the copy -----------------------------------------------------------------


def _refresh(model: int, source: os.stat_result, node: int, target: str) -> bool:
    """Under the node directory's lock: remove stale partial copies, then copy unless the copy is fresh."""
    lock = _open_lock(node, os.path.dirname(target))
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        free = _free_bytes(node)
        reclaimed = _remove_partials(node)
        if _is_fresh(node, os.path.basename(target), source):
            return False
        # The stale copy, if any, stays until the rename, and a running server may map it beyond.
        _check_room(os.path.dirname(target), source.st_size, free + reclaimed)
        _copy_stoppably(model, source, node, target)
    finally:
        os.close(lock)
    # The copy holds the weights now: drop the source's pages it cached (DONTNEED spares pages others map).
    os.posix_fadvise(model, 0, 0, os.POSIX_FADV_DONTNEED)
    return True


def _open_lock(node: int, directory: str) -> int:
    shown = os.path.join(directory, LOCK_NAME)
    try:
        return root_files.open_in(node, LOCK_NAME, os.O_RDONLY | os.O_NOCTTY | os.O_CREAT, shown, 0o640)
    except safe_fs.Refused as exc:
        raise NumaError("refusing the lock %s: it is %s; remove it" % (shown, exc.found)) from None
    except OSError as exc:
        raise NumaError("cannot open the lock %s: %s; let the service's user write %s"
                        % (shown, exc.strerror, directory)) from None


def _free_bytes(node: int) -> int:
    fs = os.statvfs(node)
    return fs.f_bavail * fs.f_frsize


def _check_room(directory: str, size: int, available: int) -> None:
    if available < size:
        raise NumaError("no room for a %d-byte replica in %s (%d bytes available): free disk space, set "
                        "replica_dir to a larger file system, or use page_cache evict" % (size, directory, available))


def _remove_partials(node: int) -> int:
    """Remove the partial copies in ``node`` that are ours; the bytes they held. Call it holding the
    lock: every copier holds it, so they are all left over from a crash or a kill."""
    freed = 0
    for name in os.listdir(node):
        if not _is_partial_name(name):
            continue
        try:
            info = os.stat(name, dir_fd=node, follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                root_files.remove(node, name)
                freed += info.st_blocks * 512  # st_blocks counts 512-byte units
        except OSError:
            continue
    return freed


def _is_partial_name(name: str) -> bool:
    """Whether ``name`` is one _partial_name makes."""
    return safe_fs.is_temporary_name(name, PARTIAL_PREFIX)


def _partial_name() -> str:
    return safe_fs.temporary_name(PARTIAL_PREFIX)


def _is_fresh(node: int, name: str, source: os.stat_result) -> bool:
    """Whether ``name`` is a copy of this very source that we made: a planted link or file never is."""
    try:
        info = os.stat(name, dir_fd=node, follow_symlinks=False)
    except FileNotFoundError:
        return False
    ours = stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
    # A model made less readable since it was copied makes its copy stale too.
    no_wider = not stat.S_IMODE(info.st_mode) & ~_copy_mode(source)
    return (ours and no_wider and (info.st_size, info.st_mtime_ns) == (source.st_size, source.st_mtime_ns)
            and _read_stamp(node, name, info) == _stamp(source))


def _stamp(source: os.stat_result) -> bytes:
    return b"%d:%d:%d:%d" % (source.st_dev, source.st_ino, source.st_size, source.st_mtime_ns)


def _read_stamp(node: int, name: str, expected: os.stat_result) -> bytes:
    """The stamp of the file ``expected`` describes, or b"" (none, or the name now holds another file)."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=node)
    except OSError:
        return b""
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (expected.st_dev, expected.st_ino):
            return b""
        return os.getxattr(fd, STAMP_ATTRIBUTE)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _copy_stoppably(model: int, source: os.stat_result, node: int, target: str) -> None:
    """_copy, where a stop signal (systemctl stop, a start timeout, ^C, a closed terminal) ends the
    copy between two chunks, and takes its own effect once the partial copy is removed."""
    import signal  # here, not at the top: it imports enum, and a start that copies nothing stays lean
    import threading

    caught = []  # type: List[int]
    previous = {}
    if threading.current_thread() is threading.main_thread():  # the only thread that may set handlers
        for signum in (getattr(signal, name) for name in STOP_SIGNALS):
            if signal.getsignal(signum) is not signal.SIG_IGN:  # an ignored signal stays ignored
                previous[signum] = signal.signal(signum, lambda number, _frame: caught.append(number))
    stopped = False
    try:
        _copy(model, source, node, target, caught)
    except _Stopped:
        stopped = True
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    if caught:
        signal.raise_signal(caught[0])
    if stopped:
        raise NumaError("writing the replica %s was stopped by signal %d; the partial copy is removed"
                        % (target, caught[0]))


def _copy(model: int, source: os.stat_result, node: int, target: str, caught: List[int]) -> None:
    """Write the copy with no name (O_TMPFILE) or an unpredictable one, then rename it to ``target``."""
    fd = -1
    partial = None  # type: Optional[str]
    try:
        fd, partial = safe_fs.open_temporary(node, _copy_mode(source), PARTIAL_PREFIX, unnamed=True)
        _fill(fd, model, source, caught)
        if partial is None:  # the unnamed file gets a name only now, full and synced
            partial = safe_fs.link_temporary(node, fd, PARTIAL_PREFIX)
        named, partial = partial, None
        safe_fs.rename_into_place(node, named, os.path.basename(target))  # removes it when that fails
        os.fsync(node)  # the new name survives a crash
    except OSError as exc:
        fix = ("free disk space or set replica_dir elsewhere" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
               else "check that the service's user may write the replica directory")
        raise NumaError("writing the replica %s failed: %s; %s" % (target, exc.strerror, fix)) from None
    finally:
        if fd >= 0:
            os.close(fd)
        if partial is not None:
            safe_fs.remove_quietly(node, partial)


def _copy_mode(source: os.stat_result) -> int:
    """The copy is readable by no class of users the model is not: its group and others' read bits."""
    return stat.S_IRUSR | stat.S_IWUSR | (source.st_mode & (stat.S_IRGRP | stat.S_IROTH))


def _fill(fd: int, model: int, source: os.stat_result, caught: List[int]) -> None:
    """The model's bytes, times and stamp into ``fd``, synced to disk."""
    offset = 0
    while offset < source.st_size:
        if caught:
            raise _Stopped()
        sent = os.sendfile(fd, model, offset, min(COPY_CHUNK, source.st_size - offset))
        if not sent:  # the model shrank meanwhile: the copy's size differs, the next start copies again
            break
        offset += sent
    os.utime(fd, ns=(source.st_atime_ns, source.st_mtime_ns))
    try:
        os.setxattr(fd, STAMP_ATTRIBUTE, _stamp(source))
    except OSError as exc:
        if exc.errno != errno.EOPNOTSUPP:  # without user xattrs the copy is never fresh: copied each start
            raise
    os.fsync(fd)
