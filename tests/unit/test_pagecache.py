"""pagecache.py on this one-node host: residency, mappers, eviction.

util-linux ``fincore`` is the independent witness of what is cached. Files live on a
disk file system: POSIX_FADV_DONTNEED does nothing on tmpfs.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa import pagecache
from ansible_collections.inferops.numa.plugins.module_utils.numa.errors import NumaError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = pagecache.PAGE
SIZE = 4 << 20
PAGES = SIZE // PAGE


def fs_type(path):
    """Type of the file system holding ``path`` (longest matching mount point)."""
    best, kind = "", ""
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            inside = path == point or path.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


def fincore_pages(path):
    if shutil.which("fincore") is None:
        pytest.skip("util-linux fincore is not installed")
    out = subprocess.run(["fincore", "--raw", "--noheadings", "--output", "PAGES", path],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[0])


def write_file(path, size):
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())  # clean pages: DONTNEED skips dirty ones
    return path


def drop(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def disk_dir():
    for base in ("/var/tmp", os.path.join(REPO, "build")):
        real = os.path.realpath(base)
        if os.path.isdir(real) and fs_type(real) not in ("", "tmpfs", "ramfs"):
            path = tempfile.mkdtemp(prefix="pagecache-test-", dir=real)
            yield path
            shutil.rmtree(path)
            return
    pytest.skip("no disk-backed directory: POSIX_FADV_DONTNEED does nothing on tmpfs")


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
    fd = os.open(cached_file, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, 64 * PAGE, 0)
        os.pread(fd, 64 * PAGE, 480 * PAGE)
    finally:
        os.close(fd)
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
    cached = fincore_pages(cached_file)
    assert 16 <= cached < PAGES
    assert pagecache.file_residency(cached_file)["cached_pages"] == cached
    for _ in range(5):  # readahead is asynchronous: give it time to show
        time.sleep(0.1)
        assert fincore_pages(cached_file) == cached


def test_directory_residency_sums_each_file_once(disk_dir):
    write_file(os.path.join(disk_dir, "a.gguf"), 1 << 20)
    os.mkdir(os.path.join(disk_dir, "sub"))
    write_file(os.path.join(disk_dir, "sub", "b.gguf"), 2 << 20)
    write_file(os.path.join(disk_dir, "empty"), 0)
    os.symlink("a.gguf", os.path.join(disk_dir, "z-link-to-a"))
    result = pagecache.residency([disk_dir])
    assert [os.path.relpath(entry["path"], disk_dir) for entry in result["files"]] == [
        "a.gguf", "empty", os.path.join("sub", "b.gguf")]
    pages = (3 << 20) // PAGE
    assert (result["size_bytes"], result["pages"], result["cached_pages"]) == (3 << 20, pages, pages)
    assert result["nodes"] == {"0": pages}
    assert result["files"][1]["pages"] == 0 and result["files"][1]["nodes"] == {}


@pytest.mark.parametrize("name", [".", "missing.bin"])
def test_file_residency_wants_an_existing_regular_file(disk_dir, name):
    with pytest.raises(NumaError, match="regular file|cannot open"):
        pagecache.file_residency(os.path.join(disk_dir, name))


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
    assert mapper.pid in pagecache.mapping_pids(cached_file)
    assert os.getpid() not in pagecache.mapping_pids(cached_file)
    result = pagecache.evict_remote(cached_file, [])
    assert mapper.pid in result["mapped_by"]
    assert str(mapper.pid) in result["skipped_reason"]
    assert any(str(mapper.pid) in warning for warning in result["warnings"])
    assert (result["evicted_pages"], result["requested_pages"]) == (0, 0)
    assert result["before"] == result["after"] == {"0": PAGES}
    assert fincore_pages(cached_file) == PAGES


def test_mapping_pids_reads_a_proc_tree_and_tolerates_odd_entries(cached_file, tmp_path):
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
    for pid, text in maps.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "maps").write_text(text)
    (tmp_path / "789").mkdir()  # exited: no maps any more
    (tmp_path / "321" / "maps").mkdir(parents=True)  # unreadable
    (tmp_path / "self").mkdir()
    assert pagecache.mapping_pids(cached_file, proc_root=str(tmp_path)) == [123, 555]
    result = pagecache.evict_remote(cached_file, [], proc_root=str(tmp_path))
    assert result["mapped_by"] == [123, 555] and "123, 555" in result["skipped_reason"]
    assert any("could not read the memory maps of 1 process(es)" in warning for warning in result["warnings"])


def test_evict_checks_local_nodes(cached_file):
    with pytest.raises(NumaError, match="local node"):
        pagecache.evict_remote(cached_file, ["0"])


def test_remote_runs_coalesce_pages_on_other_nodes():
    # what a two-node host would report: runs of cached pages and each page's node
    runs = [(0, 4), (6, 9)]
    statuses = [0, 1, 1, 0, 1, 1, -2]
    assert pagecache._remote_runs(runs, statuses, {0}) == [(1, 3), (6, 8)]
    assert pagecache._remote_runs(runs, statuses, set()) == [(0, 4), (6, 8)]
    assert pagecache._remote_runs(runs, statuses, {0, 1}) == []


def test_resident_runs_use_only_the_low_bit():
    assert pagecache._runs(bytes([1, 3, 0, 1, 2, 0, 0x81])) == [(0, 2), (3, 4), (6, 7)]
    assert pagecache._runs(bytes([0, 0])) == []


def test_a_file_this_user_neither_owns_nor_may_write_is_refused_not_misread(tmp_path, monkeypatch):
    # mincore() would report every page of it as cached (Linux >= 5.0), and the scan would read it all.
    from ansible_collections.inferops.numa.plugins.module_utils.numa import pagecache

    model = tmp_path / "model.gguf"
    model.write_bytes(b"\1" * 8192)
    monkeypatch.setattr(pagecache.os, "geteuid", lambda: 4242)
    monkeypatch.setattr(pagecache.os, "access", lambda path, mode: False)
    with pytest.raises(NumaError, match="only to the file's owner"):
        pagecache.file_residency(str(model))
