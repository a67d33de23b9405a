"""Per-node copies of a model file, so that the servers of each node map their own page cache.

A file has one page cache, and each of its cached pages sits on one node however many
servers map it. Two servers bound to different nodes that mmap one model file cannot
both read it locally, and evicting cannot help while either of them runs. A copy is
another inode with its own page cache. numa-pin writes it after the plan's memory policy
is applied, so its pages are allocated on the plan's nodes as they are written, and the
server finds the weights cached and local.

The cost is one copy per node, on disk and in memory: the memory of ``--no-mmap`` per
node rather than per instance, shared by the instances of one node, and still cached
when a server restarts. A copy is fresh while its size and modification time equal the
source's. When the source changes, the next start copies it again.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import stat

from .errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Collection, List, Mapping, Optional, Sequence, Tuple

STATE_DIRECTORY_ENV = "STATE_DIRECTORY"


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
    info = _source_stat(source)
    target = replica_path(root, source, mem_nodes)
    directory = os.path.dirname(target)
    try:
        os.makedirs(directory, mode=0o750, exist_ok=True)
        lock = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    except OSError as exc:
        raise NumaError("cannot create the replica directory %s: %s; make it writable for the service's user "
                        "or set replica_dir to a directory it owns" % (directory, exc.strerror)) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_fresh(target, info):
            return target, False
        _check_room(directory, target, info.st_size)
        _copy(source, target, info)
    finally:
        os.close(lock)
    _drop_cached(source)
    return target, True


def point_at_replicas(argv: Sequence[str], replicas: Mapping[str, str]) -> List[str]:
    """The server's arguments with each model path (alone, or after ``=``) replaced by its copy.

    A model the arguments never name is a mistake: the server would read the shared file.
    """
    result = list(argv)
    for source, copy in replicas.items():
        found = False
        for index, arg in enumerate(result):
            if arg == source:
                result[index], found = copy, True
            elif arg.endswith("=" + source):
                result[index], found = arg[:-len(source)] + copy, True
        if not found:
            raise NumaError("page_cache replicate: no server argument is the model path %s, so the server would "
                            "read the shared file: write the model's path in the command exactly as in "
                            "--model (role: model_path)" % source)
    return result


def _source_stat(source: str) -> os.stat_result:
    try:
        info = os.stat(source)
    except OSError as exc:
        raise NumaError("cannot replicate %s: %s; check the model path" % (source, exc.strerror)) from None
    if not stat.S_ISREG(info.st_mode):
        raise NumaError("cannot replicate %s: page_cache replicate copies model files, and this is not a regular "
                        "file; pass each model file with --model" % source)
    return info


def _is_fresh(target: str, source: os.stat_result) -> bool:
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise NumaError("cannot check the replica %s: %s" % (target, exc.strerror)) from None
    return info.st_size == source.st_size and info.st_mtime_ns == source.st_mtime_ns


def _check_room(directory: str, target: str, size: int) -> None:
    fs = os.statvfs(directory)
    reusable = os.stat(target).st_size if os.path.exists(target) else 0
    available = fs.f_bavail * fs.f_frsize + reusable
    if available < size:
        raise NumaError("no room for a %d-byte replica in %s (%d bytes available): free disk space, set "
                        "replica_dir to a larger file system, or use page_cache evict" % (size, directory, available))


def _copy(source: str, target: str, info: os.stat_result) -> None:
    partial = "%s.partial-%d" % (target, os.getpid())
    try:
        shutil.copyfile(source, partial)
        os.utime(partial, ns=(info.st_atime_ns, info.st_mtime_ns))
        os.replace(partial, target)
    except OSError as exc:
        _remove_quietly(partial)
        fix = ("free disk space or set replica_dir elsewhere" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
               else "check that the service's user may read the model and write the replica directory")
        raise NumaError("copying %s to %s failed: %s; %s" % (source, target, exc.strerror, fix)) from None


def _drop_cached(source: str) -> None:
    """Drop the source's pages this copy cached: the replica holds the weights now.
    DONTNEED leaves pages mapped by other processes alone."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
