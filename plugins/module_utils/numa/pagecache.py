"""Which NUMA node holds a file's page cache, and dropping the copies on remote nodes.

llama-server mmaps its model, so the weights it reads are page-cache pages, and those
are allocated on a node of whichever task first read them. A server bound to node 1
that maps a model first read on node 0 reads every weight across the interconnect.
``file_residency`` shows where the cached pages are; ``evict_remote`` drops those on
other nodes, so that the server re-reads them under its own MPOL_BIND and the kernel
allocates them on its node (page-cache allocations follow the reading task's memory
policy).

Scanning costs no I/O: mincore(2) says which pages are cached, only those are touched
(a minor fault maps a cached page, readahead is switched off for the mapping), and
move_pages(2) reports their node. The file is mapped in windows so that memory stays
bounded whatever its size. A file truncated while it is scanned can kill the process
with SIGBUS; model files are not rewritten in place.
"""
from __future__ import annotations

import errno
import mmap
import os
import stat

from . import kernel
from .errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Collection, Dict, Iterable, Iterator, List, Set, Tuple

    Runs = List[Tuple[int, int]]

WINDOW_BYTES = 64 << 20
PAGE = mmap.PAGESIZE
# mincore(2) sets bit 0 of a page's byte when it is resident; the others are reserved.
_RESIDENT = bytes(value & 1 for value in range(256))
_MAP_FAILED = (1 << 64) - 1
_LIBC_FUNCS = {}  # type: Dict[str, Any]


def file_residency(path: str, window_bytes: int = WINDOW_BYTES) -> Dict[str, Any]:
    """Where a regular file's cached pages are.

    ``{"path", "size_bytes", "pages", "cached_pages", "nodes": {"<node>": pages},
    "unresolved_pages"}``; unresolved pages were cached but left the cache (or could
    not be located) between mincore and move_pages.
    """
    fd, size = _open_regular(path)
    try:
        cached, nodes = _tally(_scan(fd, size, window_bytes))
    finally:
        os.close(fd)
    return {"path": path, "size_bytes": size, "pages": _page_count(size), "cached_pages": cached,
            "nodes": _node_keys(nodes), "unresolved_pages": cached - sum(nodes.values())}


def residency(paths: Iterable[str]) -> Dict[str, Any]:
    """``file_residency`` of every regular file in ``paths`` (directories walked, links
    followed, each file counted once), under ``files``, with the same totals summed."""
    files = [file_residency(path) for path in regular_files(paths)]
    nodes = {}  # type: Dict[int, int]
    for entry in files:
        for node, count in entry["nodes"].items():
            nodes[int(node)] = nodes.get(int(node), 0) + count
    total = {key: sum(entry[key] for entry in files)
             for key in ("size_bytes", "pages", "cached_pages", "unresolved_pages")}
    total.update({"files": files, "nodes": _node_keys(nodes)})
    return total


def mapping_pids(path: str, proc_root: str = "/proc") -> List[int]:
    """PIDs of other processes that map ``path`` now (from /proc/<pid>/maps).

    Processes that exit meanwhile are skipped, so are maps this user may not read
    (only root sees every process).
    """
    return _mappers(path, proc_root)[0]


def evict_remote(path: str, local_nodes: Collection[int], proc_root: str = "/proc") -> Dict[str, Any]:
    """Drop the file's cached pages that sit on nodes outside ``local_nodes``.

    Uses posix_fadvise(POSIX_FADV_DONTNEED) over runs of remote pages. Does nothing
    while another process maps the file (``skipped_reason`` names the PIDs): the kernel
    never drops mapped pages, and a running server would only pay the re-reads. Dirty
    pages are not dropped either (DONTNEED starts their writeback and skips them):
    they show in ``after`` and in a warning. Returns ``before``/``after`` pages per
    node, ``evicted_pages`` (remote pages that left the cache), ``requested_pages``,
    ``mapped_by``, ``skipped_reason`` (None when it ran) and ``warnings``.
    """
    local = _node_set(local_nodes)
    pids, unreadable = _mappers(path, proc_root)
    warnings = []
    if unreadable:
        warnings.append("could not read the memory maps of %d process(es): run as root to be sure "
                        "no other process maps %s" % (unreadable, path))
    fd, size = _open_regular(path)
    try:
        if pids:
            before = _tally(_scan(fd, size, WINDOW_BYTES))[1]
            after = before
            requested = 0
            reason = ("%s is mapped by PIDs %s: stop them first (mapped pages cannot be dropped, "
                      "and evicting under a running server only costs it re-reads)"
                      % (path, ", ".join(str(pid) for pid in pids)))
            warnings.append(reason)
        else:
            before, requested = _evict(fd, size, local)
            # Nothing asked to leave: nothing moved, and a second scan would double the cost.
            after = _tally(_scan(fd, size, WINDOW_BYTES))[1] if requested else before
            reason = None
    finally:
        os.close(fd)
    remaining = sum(count for node, count in after.items() if node not in local)
    if remaining and not pids:
        warnings.append("%d pages stayed cached on remote nodes: dirty pages are dropped only once "
                        "written back (run sync and repeat), and mapped or locked pages never" % remaining)
    return {"path": path, "local_nodes": sorted(local), "before": _node_keys(before),
            "after": _node_keys(after), "requested_pages": requested,
            "evicted_pages": max(0, sum(count for node, count in before.items() if node not in local) - remaining),
            "mapped_by": pids, "skipped_reason": reason, "warnings": warnings}


def _evict(fd: int, size: int, local: Collection[int]) -> Tuple[Dict[int, int], int]:
    """fadvise DONTNEED every run of remote pages; (pages per node before, pages asked)."""
    before = {}  # type: Dict[int, int]
    requested = 0
    for first, runs, statuses in _scan(fd, size, WINDOW_BYTES):
        _count_nodes(statuses, before)
        # _scan has unmapped the window by now: DONTNEED skips pages mapped by anyone.
        for start, end in _remote_runs(runs, statuses, local):
            os.posix_fadvise(fd, (first + start) * PAGE, (end - start) * PAGE, os.POSIX_FADV_DONTNEED)
            requested += end - start
    return before, requested


def _remote_runs(runs: Runs, statuses: List[int], local: Collection[int]) -> Runs:
    """Coalesced page ranges of ``runs`` whose node is known and not local."""
    remote = []  # type: Runs
    index = 0
    for start, end in runs:
        for page in range(start, end):
            node = statuses[index]
            index += 1
            if node < 0 or node in local:
                continue
            if remote and remote[-1][1] == page:
                remote[-1] = (remote[-1][0], page + 1)
            else:
                remote.append((page, page + 1))
    return remote


def _scan(fd: int, size: int, window: int) -> Iterator[Tuple[int, Runs, List[int]]]:
    """Per window: (its first page in the file, runs of cached pages in the window,
    node or negative errno of each cached page in run order). Nothing stays mapped
    between yields."""
    window -= window % PAGE
    if window <= 0:
        raise NumaError("window of %d bytes is smaller than a page (%d): pass at least %d"
                        % (window, PAGE, PAGE))
    for offset in range(0, size, window):
        runs, statuses = _scan_window(fd, offset, min(window, size - offset))
        yield offset // PAGE, runs, statuses


def _scan_window(fd: int, offset: int, length: int) -> Tuple[Runs, List[int]]:
    import ctypes

    addr = _libc("mmap")(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
    if addr is None or addr == _MAP_FAILED:
        raise _os_failure("mmap", ctypes.get_errno())
    try:
        # A fault on a cached page must not start readahead of uncached neighbours
        # (a plain read leaves markers that would pull in the next megabytes).
        if _libc("madvise")(addr, length, mmap.MADV_RANDOM) != 0:
            raise _os_failure("madvise", ctypes.get_errno())
        vec = (ctypes.c_ubyte * _page_count(length))()
        if _libc("mincore")(addr, length, vec) != 0:
            raise _os_failure("mincore", ctypes.get_errno())
        runs = _runs(bytes(vec))
        addresses = []  # type: List[int]
        with memoryview((ctypes.c_ubyte * length).from_address(addr)) as pages:
            for start, end in runs:
                # One byte read per cached page maps it into this process without I/O;
                # move_pages only reports pages that are mapped.
                pages[start * PAGE:end * PAGE:PAGE].tobytes()
                addresses.extend(range(addr + start * PAGE, addr + end * PAGE, PAGE))
        return runs, kernel.query_page_nodes(addresses)
    finally:
        _libc("munmap")(addr, length)


def _runs(vec: bytes) -> Runs:
    """[start, end) page ranges that mincore's vector marks resident."""
    flags = vec.translate(_RESIDENT)
    runs = []
    start = flags.find(1)
    while start != -1:
        end = flags.find(0, start)
        if end == -1:
            end = len(flags)
        runs.append((start, end))
        start = flags.find(1, end)
    return runs


def _tally(scan: Iterator[Tuple[int, Runs, List[int]]]) -> Tuple[int, Dict[int, int]]:
    cached = 0
    nodes = {}  # type: Dict[int, int]
    for _first, runs, statuses in scan:
        cached += sum(end - start for start, end in runs)
        _count_nodes(statuses, nodes)
    return cached, nodes


def _count_nodes(statuses: List[int], nodes: Dict[int, int]) -> None:
    for node in set(statuses):
        if node >= 0:
            nodes[node] = nodes.get(node, 0) + statuses.count(node)


def _node_keys(nodes: Dict[int, int]) -> Dict[str, int]:
    return {str(node): nodes[node] for node in sorted(nodes) if nodes[node]}


def _page_count(size: int) -> int:
    return (size + PAGE - 1) // PAGE


def _node_set(nodes: Collection[int]) -> Set[int]:
    for node in nodes:
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise NumaError("local node %r is not a number of 0 or more: pass node ids like 0 or 1" % (node,))
    return set(nodes)


def _open_regular(path: str) -> Tuple[int, int]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NumaError("cannot open %s to read its page cache: %s; check the path and run as a "
                        "user who may read it" % (path, exc.strerror)) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NumaError("%s is not a regular file: pass a model file, or use residency() for a "
                        "directory" % path)
    if info.st_uid != os.geteuid() and not os.access(path, os.W_OK):
        os.close(fd)
        # Since Linux 5.0 mincore() shows the page cache of a file only to its owner and to
        # users who may write it; to anyone else every page looks cached, and touching
        # "cached" pages would read the whole file.
        raise NumaError("cannot see the page cache of %s: the kernel shows it only to the file's owner "
                        "(uid %d) or to users who may write it; run as that user, or give the service "
                        "its own copy of the model" % (path, info.st_uid))
    return fd, info.st_size


def regular_files(paths: Iterable[str]) -> List[str]:
    seen = set()
    files = []
    for path in paths:
        if not os.path.exists(path):
            raise NumaError("%s does not exist: pass model files or directories" % path)
        candidates = [path]
        if os.path.isdir(path):
            candidates = [os.path.join(root, name) for root, _dirs, names in os.walk(path)
                          for name in sorted(names)]
        for candidate in candidates:
            try:
                info = os.stat(candidate)
            except OSError:
                continue  # a dangling link or a file removed while walking
            if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                files.append(candidate)
    return files


def _mappers(path: str, proc_root: str) -> Tuple[List[int], int]:
    """(other PIDs mapping ``path``, number of processes whose maps could not be read)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise NumaError("cannot stat %s: %s; check the path" % (path, exc.strerror)) from None
    target = (os.major(info.st_dev), os.minor(info.st_dev), str(info.st_ino), os.path.realpath(path))
    own = str(os.getpid())
    pids = []
    unreadable = 0
    for entry in os.listdir(proc_root):
        if not entry.isdigit() or entry == own:
            continue
        try:
            with open(os.path.join(proc_root, entry, "maps")) as handle:
                text = handle.read()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the process exited
        except OSError:
            unreadable += 1
            continue
        if target[2] in text and _maps_file(text, target):
            pids.append(int(entry))
    return sorted(pids), unreadable


def _maps_file(text: str, target: Tuple[int, int, str, str]) -> bool:
    """Whether a maps text has a mapping of the file (device and inode; or inode and
    path, because overlayfs and btrfs report another device in maps than stat does)."""
    major, minor, inode, real = target
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5 or fields[4] != inode:
            continue
        dev_major, _sep, dev_minor = fields[3].partition(":")
        try:
            if (int(dev_major, 16), int(dev_minor, 16)) == (major, minor):
                return True
        except ValueError:
            continue
        if len(fields) == 6 and fields[5].strip() == real:
            return True
    return False


def _libc(name: str) -> Any:
    """A libc memory function with its C signature (own prototypes, so the shared
    kernel.libc() handle keeps its defaults)."""
    if name not in _LIBC_FUNCS:
        import ctypes

        size, ptr, cint = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
        signature = {
            "mmap": (ptr, ptr, size, cint, cint, cint, ctypes.c_long),
            "munmap": (cint, ptr, size),
            "madvise": (cint, ptr, size, cint),
            "mincore": (cint, ptr, size, ptr),
        }[name]
        _LIBC_FUNCS[name] = ctypes.CFUNCTYPE(*signature, use_errno=True)((name, kernel.libc()))
    return _LIBC_FUNCS[name]


def _os_failure(call: str, err: int) -> NumaError:
    if err == errno.EPERM:
        return NumaError("%s was refused (EPERM) while scanning the page cache: a seccomp filter blocks it; "
                         "allow it (systemd: SystemCallFilter=%s) or run with --page-cache ignore" % (call, call))
    return NumaError("%s failed while scanning the page cache: %s; the file must be on a file system "
                     "that supports mmap (not a pipe, /proc or some FUSE files)" % (call, os.strerror(err)))
