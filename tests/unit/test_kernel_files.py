"""The one reader of each kernel file several modules read: fake trees under a root, and this host."""

import errno
import os
import re
import signal
import stat

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.base import cpulist
from ansible_collections.inferops.numa.plugins.module_utils.numa.system import kernel
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import kernel_files
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

# Seeded and bounded: the same few hundred texts at every run.
PARSER_SETTINGS = settings(max_examples=300, deadline=None, derandomize=True)


def put(root, rel, text):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def test_status_of_a_process_and_of_a_thread_under_a_root(tmp_path):
    put(tmp_path, "proc/42/status", "Name:\tllama server\nVmRSS:\t   812 kB\nCpus_allowed_list:\t0-3\n")
    put(tmp_path, "proc/42/task/43/status", "Name:\tworker\nCpus_allowed_list:\t2\n")
    status = kernel_files.read_status(str(tmp_path), 42)
    assert status == {"Name": "llama server", "VmRSS": "812 kB", "Cpus_allowed_list": "0-3"}
    assert kernel_files.read_status(str(tmp_path), 42, tid=43)["Cpus_allowed_list"] == "2"
    assert kernel_files.read_status(str(tmp_path), 7) is None  # gone: not an error


def test_an_unreadable_proc_file_is_an_error_that_names_it(tmp_path):
    os.makedirs(str(tmp_path / "proc/42/maps"))  # a directory where a file should be
    with pytest.raises(NumaError, match="cannot read .*proc/42/maps"):
        kernel_files.proc_text(str(tmp_path), 42, "maps")


def test_this_process_status_is_read_from_the_real_root():
    status = kernel_files.read_status("/", "self")
    assert status["Pid"] == str(os.getpid()) and status["Cpus_allowed_list"]


def test_maps_give_start_permissions_device_inode_and_a_path_with_spaces():
    text = ("55d4c1a00000-55d4c1b78000 r-xp 00000000 08:01 1234 /opt/llama/bin/llama server\n"
            "7ffc8a1e0000-7ffc8a201000 rw-p 00000000 00:00 0 \n"
            "garbage\n")
    assert kernel_files.parse_maps(text) == [
        (0x55d4c1a00000, "r-xp", "08:01", "1234", "/opt/llama/bin/llama server"),
        (0x7ffc8a1e0000, "rw-p", "00:00", "0", "")]


def test_counter_files_keep_numeric_name_value_lines(tmp_path):
    put(tmp_path, "proc/vmstat", "nr_free_pages 1000\nnuma_hit 5\nbroken line here\nnuma_miss x\n")
    assert kernel_files.read_vmstat(str(tmp_path)) == {"nr_free_pages": 1000, "numa_hit": 5}
    assert kernel_files.read_counter_file(str(tmp_path), "sys/devices/system/node/node0/numastat") == {}


def test_node_ids_are_the_numbered_node_entries_in_number_order(tmp_path):
    for name in ("node10", "node2", "node0", "nodes", "has_cpu", "node1x"):
        put(tmp_path, "sys/devices/system/node/%s/x" % name, "")
    assert kernel_files.node_ids(str(tmp_path)) == [0, 2, 10]
    assert kernel_files.node_ids(str(tmp_path), "sys/kernel/mm/mempolicy/weighted_interleave") == []


@pytest.fixture(params=["kernel", "walk"])
def tree(request, tmp_path, monkeypatch):
    """A root holding proc/, with a file of the same name outside it that no read may reach; read with
    openat2's in-root lookup, and with the walk from the root fd that stands in where the kernel has none."""
    if request.param == "walk":
        monkeypatch.setattr(kernel_files, "has_open_in_root", lambda _fd: False)
    put(tmp_path, "outside/secret", "outside\n")
    put(tmp_path, "root/secret", "inside\n")
    put(tmp_path, "root/proc/1/status", "Name:\tinit\n")
    return tmp_path


@pytest.mark.parametrize("link", ["/secret", "../../../../secret", "../../../../proc/../secret",
                                  "/proc/../../../secret", "./../../secret"])
def test_a_link_resolves_inside_the_root_as_in_a_chroot(tree, link):
    os.symlink(link, str(tree / "root/proc/1/link"))
    with kernel_files.Root(str(tree / "root")) as root:
        assert root.read("proc/1/link") == b"inside\n"


@pytest.mark.parametrize("rel", ["../outside/secret", "proc/../../outside/secret", "/../../outside/secret"])
def test_dot_dot_stops_at_the_root(tree, rel):
    with kernel_files.Root(str(tree / "root")) as root:
        with pytest.raises(FileNotFoundError):
            root.read(rel)
        assert root.read("proc/1/../../../secret") == b"inside\n"


def test_a_link_to_a_directory_is_followed_inside_the_root(tree):
    os.symlink("/proc/1", str(tree / "root/proc/self"))
    os.symlink("../../outside", str(tree / "root/proc/escape"))
    with kernel_files.Root(str(tree / "root")) as root:
        assert root.read("proc/self/status") == b"Name:\tinit\n"
        assert root.listdir("proc/self") == ["status"] and root.exists("proc/self/status")
        assert not root.exists("proc/escape/secret")
    assert kernel_files.read_status(str(tree / "root"), "self") == {"Name": "init"}


@pytest.mark.parametrize("links", [{"loop": "loop"}, {"a": "b", "b": "a/x"}, {"loop": "/proc/1/loop/status"}])
def test_a_link_loop_ends_in_an_error(tree, links):
    for name, target in links.items():
        os.symlink(target, str(tree / "root/proc/1" / name))
    with kernel_files.Root(str(tree / "root")) as root:
        for name in links:
            with pytest.raises(OSError) as error:
                root.read("proc/1/" + name)
            assert error.value.errno == errno.ELOOP


def test_a_fifo_is_refused_without_blocking(tree):
    os.mkfifo(str(tree / "root/proc/1/maps"))
    signal.alarm(10)  # a blocking open would end the test here, not hang it
    try:
        with pytest.raises(NumaError, match="not a regular file"):
            kernel_files.proc_text(str(tree / "root"), 1, "maps")
    finally:
        signal.alarm(0)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_character_device_is_never_read(tree):
    os.mknod(str(tree / "root/proc/vmstat"), stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero
    assert kernel_files.read_vmstat(str(tree / "root")) == {}
    with kernel_files.Root(str(tree / "root")) as root:
        with pytest.raises(OSError, match="not a regular file"):
            root.read("proc/vmstat")


def test_a_read_stops_past_its_limit(tree):
    put(tree, "root/proc/1/maps", "x" * 100)
    with kernel_files.Root(str(tree / "root")) as root:
        assert len(root.read("proc/1/maps", limit=100)) == 100
        with pytest.raises(OSError) as error:
            root.read("proc/1/maps", limit=99)
    assert error.value.errno == errno.EFBIG


def test_the_kernel_resolves_inside_a_root_from_linux_5_6(tmp_path):
    major, minor = (int(part) for part in re.match(r"(\d+)\.(\d+)", os.uname().release).groups())
    with kernel_files.Root(str(tmp_path)) as root:
        assert root._kernel_resolves == ((major, minor) >= (5, 6))


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.EPERM])
def test_without_openat2_the_root_is_walked(tmp_path, monkeypatch, err):
    """An old kernel answers ENOSYS, a container's seccomp filter ENOSYS or EPERM."""
    def refused(_root_fd, _rel, _flags):
        raise OSError(err, os.strerror(err))
    monkeypatch.setattr(kernel, "open_in_root", refused)
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert not kernel.has_open_in_root(root_fd)
    finally:
        os.close(root_fd)
    put(tmp_path, "proc/1/status", "Name:\tinit\n")
    monkeypatch.setattr(kernel_files, "open_in_root", refused)
    with kernel_files.Root(str(tmp_path)) as root:
        assert not root._kernel_resolves and root.read("proc/1/status") == b"Name:\tinit\n"


def test_this_host_is_read_by_plain_paths():
    with kernel_files.Root("/") as root:
        assert b"Pid:" in root.read("proc/self/status") and "self" in root.listdir("proc")


def test_huge_counters_are_left_out(tmp_path):
    put(tmp_path, "proc/vmstat", "numa_hit %s\nnuma_miss 3\nnuma_foreign -1\n" % ("9" * 5000))
    assert kernel_files.read_vmstat(str(tmp_path)) == {"numa_miss": 3}


@pytest.mark.parametrize("names, expected", [
    (["node0", "node1", "node10", "node01", "node\u0661", "node", "node1x", "node-1", "node+1", "nodes"], [0, 1, 10]),
    (["node999999999", "node1000000000"], [999999999]),
])
def test_numbered_entries_are_spelled_as_the_kernel_prints_them(names, expected):
    assert kernel_files.numbered(names, "node") == expected


@PARSER_SETTINGS
@given(st.text(alphabet="0123456789abcdefxX-+_ \u0661", max_size=30) | st.text(max_size=30))
def test_parse_integer_is_an_int_or_none_for_any_text(text):
    number = cpulist.parse_integer(text)
    if number is not None:
        assert number == (int(text, 16) if text[:2].lower() == "0x" else int(text))
        assert abs(number) < 1 << 80
        assert not (set(text) - set("0123456789abcdefABCDEFxX-"))


@PARSER_SETTINGS
@given(st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1))
def test_parse_integer_reads_every_64_bit_number_the_kernel_prints(number):
    assert cpulist.parse_integer(str(number)) == number
    if number >= 0:
        assert cpulist.parse_integer("0x%x" % number) == number
