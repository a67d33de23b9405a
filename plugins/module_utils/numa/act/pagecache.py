"""Which NUMA node holds a file's page cache, and dropping the copies on remote nodes.

llama-server mmaps its model, so the weights it reads are page-cache pages, and those
are allocated on a node of whichever task first read them. A server bound to node 1
that maps a model first read on node 0 reads every weight across the interconnect.
``file_residency`` shows where the cached pages are; ``evict_remote`` drops those on
other nodes, so that the server re-reads them under its own MPOL_BIND and the kernel
allocates them on its node (page-cache allocations follow the reading task's memory
policy).

Looking costs no I/O: cachestat(2) counts the cached pages of each window of the file
and mincore(2) says which ones they are where a window is only partly cached; only
cached pages are touched (a minor fault maps a cached page, readahead is switched off
for the mapping), and move_pages(2) reports their node. The file is mapped in windows
so that memory stays bounded whatever its size. A file truncated while it is scanned
can kill the process with SIGBUS; model files are not rewritten in place.

Touching and asking costs ~0.3-0.9 us per page, so ``file_residency`` and
``evict_remote`` (which look at every cached page) take seconds on a cached 40 GiB
model. ``sample_residency``, the look at every server start, asks for the node of a
random sample of the cached pages instead: each node's share comes out within
``BOUND_PP`` percentage points of the full scan's with probability ``CONFIDENCE``,
whatever the file's size.
"""
from __future__ import annotations

import errno
import mmap
import os
import stat

from ..system import kernel
from ..base.errors import NumaError
from ..read.kernel_files import parse_maps, proc_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Collection, Dict, Iterable, Iterator, List, Optional, Set, Tuple

    Runs = List[Tuple[int, int]]

WINDOW_BYTES = 64 << 20
PAGE = mmap.PAGESIZE
# mincore(2) sets bit 0 of a page's byte when it is resident; the others are reserved.
_RESIDENT = bytes(value & 1 for value in range(256))
_MAP_FAILED = (1 << 64) - 1
_LIBC_FUNCS = {}  # type: Dict[str, Any]
# cachestat(2) (Linux 6.5) has this number on every architecture kernel.py knows: calls
# added since 424 share one number everywhere.
_CACHESTAT = 451

# sample_residency's error bound: each node's share of the cached pages (and the share
# move_pages could not locate) is within BOUND_PP percentage points of the exact share
# with probability CONFIDENCE. Two independent samples, drawn uniformly with
# replacement, split the 1 % risk:
# - FIRST_SAMPLE pages settle the common case, a model wholly on one node: if every one
#   is on node N, N holds >= 99 % of the cached pages, wrong with probability
#   <= 0.99 ** 688 < 0.1 %.
# - otherwise SECOND_SAMPLE fresh pages give each share; the count on a node is
#   binomial, and P(|share error| > 1 pp) <= 0.86 % at the worst share (50 %), by the
#   exact binomial distribution (the normal approximation asks for 17057; the margin
#   covers the distribution's steps). tests/unit/test_pagecache.py checks both figures.
# A file with no more cached pages than a sample needs is looked at whole (exact).
BOUND_PP = 1.0
CONFIDENCE = 0.99
FIRST_SAMPLE = 688
SECOND_SAMPLE = 17300


def file_residency(path: str, window_bytes: int = WINDOW_BYTES) -> Dict[str, Any]:
    """Where a regular file's cached pages are, every one of them looked at.

    ``{"path", "size_bytes", "pages", "cached_pages", "nodes": {"<node>": pages},
    "unresolved_pages"}``; unresolved pages were cached but left the cache (or could
    not be located) between mincore and move_pages. Exact counts, for reports that
    show them (``numa-pin explain``); ``sample_residency`` is the cheap look.
    """
    fd, size = _open_regular(path)
    try:
        cached, nodes = _tally(_scan(fd, size, window_bytes))
    finally:
        os.close(fd)
    return {"path": path, "size_bytes": size, "pages": _page_count(size), "cached_pages": cached,
            "nodes": _node_keys(nodes), "unresolved_pages": cached - sum(nodes.values())}


def sample_residency(path: str, window_bytes: int = WINDOW_BYTES,
                     randbytes: Callable[[int], bytes] = os.urandom,
                     local_nodes: Collection[int] = ()) -> Dict[str, Any]:
    """Where a regular file's cached pages are, from a sample of them.

    The keys of ``file_residency``, where ``cached_pages`` is exact (cachestat and
    mincore count every page) and ``nodes`` and ``unresolved_pages`` are estimates,
    plus ``node_percent`` (each node's share of the cached pages), ``sampled_pages``
    (how many pages the shares rest on), ``bound_pp`` and ``confidence``: every
    share is within ``bound_pp`` percentage points of the full scan's with that
    probability (``bound_pp`` 0: every cached page was looked at, the counts are
    exact), and ``estimate``, the same in words, e.g. "sampled 688 of 262144 cached
    pages; node fractions within ±1 pp (99 %)". ``randbytes`` is the random source.
    ``local_nodes`` count as one node for the first sample (see ``estimate_nodes``):
    the question at a server's start is only whether its pages are local.
    """
    fd, size = _open_regular(path)
    try:
        window = _window_size(window_bytes)
        runs = [(first + start, first + end) for first, window_runs in _residency(fd, size, window)
                for start, end in window_runs]
        cached = sum(end - start for start, end in runs)
        estimate = estimate_nodes(
            cached, lambda ranks: _page_statuses(fd, size, window, _pages_at(runs, ranks)), randbytes,
            local_nodes)
    finally:
        os.close(fd)
    shares = estimate["nodes"]
    return {"path": path, "size_bytes": size, "pages": _page_count(size), "cached_pages": cached,
            "nodes": _node_keys({node: round(share * cached) for node, share in shares.items()}),
            "unresolved_pages": round(estimate["unresolved"] * cached),
            "node_percent": {str(node): round(100 * shares[node], 2) for node in sorted(shares)},
            "sampled_pages": estimate["sampled_pages"], "bound_pp": estimate["bound_pp"],
            "confidence": CONFIDENCE, "estimate": _estimate_words(cached, estimate)}


def estimate_nodes(cached: int, look: Callable[[List[int]], List[int]],
                   randbytes: Callable[[int], bytes], together: Collection[int] = ()) -> Dict[str, Any]:
    """Each node's share of ``cached`` pages, from as few of them as the bound allows.

    ``look(ranks)`` gives the node, or a negative errno, of the cached pages with those
    ranks (0-based in file order, ascending, repeats allowed); ``randbytes(n)`` gives n
    random bytes. Returns ``{"nodes": {node: share}, "unresolved": share of negative
    statuses, "sampled_pages": pages the shares rest on, "bound_pp"}``: each share is
    within ``bound_pp`` percentage points of the exact one with probability
    ``CONFIDENCE`` (see FIRST_SAMPLE); ``bound_pp`` is 0 when every page was looked at.
    The nodes in ``together`` count as one for the first sample: when all of it lies on
    them, the bound holds for their share as a whole (an interleaved model is settled
    by 688 pages too), not for each of them.
    """
    if cached <= FIRST_SAMPLE:
        return _shares(look(list(range(cached))), 0.0)
    first = look(_draw(FIRST_SAMPLE, cached, randbytes))
    group = set(together) or {first[0]}
    if first[0] >= 0 and all(status in group for status in first):
        return _shares(first, BOUND_PP)
    # Several nodes: the second sample is drawn afresh, so that the two risks add up.
    if cached <= SECOND_SAMPLE:
        return _shares(look(list(range(cached))), 0.0)
    return _shares(look(_draw(SECOND_SAMPLE, cached, randbytes)), BOUND_PP)


def _shares(statuses: List[int], bound_pp: float) -> Dict[str, Any]:
    count = len(statuses)
    nodes = {}  # type: Dict[int, int]
    _count_nodes(statuses, nodes)
    located = sum(nodes.values())
    return {"nodes": {node: nodes[node] / count for node in nodes}, "sampled_pages": count, "bound_pp": bound_pp,
            "unresolved": (count - located) / count if count else 0.0}


def _draw(count: int, population: int, randbytes: Callable[[int], bytes]) -> List[int]:
    """``count`` ranks drawn uniformly from ``range(population)`` with replacement, sorted.

    64 random bits per draw: the modulo's bias is below population / 2**64.
    """
    import array

    words = array.array("Q")
    words.frombytes(randbytes(8 * count))
    return sorted(word % population for word in words)


def _pages_at(runs: Runs, ranks: List[int]) -> List[int]:
    """The pages of ``runs`` (ascending, disjoint) with these ranks (ascending) among them."""
    pages = []  # type: List[int]
    index = 0
    before = 0  # pages in the runs already passed
    for start, end in runs:
        before_end = before + end - start
        while index < len(ranks) and ranks[index] < before_end:
            pages.append(start + ranks[index] - before)
            index += 1
        before = before_end
    return pages


def _estimate_words(cached: int, estimate: Dict[str, Any]) -> str:
    if not estimate["bound_pp"]:
        return "all %d cached pages looked at; node fractions exact" % cached
    return "sampled %d of %d cached pages; node fractions within ±%g pp (%g %%)" % (
        estimate["sampled_pages"], cached, estimate["bound_pp"], 100 * CONFIDENCE)


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


def evict_remote(path: str, local_nodes: Collection[int], root: str = "/") -> Dict[str, Any]:
    """Drop the file's cached pages that sit on nodes outside ``local_nodes``.

    Looks at every cached page, not a sample: each remote page it missed would stay
    remote (``sample_residency`` tells whether calling this is worth it). Uses
    posix_fadvise(POSIX_FADV_DONTNEED) over runs of remote pages. Does nothing
    while another process maps the file (``skipped_reason`` names the PIDs, read from
    ``<root>/proc``): the kernel never drops mapped pages, and a running server would
    only pay the re-reads. Dirty
    pages are not dropped either (DONTNEED starts their writeback and skips them):
    they show in ``after`` and in a warning. Returns ``before``/``after`` pages per
    node, ``evicted_pages`` (remote pages that left the cache), ``requested_pages``,
    ``mapped_by``, ``skipped_reason`` (None when it ran) and ``warnings``.
    """
    local = _node_set(local_nodes)
    pids, unreadable = _mappers(path, root)
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
    window = _window_size(window)
    for first, runs in _residency(fd, size, window):
        offset = first * PAGE
        yield first, runs, _statuses(fd, offset, min(window, size - offset), runs)


def _window_size(window: int) -> int:
    window -= window % PAGE
    if window <= 0:
        raise NumaError("window of %d bytes is smaller than a page (%d): pass at least %d"
                        % (window, PAGE, PAGE))
    return window


def _residency(fd: int, size: int, window: int) -> Iterator[Tuple[int, Runs]]:
    """Per window: (its first page in the file, runs of cached pages in the window)."""
    for offset in range(0, size, window):
        yield offset // PAGE, _window_runs(fd, offset, min(window, size - offset))


def _window_runs(fd: int, offset: int, length: int) -> Runs:
    """Cached pages of a window, counted by cachestat; mincore says which where only
    some are (or cachestat is missing): it asks the page cache page by page, ~40 ns
    each, 10 ms per GiB, while cachestat walks whole folios."""
    import ctypes

    cached = _cachestat(fd, offset, length)
    pages = _page_count(length)
    if cached == 0:
        return []
    if cached == pages:
        return [(0, pages)]
    addr = _map(fd, offset, length)
    try:
        vec = (ctypes.c_ubyte * pages)()
        if _libc("mincore")(addr, length, vec) != 0:
            raise _os_failure("mincore", ctypes.get_errno())
        return _runs(bytes(vec))
    finally:
        _libc("munmap")(addr, length)


def _cachestat(fd: int, offset: int, length: int) -> Optional[int]:
    """Cached pages in the range, or None where cachestat is unavailable (Linux < 6.5,
    a seccomp filter, a file system without it): mincore answers then."""
    import array
    import ctypes

    span = array.array("Q", [offset, length])  # struct cachestat_range
    counts = array.array("Q", [0]) * 5  # struct cachestat: nr_cache first
    if kernel.libc().syscall(ctypes.c_long(_CACHESTAT), ctypes.c_long(fd), ctypes.c_void_p(span.buffer_info()[0]),
                             ctypes.c_void_p(counts.buffer_info()[0]), ctypes.c_long(0)) != 0:
        return None
    return counts[0]


def _page_statuses(fd: int, size: int, window: int, pages: List[int]) -> List[int]:
    """Node or negative errno of each of these pages (ascending, repeats allowed), one
    mapping per window that holds some."""
    from itertools import groupby

    per_window = window // PAGE
    statuses = []  # type: List[int]
    for number, group in groupby(pages, key=lambda page: page // per_window):
        first = number * per_window
        runs = [(page - first, page - first + 1) for page in group]
        statuses.extend(_statuses(fd, first * PAGE, min(window, size - first * PAGE), runs))
    return statuses


def _statuses(fd: int, offset: int, length: int, runs: Runs) -> List[int]:
    """Node or negative errno of each page of ``runs`` (cached pages of the window at
    ``offset``), in run order."""
    import ctypes

    if not runs:
        return []
    addr = _map(fd, offset, length)
    try:
        addresses = []  # type: List[int]
        with memoryview((ctypes.c_ubyte * length).from_address(addr)) as pages:
            for start, end in runs:
                # One byte read per cached page maps it into this process without I/O;
                # move_pages only reports pages that are mapped.
                pages[start * PAGE:end * PAGE:PAGE].tobytes()
                addresses.extend(range(addr + start * PAGE, addr + end * PAGE, PAGE))
        return kernel.query_page_nodes(addresses)
    finally:
        _libc("munmap")(addr, length)


def _map(fd: int, offset: int, length: int) -> int:
    """The window mapped shared and read-only; the caller unmaps it."""
    import ctypes

    addr = _libc("mmap")(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
    if addr is None or addr == _MAP_FAILED:
        raise _os_failure("mmap", ctypes.get_errno())
    # A fault on a cached page must not start readahead of uncached neighbours
    # (a plain read leaves markers that would pull in the next megabytes).
    if _libc("madvise")(addr, length, mmap.MADV_RANDOM) != 0:
        err = ctypes.get_errno()
        _libc("munmap")(addr, length)
        raise _os_failure("madvise", err)
    return addr


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


def _mappers(path: str, root: str) -> Tuple[List[int], int]:
    """(other PIDs mapping ``path``, number of processes whose maps could not be read).

    Processes that exit meanwhile are skipped; only root may read every process's maps.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise NumaError("cannot stat %s: %s; check the path" % (path, exc.strerror)) from None
    target = (os.major(info.st_dev), os.minor(info.st_dev), str(info.st_ino), os.path.realpath(path))
    own = str(os.getpid())
    pids = []
    unreadable = 0
    for entry in os.listdir(os.path.join(root, "proc")):
        if not entry.isdigit() or entry == own:
            continue
        try:
            text = proc_text(root, entry, "maps")
        except NumaError:
            unreadable += 1
            continue
        # The inode's digits first: most processes' maps never mention it, and need no parsing.
        if text is not None and target[2] in text and _maps_file(text, target):
            pids.append(int(entry))
    return sorted(pids), unreadable


def _maps_file(text: str, target: Tuple[int, int, str, str]) -> bool:
    """Whether a maps text has a mapping of the file (device and inode; or inode and
    path, because overlayfs and btrfs report another device in maps than stat does)."""
    major, minor, inode, real = target
    for _start, _perms, device, mapped_inode, mapped_path in parse_maps(text):
        if mapped_inode != inode:
            continue
        dev_major, _sep, dev_minor = device.partition(":")
        try:
            if (int(dev_major, 16), int(dev_minor, 16)) == (major, minor):
                return True
        except ValueError:
            continue
        if mapped_path == real:
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
