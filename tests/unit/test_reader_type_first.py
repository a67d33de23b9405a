"""Nothing under a root is opened before its type is known (issue 23, item 5): a device node's driver
is never called and a FIFO's writer never woken, through openat2's in-root lookup and through the walk.

Whether something was opened is what the kernel tells an inotify watch on it (IN_OPEN): a lookup to
an O_PATH fd or a stat() opens nothing, and makes no event.
"""

import ctypes
import errno
import os
import stat

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.read import kernel_files

IN_OPEN = 0x20


class OpenWatch:
    """An inotify watch for IN_OPEN on one path (a device node, a FIFO, a file)."""

    def __init__(self, path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, os.fsencode(path), IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), "inotify on %s" % path)

    def opened(self):
        try:
            return bool(os.read(self.fd, 4096))
        except BlockingIOError:
            return False

    def close(self):
        os.close(self.fd)


def watch(path):
    opened = OpenWatch(str(path))
    try:
        os.close(os.open(str(path), os.O_PATH))
        if opened.opened():
            pytest.skip("this kernel reports an O_PATH lookup as an open (IN_OPEN): no way to tell them apart")
    except BaseException:
        opened.close()
        raise
    return opened


@pytest.fixture(params=["kernel", "walk"])
def root(request, tmp_path, monkeypatch):
    """A root with proc/vmstat and proc/1/status, read through openat2 and through the walk."""
    if request.param == "walk":
        monkeypatch.setattr(kernel_files, "has_open_in_root", lambda _fd: False)
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/vmstat").write_text("numa_hit 5\n")
    (tmp_path / "proc/1/status").write_text("Name:\tinit\n")
    with kernel_files.Root(str(tmp_path)) as tree:
        assert tree._kernel_resolves == (request.param == "kernel")
        yield tree


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
@pytest.mark.parametrize("name", ["proc/vmstat", "proc/1/link"])
def test_a_device_node_is_never_opened(root, tmp_path, name):
    device = tmp_path / "dev-null"
    os.mknod(str(device), stat.S_IFCHR | 0o600, os.makedev(1, 3))
    if name == "proc/vmstat":
        os.remove(str(tmp_path / name))
        os.rename(str(device), str(tmp_path / name))
        device = tmp_path / name
    else:
        os.symlink("/dev-null", str(tmp_path / name))  # inside the root: its own dev-null
    opened = watch(device)
    try:
        with pytest.raises(OSError, match="not a regular file"):
            root.read(name)
        with pytest.raises(OSError) as error:
            root.listdir(name)
        assert error.value.errno == errno.ENOTDIR
        assert not opened.opened()
    finally:
        opened.close()


def test_a_fifo_is_never_opened(root, tmp_path):
    fifo = tmp_path / "proc/1/maps"
    os.mkfifo(str(fifo))
    opened = watch(fifo)
    try:
        with pytest.raises(OSError, match="not a regular file"):
            root.read("proc/1/maps")
        assert not opened.opened()
    finally:
        opened.close()


def test_a_regular_file_is_opened_and_read(root, tmp_path):
    opened = watch(tmp_path / "proc/1/status")
    try:
        assert root.read_with_mode("proc/1/status") == (b"Name:\tinit\n", stat.S_IFREG | 0o644)
        assert opened.opened()
    finally:
        opened.close()


def test_a_file_swapped_after_the_lookup_is_not_the_one_opened(tmp_path, monkeypatch):
    """What is opened is the object whose type was checked: a FIFO renamed over the file between the
    kernel's lookup and the open for reading is never opened, and the file's own bytes are read."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/vmstat").write_text("numa_hit 5\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    looked_up = kernel_files.open_in_root

    def swapped_after_lookup(root_fd, rel, flags):
        fd = looked_up(root_fd, rel, flags)
        if fifo.exists():
            os.rename(str(fifo), str(tmp_path / rel))
        return fd

    monkeypatch.setattr(kernel_files, "open_in_root", swapped_after_lookup)
    with kernel_files.Root(str(tmp_path)) as tree:
        if not tree._kernel_resolves:
            pytest.skip("no openat2 here: the walk reads instead")
        opened = watch(fifo)
        try:
            assert tree.read("proc/vmstat") == b"numa_hit 5\n"
            assert stat.S_ISFIFO(os.lstat(str(tmp_path / "proc/vmstat")).st_mode) and not opened.opened()
        finally:
            opened.close()


def test_without_procfs_to_reopen_through_the_walk_reads_instead(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_files, "_OWN_FDS", str(tmp_path / "no-proc/self/fd/"))
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/vmstat").write_text("numa_hit 5\n")
    with kernel_files.Root(str(tmp_path)) as tree:
        assert not tree._kernel_resolves and tree.read("proc/vmstat") == b"numa_hit 5\n"


def test_a_file_only_root_may_read_says_so_by_its_mode(root, tmp_path):
    os.chmod(str(tmp_path / "proc/vmstat"), 0o600)
    data, mode = root.read_with_mode("proc/vmstat")
    assert data == b"numa_hit 5\n" and not mode & stat.S_IROTH
