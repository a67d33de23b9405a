"""Facts stay consistent (issue 23, item 5): a locality that names no node, or a GPU memory node that is
a CPU node, is warned and the next source asked; a warning names the path and the problem, and quotes
at most a short, printable excerpt of a file, and nothing of a file not every user may read."""

import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.read.kernel_files import excerpt, printable
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.fixtures import sysfs

GPU = "sys/bus/pci/devices/0000:81:00.0"
NODE1_CPUS = list(range(40, 80)) + list(range(120, 160))


def dual_socket(**files):
    """The dual-socket GPU box with up to 8 possible nodes (so node 5 is below the limit) and ``files`` put."""
    machine = sysfs.dual_socket_gpus()
    machine.put("sys/devices/system/cpu/possible", "0-159")
    machine.put("sys/devices/system/node/possible", "0-7")
    for rel, content in files.items():
        machine.put(rel, content)
    return machine


def gpu(facts, address="0000:81:00.0"):
    return next(device for device in facts["gpus"] if device["address"] == address)


def one_line_ascii(warning):
    return warning.isascii() and warning.isprintable()


# --- a device's node: numa_node, else local_cpulist, else the local_cpus mask -------------------------


def test_a_numa_node_naming_no_node_falls_back_to_local_cpulist(tmp_path):
    facts = read(dual_socket().put(GPU + "/numa_node", "5").write(str(tmp_path)))
    assert (gpu(facts)["numa_node"], gpu(facts)["locality"]) == (1, "local_cpulist")
    assert [node["gpus"] for node in facts["nodes"]] == [[], ["0000:81:00.0", "0000:c1:00.0"]]
    assert facts["warnings"] == [
        "sys/bus/pci/devices/0000:81:00.0/numa_node: names node 5, which is not among the topology's nodes "
        "(0-1); the device's node is taken from its local CPUs"]


def test_a_numa_node_naming_no_node_falls_back_to_the_local_cpus_mask(tmp_path):
    machine = dual_socket()
    del machine.files[GPU + "/local_cpulist"]
    machine.put(GPU + "/numa_node", "5").put(GPU + "/local_cpus", sysfs.cpumask(NODE1_CPUS, 160))
    facts = read(machine.write(str(tmp_path)))
    assert (gpu(facts)["numa_node"], gpu(facts)["locality"]) == (1, "local_cpus")
    assert gpu(facts)["local_cpulist"] == "40-79,120-159"


def test_locality_names_the_file_the_cpus_came_from_when_local_cpulist_is_garbage(tmp_path):
    machine = dual_socket(**{GPU + "/numa_node": "-1", GPU + "/local_cpulist": "forty"})
    machine.put(GPU + "/local_cpus", sysfs.cpumask(NODE1_CPUS, 160))
    facts = read(machine.write(str(tmp_path)))
    assert (gpu(facts)["numa_node"], gpu(facts)["locality"]) == (1, "local_cpus")
    assert facts["warnings"] == ["sys/bus/pci/devices/0000:81:00.0/local_cpulist: not a CPU/node list of numbers "
                                 "below 160: 'forty'"]


def test_a_numa_node_naming_no_node_without_local_cpus_leaves_the_device_unplaced(tmp_path):
    facts = read(dual_socket(**{GPU + "/numa_node": "5", GPU + "/local_cpulist": ""}).write(str(tmp_path)))
    assert (gpu(facts)["numa_node"], gpu(facts)["locality"]) == (None, None)
    assert [node["gpus"] for node in facts["nodes"]] == [[], ["0000:c1:00.0"]]


def test_every_pci_device_gets_the_same_rule(tmp_path):
    nic = "sys/bus/pci/devices/0000:41:00.0"
    facts = read(dual_socket(**{nic + "/numa_node": "3"}).write(str(tmp_path)))
    assert [(n["numa_node"], n["locality"]) for n in facts["nics"]] == [(1, "local_cpulist")]
    assert any(w.startswith(nic + "/numa_node: names node 3") for w in facts["warnings"]), facts["warnings"]


# --- a GPU's memory node is a node without CPUs -------------------------------------------------------


def test_numa_status_naming_a_cpu_node_is_no_gpu_memory_node(tmp_path):
    machine = sysfs.gh200_like()
    machine.put("proc/driver/nvidia/gpus/0009:01:00.0/numa_status", "Node:      0\nStatus:    online\n")
    facts = read(machine.write(str(tmp_path)))
    assert facts["gpus"][0]["memory_node"] is None
    assert [node["gpu_memory_of"] for node in facts["nodes"]] == [[], [], [], []]
    assert facts["warnings"] == [
        "proc/driver/nvidia/gpus/0009:01:00.0/numa_status: names node 0, which has CPUs (0-71), while the driver "
        "onlines a GPU's memory as a node without CPUs; GPU memory node unknown"]


def test_numa_status_naming_a_cpu_less_node_is_the_gpu_memory_node(tmp_path):
    facts = read(sysfs.gh200_like().write(str(tmp_path)))
    assert facts["gpus"][0]["memory_node"] == 1 and facts["warnings"] == []


# --- what a warning shows of a file ----------------------------------------------------------------


@pytest.mark.parametrize("text, shown", [
    ("abc", "'abc'"),
    ("x" * 100, "'%s'... (100 characters)" % ("x" * 32)),
    ("\x1b[31m{{ lookup('pipe','id') }}\nroot:x:0:0",
     "\"\\x1b[31m{{ lookup('pipe','id') }}\\nr\"... (41 characters)"),
    ("node\u0661 \u202egpj.exe", "'node\\u0661 \\u202egpj.exe'"),
])
def test_an_excerpt_is_short_printable_ascii_on_one_line(text, shown):
    assert excerpt(text) == shown and one_line_ascii(excerpt(text))


def test_an_excerpt_of_a_file_not_everyone_may_read_shows_nothing():
    assert excerpt("root:$6$salt$hash", world_readable=False) == "(content not shown: the file is not world-readable)"


def test_printable_escapes_what_would_break_the_line():
    assert printable("devices/0000:81:00.0\n## x\x1b/numa_node") == "devices/0000:81:00.0\\n## x\\x1b/numa_node"
    assert printable("plain/path: text") == "plain/path: text"


def test_a_garbage_value_is_quoted_by_a_short_printable_excerpt(tmp_path):
    facts = read(dual_socket(**{GPU + "/numa_node": "\x1b]0;owned\x07{{ 7*7 }}<script>" + "9" * 60}).write(
        str(tmp_path)))
    assert gpu(facts)["numa_node"] == 1  # the local CPUs told it
    assert facts["warnings"] == [
        "sys/bus/pci/devices/0000:81:00.0/numa_node: expected an integer, found "
        "'\\x1b]0;owned\\x07{{ 7*7 }}<script>99999'... (87 characters)"]


def test_a_hard_link_to_a_root_only_file_puts_none_of_it_in_the_facts(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\n")
    os.chmod(str(secret), 0o600)
    root = dual_socket().write(str(tmp_path / "root"))
    for rel in (GPU + "/numa_node", GPU + "/vendor", "sys/kernel/mm/transparent_hugepage/enabled"):
        os.remove(os.path.join(root, rel))
        os.link(str(secret), os.path.join(root, rel))
    facts = read(root)
    assert (gpu(facts)["numa_node"], gpu(facts)["vendor_id"], gpu(facts)["vendor"]) == (1, None, "other")
    assert facts["kernel"]["transparent_hugepage"] is None
    assert "salt" not in repr(facts)
    assert facts["warnings"] == [
        "sys/bus/pci/devices/0000:81:00.0/vendor: not a PCI id (0x and 4 hex digits): "
        "(content not shown: the file is not world-readable)",
        "sys/bus/pci/devices/0000:81:00.0/numa_node: expected an integer, found "
        "(content not shown: the file is not world-readable)",
        "sys/kernel/mm/transparent_hugepage/enabled: no [mode] marked: "
        "(content not shown: the file is not world-readable)"]


def test_a_cpu_list_warning_quotes_an_excerpt_not_the_whole_list(tmp_path):
    facts = read(dual_socket(**{"sys/devices/system/cpu/isolated": "0-3," * 200}).write(str(tmp_path)))
    assert facts["warnings"] == ["sys/devices/system/cpu/isolated: not a CPU/node list of numbers below 160: "
                                 "'0-3,0-3,0-3,0-3,0-3,0-3,0-3,0-3,'... (800 characters)"]


def test_a_list_from_the_cpuset_fallback_is_warned_under_its_own_file(tmp_path):
    machine = sysfs.amd_nps4()
    machine.put("proc/self/status", "Name:\tpython3\n")
    machine.put("proc/self/cpuset", "/batch")
    machine.put("proc/mounts", "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0")
    machine.put("sys/fs/cgroup/cpuset/batch/cpuset.cpus", "0-3")
    machine.put("sys/fs/cgroup/cpuset/batch/cpuset.mems", "0-x")
    facts = read(machine.write(str(tmp_path)))
    assert (facts["cpus"]["allowed"], facts["cpus"]["mems_allowed"]) == ("0-3", "")
    assert facts["warnings"] == ["sys/fs/cgroup/cpuset/batch/cpuset.mems: not a CPU/node list of numbers below "
                                 "1024: '0-x'"]


def test_a_directory_name_with_a_newline_still_makes_a_one_line_warning(tmp_path):
    machine = dual_socket()
    for rel, content in list(machine.files.items()):
        if rel.startswith(GPU + "/"):
            machine.put(rel.replace("0000:81:00.0", "0000:81:00.0\n## pwned"), content)
    machine.put(GPU.replace("0000:81:00.0", "0000:81:00.0\n## pwned") + "/numa_node", "x")
    facts = read(machine.write(str(tmp_path)))
    assert "sys/bus/pci/devices/0000:81:00.0\\n## pwned/numa_node: expected an integer, found 'x'" in facts["warnings"]
    assert all(one_line_ascii(warning) for warning in facts["warnings"]), facts["warnings"]


@pytest.mark.parametrize("vendor", ["0x10de\n", "0X10DE", "0x10de0", "nvidia", "0x10dé"])
def test_a_pci_id_is_what_sysfs_prints_or_nothing(tmp_path, vendor):
    machine = dual_socket()
    machine.files[GPU + "/vendor"] = vendor
    facts = read(machine.write(str(tmp_path)))
    kept = vendor.strip() == "0x10de"
    assert gpu(facts)["vendor_id"] == ("0x10de" if kept else None)
    assert bool(facts["warnings"]) != kept and all(one_line_ascii(warning) for warning in facts["warnings"])
