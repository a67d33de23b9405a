"""The page cache for real: util-linux fincore is the independent witness of what is cached, and a process of its own
maps the file."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import pagecache
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

from tests.tools import missing
from tests.unit.test_pagecache import (PAGE, PAGES, SIZE, cache_runs, disk_dir,  # noqa: F401 (disk_dir: a fixture)
                                       drop, write_file)


def fincore_pages(path):
    if shutil.which("fincore") is None:
        missing("util-linux fincore is not installed")
    out = subprocess.run(["fincore", "--raw", "--noheadings", "--output", "PAGES", path],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[0])


def settled_pages(path):
    """fincore's count once the reads in flight are done: it counts only pages read in
    full, and a loaded disk can take a while with the read's own readahead."""
    counts = [fincore_pages(path)]
    while len(counts) < 3 or len(set(counts[-3:])) > 1:
        time.sleep(0.1)
        counts.append(fincore_pages(path))
        assert len(counts) < 100, "the page cache of %s keeps changing: %s" % (path, counts)
    return counts[-1]


@pytest.fixture
def cached_file(disk_dir):
    path = write_file(os.path.join(disk_dir, "model.bin"), SIZE)
    assert fincore_pages(path) == PAGES
    return path


@pytest.fixture
def mapper(cached_file):
    """Another process that maps the file and keeps it mapped."""
    code = ("import mmap, sys, time\n"
            "handle = open(sys.argv[1], 'rb')\n"
            "view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)\n"
            "view[0]\n"
            "print('mapped', flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, cached_file], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "mapped"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_cached_file_is_all_on_node_0(cached_file):
    result = pagecache.file_residency(cached_file)
    assert result == {"path": cached_file, "size_bytes": SIZE, "pages": PAGES, "cached_pages": PAGES,
                      "nodes": {"0": PAGES}, "unresolved_pages": 0}
    assert fincore_pages(cached_file) == PAGES


def test_scan_reads_no_uncached_page(cached_file):
    drop(cached_file)
    assert fincore_pages(cached_file) == 0
    cache_runs(cached_file, [(0, 64), (480, 64)])
    cached = fincore_pages(cached_file)
    assert 128 <= cached < PAGES
    # small windows: the second run crosses the boundary at page 500
    for window in (pagecache.WINDOW_BYTES, 100 * PAGE):
        result = pagecache.file_residency(cached_file, window_bytes=window)
        assert (result["cached_pages"], result["nodes"]) == (cached, {"0": cached})
    assert fincore_pages(cached_file) == cached


def test_scan_starts_no_readahead(cached_file):
    # A plain read leaves a readahead marker on a cached page; faulting that page in
    # through an ordinary mapping would read the next megabytes from disk.
    drop(cached_file)
    with open(cached_file, "rb") as handle:
        handle.read(16 * PAGE)
    cached = settled_pages(cached_file)
    assert 16 <= cached < PAGES
    assert pagecache.file_residency(cached_file)["cached_pages"] == cached
    for _ in range(5):  # readahead is asynchronous: give it time to show
        time.sleep(0.1)
        assert fincore_pages(cached_file) == cached


def test_evict_with_no_local_node_drops_every_page(cached_file):
    result = pagecache.evict_remote(cached_file, [])
    assert result["before"] == {"0": PAGES}
    assert result["after"] == {}
    assert (result["evicted_pages"], result["requested_pages"]) == (PAGES, PAGES)
    assert (result["skipped_reason"], result["mapped_by"]) == (None, [])
    assert fincore_pages(cached_file) == 0


def test_evict_keeps_pages_on_local_nodes(cached_file):
    result = pagecache.evict_remote(cached_file, [0])
    assert result["before"] == result["after"] == {"0": PAGES}
    assert (result["evicted_pages"], result["requested_pages"]) == (0, 0)
    assert fincore_pages(cached_file) == PAGES


def test_evict_refuses_while_another_process_maps_the_file(cached_file, mapper):
    result = pagecache.evict_remote(cached_file, [])
    assert mapper.pid in result["mapped_by"] and os.getpid() not in result["mapped_by"]
    assert str(mapper.pid) in result["skipped_reason"]
    assert any(str(mapper.pid) in warning for warning in result["warnings"])
    assert (result["evicted_pages"], result["requested_pages"]) == (0, 0)
    assert result["before"] == result["after"] == {"0": PAGES}
    assert fincore_pages(cached_file) == PAGES


def test_mappers_are_read_from_the_proc_tree_under_root_and_odd_entries_tolerated(cached_file, tmp_path):
    info = os.stat(cached_file)
    dev = "%02x:%02x" % (os.major(info.st_dev), os.minor(info.st_dev))
    other_dev = "%02x:%02x" % (os.major(info.st_dev) + 1, os.minor(info.st_dev))
    maps = {
        "123": "7f00-7f10 r--s 00000000 %s %d %s\n" % (dev, info.st_ino, cached_file),
        str(os.getpid()): "7f00-7f10 r--s 00000000 %s %d %s\n" % (dev, info.st_ino, cached_file),
        "456": "7f00-7f10 r-xp 00000000 %s %d /usr/bin/other\n" % (dev, info.st_ino + 1),
        # overlayfs/btrfs: another device in maps than stat() reports, same inode and path
        "555": "55-56 rw-p 0 00:00 0 [heap]\n7f00-7f10 r--s 0 %s %d %s\n" % (other_dev, info.st_ino, cached_file),
        "666": "7f00-7f10 r--s 0 %s %d /elsewhere/model.bin\n" % (other_dev, info.st_ino),
    }
    proc = tmp_path / "proc"
    for pid, text in maps.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "maps").write_text(text)
    (proc / "789").mkdir()  # exited: no maps any more
    (proc / "321" / "maps").mkdir(parents=True)  # unreadable
    (proc / "self").mkdir()
    result = pagecache.evict_remote(cached_file, [], root=str(tmp_path))
    assert result["mapped_by"] == [123, 555] and "123, 555" in result["skipped_reason"]
    assert any("could not read the memory maps of 1 process(es)" in warning for warning in result["warnings"])


def test_evict_checks_local_nodes(cached_file):
    with pytest.raises(NumaError, match="local node"):
        pagecache.evict_remote(cached_file, ["0"])


def test_sample_of_a_cached_file_agrees_with_the_full_scan(cached_file):
    full = pagecache.file_residency(cached_file)
    sample = pagecache.sample_residency(cached_file)
    assert sample == dict(full, node_percent={"0": 100.0}, sampled_pages=pagecache.FIRST_SAMPLE, bound_pp=1.0,
                          confidence=0.99, estimate="sampled 688 of %d cached pages; node fractions within "
                                                   "\u00b11 pp (99 %%)" % PAGES)
    assert fincore_pages(cached_file) == PAGES


@pytest.mark.parametrize("cachestat", [True, False], ids=["cachestat", "mincore-only"])
def test_sample_of_a_partly_cached_file_counts_its_pages_and_reads_no_other(cached_file, monkeypatch, cachestat):
    cache_runs(cached_file, [(0, 400), (550, 400)])
    cached = fincore_pages(cached_file)
    assert pagecache.FIRST_SAMPLE < cached < PAGES
    if not cachestat:  # a kernel before 6.5, or a seccomp filter that refuses it
        monkeypatch.setattr(pagecache, "_cachestat", lambda fd, offset, length: None)
    # small windows: some all cached, some partly, some not at all
    sample = pagecache.sample_residency(cached_file, window_bytes=100 * PAGE)
    assert (sample["cached_pages"], sample["nodes"], sample["unresolved_pages"]) == (cached, {"0": cached}, 0)
    assert (sample["sampled_pages"], sample["bound_pp"]) == (pagecache.FIRST_SAMPLE, 1.0)
    assert pagecache.file_residency(cached_file, window_bytes=100 * PAGE)["cached_pages"] == cached
    assert fincore_pages(cached_file) == cached


def test_cachestat_counts_what_fincore_counts(cached_file):
    fd = os.open(cached_file, os.O_RDONLY)
    try:
        counted = pagecache._cachestat(fd, 0, SIZE)
        if counted is None:
            pytest.skip("cachestat(2) is unavailable here (Linux < 6.5 or a seccomp filter)")
        assert counted == PAGES
        os.posix_fadvise(fd, 0, SIZE // 2, os.POSIX_FADV_DONTNEED)
        assert pagecache._cachestat(fd, 0, SIZE) == fincore_pages(cached_file) <= PAGES // 2 + 1
        assert pagecache._cachestat(fd, SIZE // 2, SIZE // 2) == PAGES // 2
    finally:
        os.close(fd)
