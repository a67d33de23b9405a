"""The one reader of each kernel file several modules read: fake trees under a root, and this host."""

import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa import kernel_files
from ansible_collections.inferops.numa.plugins.module_utils.numa.errors import NumaError


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
