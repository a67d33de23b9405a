"""The sysfs reader on synthetic machines: every real-world rule of issue 2."""

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import topology
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import memory_classes, read

from tests.fixtures import sysfs


def build(tmp_path, recipe):
    return read(sysfs.RECIPES[recipe]().write(str(tmp_path)))


def node(facts, node_id):
    return next(n for n in facts["nodes"] if n["id"] == node_id)


def test_dual_socket_nodes_cpus_memory_and_distances(tmp_path):
    facts = build(tmp_path, "dual_socket_gpus")
    assert facts["schema_version"] == 1
    assert facts["node_count"] == 2
    assert node(facts, 0)["cpulist"] == "0-39,80-119"
    assert node(facts, 1)["cpus"] == list(range(40, 80)) + list(range(120, 160))
    assert node(facts, 0)["memory_total_kb"] == 256 * sysfs.GIB_KB
    assert node(facts, 0)["memory_available_kb"] == (200 + 20 - 1) * sysfs.GIB_KB
    assert node(facts, 1)["distances"] == {"0": 21, "1": 10}
    assert facts["distances"] == [[10, 21], [21, 10]]
    assert node(facts, 0)["hugepages"] == {"2048kB": {"total": 0, "free": 0}}
    assert node(facts, 1)["packages"] == [1]
    assert facts["warnings"] == []
    json.dumps(facts)


def test_dual_socket_smt_packages_and_caches(tmp_path):
    cpus = build(tmp_path, "dual_socket_gpus")["cpus"]
    assert cpus["threads_per_core"] == 2
    assert cpus["siblings"][0] == [0, 80]
    assert len(cpus["siblings"]) == 80
    assert cpus["packages"] == [
        {"id": 0, "cpulist": "0-39,80-119", "nodes": [0]},
        {"id": 1, "cpulist": "40-79,120-159", "nodes": [1]},
    ]
    assert [group["cpulist"] for group in cpus["l3_groups"]] == ["0-39,80-119", "40-79,120-159"]
    assert cpus["caches"] == {"l1d_kb": 48, "l2_kb": 2048, "l3_kb": 32768}
    assert cpus["online"] == "0-159" and cpus["offline"] == ""
    assert cpus["allowed"] == "0-159" and cpus["mems_allowed"] == "0-1"


def test_gpus_by_pci_class_without_bmc_or_nvswitch(tmp_path):
    facts = build(tmp_path, "dual_socket_gpus")
    assert [gpu["address"] for gpu in facts["gpus"]] == ["0000:81:00.0", "0000:c1:00.0"]
    first = facts["gpus"][0]
    assert first["vendor"] == "nvidia" and first["vendor_id"] == "0x10de"
    assert first["class"] == "0x030200" and first["numa_node"] == 1 and first["cuda_index"] == 0
    assert facts["gpus"][1]["cuda_index"] == 1
    assert node(facts, 1)["gpus"] == ["0000:81:00.0", "0000:c1:00.0"]
    assert node(facts, 0)["gpus"] == []
    assert facts["nics"] == [{"address": "0000:41:00.0", "vendor_id": "0x15b3", "vendor": "other",
                              "device_id": "0x101d", "class": "0x020000", "numa_node": 1, "locality": "numa_node",
                              "local_cpulist": "40-79,120-159", "pci_path": [], "name": "ens1f0", "rdma_name": None,
                              "rdma_ports": []}]
    assert [(d["address"], d["name"]) for d in facts["nvme"]] == [("0000:01:00.0", "nvme0")]


def test_amd_nps4_eight_nodes_two_packages(tmp_path):
    facts = build(tmp_path, "amd_nps4")
    assert facts["node_count"] == 8
    assert node(facts, 5)["distances"]["4"] == 12 and node(facts, 5)["distances"]["0"] == 32
    assert [p["nodes"] for p in facts["cpus"]["packages"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert facts["cpus"]["threads_per_core"] == 1


def test_grace_like_cpuless_gpu_memory_nodes(tmp_path):
    facts = build(tmp_path, "grace_like")
    assert [(n["id"], n["has_cpus"], n["has_memory"]) for n in facts["nodes"]] == [
        (0, True, True), (1, False, True), (2, False, True)]
    assert node(facts, 1)["cpus"] == [] and node(facts, 1)["cpulist"] == ""
    assert facts["gpus"][0]["numa_node"] == 1
    assert node(facts, 1)["gpus"] == ["0009:01:00.0"]


def test_cxl_sparse_node_ids_and_distance_order(tmp_path):
    facts = build(tmp_path, "cxl_memory_node")
    assert [n["id"] for n in facts["nodes"]] == [0, 1, 8]
    assert node(facts, 8)["has_cpus"] is False
    assert node(facts, 8)["distances"] == {"0": 14, "1": 24, "8": 10}
    assert facts["distances"][0] == [10, 21, 14]


def test_vm_without_node_directory_is_one_node(tmp_path):
    facts = build(tmp_path, "vm_without_nodes")
    assert facts["node_count"] == 1
    only = facts["nodes"][0]
    assert only["id"] == 0 and only["cpus"] == [0, 1, 2, 3] and only["distances"] == {"0": 10}
    assert only["memory_total_kb"] == 8 * sysfs.GIB_KB and only["has_memory"]
    assert facts["distances"] == [[10]]
    # A device without a node on a one-node host stays without one.
    assert facts["gpus"][0]["numa_node"] is None


def test_cgroup_restricted_process(tmp_path):
    facts = build(tmp_path, "cgroup_restricted")
    assert facts["cpus"]["allowed"] == "40-59"
    assert facts["cpus"]["mems_allowed"] == "1"
    assert node(facts, 0)["cpulist"] == "0-39,80-119"


def test_offline_cpus_never_in_a_node(tmp_path):
    machine = sysfs.Machine()
    machine.add_cpus(list(range(8)), package=0, offline=[3, 5])
    machine.add_node(0, range(8), sysfs.GIB_KB, sysfs.GIB_KB)
    machine.finish(online=[0, 1, 2, 4, 6, 7], nodes=[0], has_cpu=[0], has_memory=[0])
    facts = read(machine.write(str(tmp_path)))
    assert facts["nodes"][0]["cpus"] == [0, 1, 2, 4, 6, 7]
    assert facts["cpus"]["offline"] == "3,5"


def test_online_derived_per_cpu_when_no_online_file(tmp_path):
    machine = sysfs.Machine()
    machine.add_cpus(list(range(4)), package=0, offline=[2])
    machine.add_node(0, range(4), sysfs.GIB_KB, sysfs.GIB_KB)
    machine.finish(online=[0, 1, 3])
    root = machine.write(str(tmp_path))
    os.remove(os.path.join(root, "sys/devices/system/cpu/online"))
    assert read(root)["cpus"]["online"] == "0-1,3"


def test_cpumap_longer_than_32_bits_when_cpulist_missing(tmp_path):
    machine = sysfs.dual_socket_gpus()
    root = machine.write(str(tmp_path))
    os.remove(os.path.join(root, "sys/devices/system/node/node1/cpulist"))
    with open(os.path.join(root, "sys/devices/system/node/node1/cpumap")) as handle:
        assert handle.read().count(",") == 4  # 160 CPUs -> five 32-bit words
    facts = read(root)
    assert node(facts, 1)["cpus"] == list(range(40, 80)) + list(range(120, 160))


def test_numa_node_minus_one_derived_from_local_cpulist(tmp_path):
    machine = sysfs.dual_socket_gpus()
    machine.add_pci("0000:82:00.0", 0x030200, 0x10de, 0x2330, -1, range(40, 80))
    machine.add_pci("0000:83:00.0", 0x030200, 0x1002, 0x74a1, -1, range(160))
    facts = read(machine.write(str(tmp_path)))
    by_address = {gpu["address"]: gpu for gpu in facts["gpus"]}
    assert by_address["0000:82:00.0"]["numa_node"] == 1
    assert by_address["0000:83:00.0"]["numa_node"] is None
    assert by_address["0000:83:00.0"]["vendor"] == "amd" and by_address["0000:83:00.0"]["cuda_index"] is None
    assert [gpu["cuda_index"] for gpu in facts["gpus"] if gpu["vendor"] == "nvidia"] == [0, 1, 2]


@pytest.mark.parametrize("rel, content", [
    ("sys/devices/system/node/node0/meminfo", "\x00\x00garbage"),
    ("sys/devices/system/node/node0/distance", "ten twenty-one"),
    ("sys/devices/system/node/node0/cpulist", "zero-three"),
    ("sys/devices/system/node/node1/distance", "10 21 30"),
    ("sys/bus/pci/devices/0000:81:00.0/numa_node", "one"),
    ("sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "x"),
    ("proc/self/status", "Cpus_allowed_list:\tnonsense\n"),
    ("sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages", ""),
    ("sys/devices/system/cpu/cpu0/cache/index3/size", "big"),
    ("proc/meminfo", ""),
])
def test_garbage_becomes_a_warning_never_an_exception(tmp_path, rel, content):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    with open(os.path.join(root, rel), "w") as handle:
        handle.write(content)
    facts = read(root)
    assert facts["node_count"] == 2
    json.dumps(facts)
    if rel != "proc/meminfo":
        assert any(rel in warning for warning in facts["warnings"]), facts["warnings"]


def test_missing_node_files_warn(tmp_path):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    os.remove(os.path.join(root, "sys/devices/system/node/node1/meminfo"))
    facts = read(root)
    assert node(facts, 1)["memory_total_kb"] == 0 and node(facts, 1)["has_memory"] is True
    assert any("node1/meminfo" in warning for warning in facts["warnings"])


def test_empty_root_is_a_one_node_machine_with_warnings(tmp_path):
    facts = read(str(tmp_path))
    assert facts["node_count"] == 1 and facts["nodes"][0]["cpus"] == []
    assert any("meminfo" in warning for warning in facts["warnings"])


def test_root_that_is_not_a_directory_is_a_clear_error(tmp_path):
    with pytest.raises(NumaError, match="not a directory"):
        read(str(tmp_path / "missing"))


def test_kernel_knobs_and_absent_ones(tmp_path):
    machine = sysfs.dual_socket_gpus()
    machine.put("sys/kernel/mm/mempolicy/weighted_interleave/node0", "3")
    machine.put("sys/kernel/mm/mempolicy/weighted_interleave/node1", "1")
    facts = read(machine.write(str(tmp_path / "a")))
    features = facts["kernel"].pop("features")
    assert facts["kernel"] == {"numa_balancing": 1, "zone_reclaim_mode": 0, "transparent_hugepage": "madvise",
                               "weighted_interleave": {"0": 3, "1": 1}}
    assert features["weighted_interleave"] is True and features["memory_tiering"] is False
    bare = read(sysfs.vm_without_nodes().write(str(tmp_path / "b")))
    assert bare["kernel"]["weighted_interleave"] is None
    os.remove(str(tmp_path / "b/proc/sys/kernel/numa_balancing"))
    assert read(str(tmp_path / "b"))["kernel"]["numa_balancing"] is None


def test_cpuset_fallback_when_status_has_no_allowed_lines(tmp_path):
    machine = sysfs.amd_nps4()
    machine.put("proc/self/status", "Name:\tpython3\n")
    machine.put("proc/self/cpuset", "/batch")
    machine.put("proc/mounts", "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0")
    machine.put("sys/fs/cgroup/cpuset/batch/cpuset.cpus", "16-31")
    machine.put("sys/fs/cgroup/cpuset/batch/cpuset.mems", "1")
    cpus = read(machine.write(str(tmp_path)))["cpus"]
    assert (cpus["allowed"], cpus["mems_allowed"]) == ("16-31", "1")


def test_this_host_reads_without_warnings_about_nodes():
    facts = read("/")
    assert facts["node_count"] >= 1
    assert set(facts["nodes"][0]["cpus"]) <= set(range(os.cpu_count() or 1024))
    assert facts["cpus"]["allowed"]


def test_a_node_directory_left_out_of_online_warns_and_plans_as_the_farthest(tmp_path):
    machine = sysfs.amd_nps4()
    machine.put("sys/devices/system/node/online", "0-6")  # node7's directory stays
    for node_id in range(7):  # the kernel prints one distance per online node
        machine.put("sys/devices/system/node/node%d/distance" % node_id,
                    " ".join("10" if other == node_id else "12" if other // 4 == node_id // 4 else "32"
                             for other in range(7)))
    facts = read(machine.write(str(tmp_path)))
    assert any("leaves out node(s) 7" in warning for warning in facts["warnings"]), facts["warnings"]
    assert [row[7] for row in facts["distances"][:7]] == [None] * 7
    # Node 0 needs all eight nodes' memory: the unknown node 7 comes last, after the 32s.
    placed = plan(facts, Request(node=0, model_size="450G", memory_headroom="0", policy="preferred"))
    assert placed.mem_nodes[-1:] == [7] or 7 not in placed.mem_nodes
    assert plan(facts, Request(node=7)).node == 7


@pytest.mark.parametrize("name", ["node01", "node1x", "node\u0661", "node-1", "node 1"])
def test_only_the_kernel_spelling_of_a_node_number_is_a_node(tmp_path, name):
    machine = sysfs.dual_socket_gpus()
    for rel, content in list(machine.files.items()):
        if rel.startswith("sys/devices/system/node/node1/"):
            machine.put(rel.replace("/node1/", "/%s/" % name), content)
    facts = read(machine.write(str(tmp_path)))
    assert [node["id"] for node in facts["nodes"]] == [0, 1]


@pytest.mark.parametrize("rel, content, warned", [
    ("sys/devices/system/node/node0/cpulist", "0-1048575", "node0/cpulist"),
    ("sys/devices/system/node/node0/cpulist", "0-159,160", "node0/cpulist"),
    ("sys/devices/system/node/node0/cpumap", "1" + ",00000000" * 6, "node0/cpumap"),
    ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: %s kB" % ("9" * 5000), "node0/meminfo"),
    ("sys/devices/system/node/node0/distance", "10 " + "2" * 5000, "node0/distance"),
    ("sys/devices/system/node/node0/distance", "10 256", "node0/distance"),
    ("sys/bus/pci/devices/0000:81:00.0/numa_node", "1" * 4400, "0000:81:00.0/numa_node"),
    ("sys/bus/pci/devices/0000:81:00.0/numa_node", "4096", "0000:81:00.0/numa_node"),
    ("sys/devices/system/cpu/cpu0/cache/index3/size", "9" * 5000 + "K", "index3/size"),
    ("proc/self/status", "Mems_allowed_list:\t0-5000\nCpus_allowed_list:\t0-3\n", "proc/self/status"),
    ("sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "9" * 12, "cpu0/cpufreq/cpuinfo_max_freq"),
    ("sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "0", "cpu0/cpufreq/cpuinfo_max_freq"),
    ("sys/devices/system/cpu/cpu0/cpu_capacity", "fast", "cpu0/cpu_capacity"),
])
def test_numbers_past_what_a_kernel_prints_are_warnings(tmp_path, rel, content, warned):
    machine = sysfs.dual_socket_gpus()
    machine.put("sys/devices/system/cpu/possible", "0-159")
    machine.put("sys/devices/system/node/possible", "0-1")
    if rel.endswith("cpumap"):
        del machine.files["sys/devices/system/node/node0/cpulist"]
    machine.put(rel, content)
    facts = read(machine.write(str(tmp_path)))
    json.dumps(facts)
    assert any(warned in warning and "\n" not in warning and len(warning) < 300 for warning in facts["warnings"]), \
        facts["warnings"]
    assert all(cpu < 160 for node in facts["nodes"] for cpu in node["cpus"])


def test_a_cpu_directory_past_the_possible_cpus_is_ignored_with_a_warning(tmp_path):
    machine = sysfs.vm_without_nodes()
    machine.put("sys/devices/system/cpu/possible", "0-3")
    machine.put("sys/devices/system/cpu/cpu99999/topology/core_id", "0")
    del machine.files["sys/devices/system/cpu/online"]
    facts = read(machine.write(str(tmp_path)))
    assert facts["cpus"]["online"] == "0-3"
    assert any("cpu99999" in warning for warning in facts["warnings"]), facts["warnings"]


def test_links_in_the_tree_resolve_inside_it(tmp_path):
    """A captured tree with absolute links (as a copy of /sys can have) reads its own files, not this host's."""
    root = sysfs.dual_socket_gpus().write(str(tmp_path / "root"))
    node1 = os.path.join(root, "sys/devices/system/node/node1")
    os.rename(node1, os.path.join(root, "sys/devices/node1-real"))
    os.symlink("/sys/devices/node1-real", node1)
    proc_self = os.path.join(root, "proc/self")
    os.rename(proc_self, os.path.join(root, "proc/4242"))
    os.symlink("../../../../../../proc/4242", proc_self)  # .. stops at the root
    facts = read(root)
    assert node(facts, 1)["cpus"] == list(range(40, 80)) + list(range(120, 160))
    assert facts["cpus"]["allowed"] == "0-159" and facts["warnings"] == []


@pytest.mark.parametrize("cpuset", ["/../../../outside", "batch/../../outside", "../outside"])
def test_a_cpuset_path_that_climbs_is_a_warning_and_reads_nothing(tmp_path, cpuset):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpuset.cpus").write_text("5")
    machine = sysfs.amd_nps4()
    machine.put("proc/self/status", "Name:\tpython3\n")
    machine.put("proc/self/cpuset", cpuset)
    machine.put("proc/mounts", "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0")
    cpus = read(machine.write(str(tmp_path / "root")))
    assert cpus["cpus"]["allowed"] == ""
    assert any("proc/self/cpuset" in warning for warning in cpus["warnings"]), cpus["warnings"]


def test_a_fifo_a_loop_and_a_directory_are_warnings_even_where_a_file_is_optional(tmp_path):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    os.remove(os.path.join(root, "proc/sys/kernel/numa_balancing"))
    os.mkfifo(os.path.join(root, "proc/sys/kernel/numa_balancing"))
    os.remove(os.path.join(root, "sys/devices/system/cpu/isolated"))
    os.symlink("isolated", os.path.join(root, "sys/devices/system/cpu/isolated"))
    os.remove(os.path.join(root, "sys/bus/pci/devices/0000:81:00.0/numa_node"))
    os.mkdir(os.path.join(root, "sys/bus/pci/devices/0000:81:00.0/numa_node"))
    facts = read(root)
    assert facts["kernel"]["numa_balancing"] is None and facts["cpus"]["isolated"] == ""
    for rel in ("numa_balancing", "cpu/isolated", "0000:81:00.0/numa_node"):
        assert any(rel in warning for warning in facts["warnings"]), (rel, facts["warnings"])


# --- GPU servers: every locality the kernel gives -------------------------------------------------


def test_gpu_locality_from_numa_node_or_the_local_cpus_mask(tmp_path):
    facts = build(tmp_path, "dgx_like")
    by_address = {gpu["address"]: gpu for gpu in facts["gpus"]}
    assert [(gpu["numa_node"], gpu["locality"]) for gpu in facts["gpus"][:7]] == [
        (index % 2, "numa_node") for index in range(7)]
    masked = by_address["0000:db:00.0"]  # numa_node -1, no local_cpulist, only the hex mask
    assert (masked["numa_node"], masked["locality"]) == (1, "local_cpus")
    assert masked["local_cpulist"] == node(facts, 1)["cpulist"]
    assert node(facts, 1)["gpus"] == ["0000:2a:00.0", "0000:5d:00.0", "0000:ab:00.0", "0000:db:00.0"]
    assert facts["warnings"] == []


def test_nics_carry_their_rdma_device(tmp_path):
    facts = build(tmp_path, "dgx_like")
    assert [(nic["name"], nic["rdma_name"], nic["numa_node"]) for nic in facts["nics"]] == [
        ("ibp0", "mlx5_0", 0), ("ibp1", "mlx5_1", 1), ("ibp2", "mlx5_2", 0), ("ibp3", "mlx5_3", 1)]


IB = "sys/bus/pci/devices/0000:83:00.0/infiniband/mlx5_1"


def rdma_machine(rdma_ports=(("4: ACTIVE", "InfiniBand"), ("1: DOWN", "Ethernet"))):
    machine = sysfs.dual_socket_gpus()
    machine.add_pci("0000:83:00.0", 0x020700, 0x15b3, 0x101d, 1, range(40, 80), net="ibp1", rdma="mlx5_1",
                    rdma_ports=rdma_ports)
    return machine


def rdma_ports(machine, tmp_path, plan_only=False):
    facts = read(machine.write(str(tmp_path)), plan_only)
    json.dumps(facts)
    return [nic["rdma_ports"] for nic in facts["nics"] if nic["address"] == "0000:83:00.0"][0], facts["warnings"]


@pytest.mark.parametrize("plan_only", [False, True])  # numa-pin exec reads them too: UCX_NET_DEVICES names them
def test_an_rdma_devices_ports_with_their_state_and_link_layer(tmp_path, plan_only):
    assert rdma_ports(rdma_machine(), tmp_path, plan_only) == ([
        {"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand"},
        {"port": 2, "state": "DOWN", "link_layer": "Ethernet"}], [])


def test_a_device_of_any_class_with_an_rdma_device_is_a_nic_and_another_network_device_is_not(tmp_path):
    machine = sysfs.dual_socket_gpus()
    machine.add_pci("0000:83:00.0", 0x0c0600, 0x1077, 0x7322, 1, range(40, 80), net="ib0", rdma="qib0")  # QLogic
    machine.add_pci("0000:84:00.0", 0x028000, 0x8086, 0x2723, 1, range(40, 80))  # a Wi-Fi card: no RDMA device
    machine.add_pci("0000:85:00.0", 0x020800, 0x8086, 0x24f0, 1, range(40, 80), net="ib1", rdma="hfi1_0")  # Omni-Path
    nics = {nic["address"]: (nic["name"], nic["rdma_name"]) for nic in read(machine.write(str(tmp_path)))["nics"]}
    assert nics["0000:83:00.0"] == ("ib0", "qib0") and nics["0000:85:00.0"] == ("ib1", "hfi1_0")
    assert "0000:84:00.0" not in nics


def test_an_rdma_device_without_ports_has_none_and_no_warning(tmp_path):
    assert rdma_ports(rdma_machine(rdma_ports=()), tmp_path) == ([], [])


@pytest.mark.parametrize("state, link_layer", [("9: ACTIVE", "InfiniBand2"), ("4: DOWN", "IB"), ("ACTIVE", "Ether"),
                                               ("4:ACTIVE", "infiniband"), ("04: ACTIVE", ""), ("4: ACTIVE\x1b[2J", "x" * 5000)])
def test_a_port_state_or_link_layer_the_kernel_does_not_print_is_a_warning(tmp_path, state, link_layer):
    ports, warnings = rdma_ports(rdma_machine(rdma_ports=((state, link_layer),)), tmp_path)
    assert ports == [{"port": 1, "state": None, "link_layer": None}]
    assert len(warnings) == 2 and all("ports/1/" in warning and "\x1b" not in warning and len(warning) < 300
                                      for warning in warnings), warnings


def test_port_directories_named_otherwise_are_skipped_with_one_warning(tmp_path):
    machine = rdma_machine()
    for name in ("01", "0", "256", "x\x1b[2J", "-1"):
        machine.put("%s/ports/%s/state" % (IB, name), "4: ACTIVE")
    ports, warnings = rdma_ports(machine, tmp_path)
    assert [port["port"] for port in ports] == [1, 2]
    assert len(warnings) == 1 and "no port number from 1 to 255" in warnings[0] and "\x1b" not in warnings[0]


@pytest.mark.parametrize("link, kept", [("ports/2", [1]), ("ports", [])])
def test_a_port_directory_that_is_a_link_is_not_followed(tmp_path, link, kept):
    """sysfs has each port, and ports/, as a directory: a link there is planted, and what it leads to is not read
    (here a directory outside the device holding a port that looks real)."""
    machine = rdma_machine(rdma_ports=(("4: ACTIVE", "InfiniBand"),) if kept else ())
    machine.put("elsewhere/1/state", "4: ACTIVE").put("elsewhere/state", "4: ACTIVE")
    machine.link("%s/%s" % (IB, link), "/elsewhere")
    ports, warnings = rdma_ports(machine, tmp_path)
    assert [port["port"] for port in ports] == kept
    assert len(warnings) == 1 and "a link (to '/elsewhere') where sysfs has a directory; not followed" in warnings[0]


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=30), st.builds("{}: {}".format, st.integers(-2, 8), st.sampled_from(
    topology.PORT_STATES + ("UNKNOWN", "active", "")))))
def test_a_port_state_parses_to_a_kernel_state_only_as_the_kernel_prints_it(text):
    state = topology.parse_port_state(text)
    assert state is None or text == "%d: %s" % (topology.PORT_STATES.index(state), state)


@pytest.mark.parametrize("number, name", list(enumerate(topology.PORT_STATES)))
def test_every_kernel_port_state_parses(number, name):
    assert topology.parse_port_state("%d: %s" % (number, name)) == name


def test_gpu_memory_node_from_the_drivers_numa_status(tmp_path):
    facts = build(tmp_path, "gh200_like")
    (gpu,) = facts["gpus"]
    assert (gpu["numa_node"], gpu["memory_node"]) == (0, 1)
    assert node(facts, 1)["gpu_memory_of"] == ["0009:01:00.0"] and node(facts, 2)["gpu_memory_of"] == []


@pytest.mark.parametrize("status, expected", [
    ("Node:      1\nStatus:    online\n", 1),
    ("Node:      1\nStatus:    offline\n", None),       # not onlined: no memory there yet
    ("Node:      -1\nStatus:    disabled\n", None),
    ("Node:      7\nStatus:    online\n", None),        # a node the topology does not list: warned
    ("garbage", None),
])
def test_numa_status_is_read_by_the_kernel_drivers_format(tmp_path, status, expected):
    machine = sysfs.RECIPES["gh200_like"]()
    machine.put("proc/driver/nvidia/gpus/0009:01:00.0/numa_status", status)
    facts = read(machine.write(str(tmp_path)))
    assert facts["gpus"][0]["memory_node"] == expected
    assert any("names node 7" in warning for warning in facts["warnings"]) == (status.startswith("Node:      7"))


@pytest.mark.parametrize("recipe, source", [("memoryless_hmat", "hmat"), ("memoryless_slit", "slit")])
def test_memory_less_cpu_nodes_get_the_memory_nodes_that_serve_them(tmp_path, recipe, source):
    facts = build(tmp_path, recipe)
    assert [(n["id"], n["memory_nodes"], n["memory_from"]) for n in facts["nodes"]] == [
        (0, [2], source), (1, [3], source), (2, [2], "local"), (3, [3], "local")]
    result = plan(facts, Request(model_size="10G"))
    assert result.mem_nodes == [result.node + 2] and result.policy == "bind"


def test_hmat_wins_over_slit(tmp_path):
    machine = sysfs.RECIPES["memoryless_hmat"]()
    # SLIT now says node 3 is nearer to node 0; HMAT still pairs node 0 with node 2.
    machine.put("sys/devices/system/node/node0/distance", "10 21 24 12")
    machine.put("sys/devices/system/node/node3/distance", "12 24 21 10")
    facts = read(machine.write(str(tmp_path)))
    assert node(facts, 0)["memory_nodes"] == [2] and node(facts, 0)["memory_from"] == "hmat"


# --- topology classes: node kinds, the sockets' split, memory tiers, the kernel's memory features ----------

def test_each_node_says_what_it_holds_and_whose_memory_it_is(tmp_path):
    gpu = build(tmp_path / "g", "grace_like")
    assert [(n["id"], n["kind"], n["memory_class"]) for n in gpu["nodes"]] == [
        (0, "cpus_and_memory", "local"), (1, "memory_only", "gpu"), (2, "memory_only", "far")]
    gh200 = build(tmp_path / "h", "gh200_like")
    assert [(n["kind"], n["memory_class"], n["home_package"]) for n in gh200["nodes"]] == [
        ("cpus_and_memory", "local", 0), ("memory_only", "gpu", 0), ("empty", None, 0), ("empty", None, 0)]
    cxl = build(tmp_path / "c", "cxl_memory_node")
    assert [(n["id"], n["kind"], n["memory_class"], n["home_package"]) for n in cxl["nodes"]] == [
        (0, "cpus_and_memory", "local", 0), (1, "cpus_and_memory", "local", 1), (8, "memory_only", "far", 0)]
    assert cxl["shape"] == {"packages": 2, "cpu_nodes_per_package": 1, "sub_numa": False, "memory_only_nodes": [8]}


def classes(facts):
    return [(n["id"], n["memory_class"], n["memory_class_from"]) for n in facts["nodes"]]


def test_dram_behind_cpu_less_initiators_is_near_and_nvm_far(tmp_path):
    """Issue 44's captured machine: DRAM nodes at 419 GB/s, which no CPU node initiates, and an NVM node at 8 GB/s.
    Without CPU nodes' figures the best memory node is the DRAM to compare with; a start reads the same classes."""
    root = sysfs.cpuless_initiators().write(str(tmp_path))
    wanted = [(0, None, None), (1, None, None), (2, "near", "hmat"), (3, "near", "hmat"), (4, "far", "hmat")]
    assert classes(read(root)) == wanted
    assert classes(read(root, plan_only=True)) == wanted


def test_a_memory_only_nodes_class_follows_its_hmat_figures_against_the_cpu_nodes(tmp_path):
    """snc2_cxl: DRAM 20000 MB/s at 100 ns on the CPU nodes, the expander 10000 at 250: far; at DRAM's speed, near;
    at DRAM's bandwidth but twice its latency, far; without HMAT, far because it has no CPUs, as before figures."""
    assert classes(read(sysfs.snc2_cxl().write(str(tmp_path / "cxl"))))[3:] == [
        (3, "local", "cpus"), (4, "far", "hmat")]
    for name, figures, wanted in (("dram", (19000, 120), "near"), ("hbm", (60000, 130), "near"),
                                  ("slow", (20000, 200), "far")):
        machine = sysfs.put_hmat(sysfs.snc2_cxl(), 4, *figures)
        assert node(read(machine.write(str(tmp_path / name))), 4)["memory_class"] == wanted, name
    assert classes(read(sysfs.snc2_cxl(hmat=False).write(str(tmp_path / "none"))))[4] == (4, "far", "no_cpus")


def test_figures_decide_no_class_of_a_node_with_cpus_or_a_gpus_memory(tmp_path):
    machine = sysfs.RECIPES["gh200_like"]()
    for memory, bandwidth in ((0, 500000), (1, 4000000)):
        sysfs.put_hmat(machine, memory, bandwidth, 100)
    assert classes(read(machine.write(str(tmp_path))))[:2] == [(0, "local", "cpus"), (1, "gpu", "gpu")]


SPEED = {"near": 0, "far": 1}
FIGURES = st.tuples(st.integers(1, 10 ** 7), st.one_of(st.none(), st.integers(1, 5000)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=8), st.lists(FIGURES, min_size=8, max_size=8))
def test_a_faster_memory_only_node_never_gets_a_slower_class(with_cpus, figures):
    """Over any host's nodes (with CPUs or memory-only) and HMAT figures: a memory-only node with at least another's
    bandwidth and at most its latency (both known, or neither) gets a class at least as fast."""
    nodes = [{"id": index, "has_cpus": cpus, "has_memory": True, "gpus": [], "gpu_memory_of": []}
             for index, cpus in enumerate(with_cpus)]
    found = memory_classes(nodes, {node["id"]: figures[node["id"]] for node in nodes})
    assert set(found) == {node["id"] for node in nodes if not node["has_cpus"]}
    for one in found:
        for other in found:
            (bandwidth, latency), (other_bandwidth, other_latency) = figures[one], figures[other]
            if bandwidth >= other_bandwidth and (latency is None) == (other_latency is None) and (
                    latency is None or latency <= other_latency):
                assert SPEED[found[one]] <= SPEED[found[other]], (one, other)


def test_a_start_reads_no_hmat_on_a_host_without_memory_only_nodes(tmp_path):
    root = sysfs.put_hmat(sysfs.RECIPES["amd_nps4"](), 0, 20000, 100).write(str(tmp_path))
    assert [n["hmat"] for n in read(root, plan_only=True)["nodes"]] == [None] * 8
    assert read(root)["nodes"][0]["hmat"]["read_bandwidth"] == 20000


def test_a_socket_split_into_nodes_is_a_sub_numa_shape(tmp_path):
    facts = build(tmp_path, "amd_nps4")
    assert facts["shape"] == {"packages": 2, "cpu_nodes_per_package": 4, "sub_numa": True, "memory_only_nodes": []}
    assert [node["home_package"] for node in facts["nodes"]] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_memory_tiers_and_the_kernels_memory_features(tmp_path):
    machine = sysfs.cxl_memory_node()
    machine.put("sys/devices/virtual/memory_tiering/memory_tier4/nodelist", "0-1\n")
    machine.put("sys/devices/virtual/memory_tiering/memory_tier22/nodelist", "8\n")
    machine.put("sys/kernel/mm/mempolicy/weighted_interleave/node0", "1")
    machine.put("sys/kernel/mm/mempolicy/weighted_interleave/auto", "true\n")
    machine.put("sys/kernel/mm/numa/demotion_enabled", "false\n")
    machine.put("proc/sys/kernel/osrelease", "6.12.43+deb13-amd64\n")
    facts = read(machine.write(str(tmp_path)))
    assert facts["memory_tiers"] == [{"id": 4, "nodes": [0, 1]}, {"id": 22, "nodes": [8]}]
    assert facts["kernel"]["features"] == {
        "release": "6.12.43+deb13-amd64", "weighted_interleave": True, "weighted_interleave_auto": True,
        "memory_tiering": True, "demotion_enabled": False, "balancing_tiering_mode": True}


@pytest.mark.parametrize("release, wanted", [("5.15.0-91-generic", False), ("5.18.1", True), ("4.19", False),
                                             ("garbage", None), (None, None)])
def test_balancing_mode_2_needs_linux_5_18(tmp_path, release, wanted):
    machine = sysfs.vm_without_nodes()
    if release is not None:
        machine.put("proc/sys/kernel/osrelease", release + "\n")
    features = read(machine.write(str(tmp_path)))["kernel"]["features"]
    assert features["balancing_tiering_mode"] is wanted and features["weighted_interleave"] is False
    assert features["demotion_enabled"] is None and features["weighted_interleave_auto"] is None


def priority_core_turbo(tmp_path, plan_only=False, cpu_kinds=None):
    """dual_socket_gpus with cpufreq as on a Xeon with Priority Core Turbo: each socket's first 8 cores (and
    their siblings) turbo to 4.6 GHz, the rest to 4.0 or 3.9 (within 10 %: one kind), all of base 2.0 GHz."""
    machine = sysfs.dual_socket_gpus()
    for cpu in range(160):
        core = cpu % 80 % 40
        highest = 4600000 if core < 8 else 4000000 if core % 2 else 3900000
        machine.put("sys/devices/system/cpu/cpu%d/cpufreq/cpuinfo_max_freq" % cpu, "%d\n" % highest)
        machine.put("sys/devices/system/cpu/cpu%d/cpufreq/base_frequency" % cpu, "2000000\n")
    return read(machine.write(str(tmp_path)), plan_only, cpu_kinds)


def test_cpu_kinds_by_frequency_fastest_first_near_maxima_one_kind(tmp_path):
    kinds = priority_core_turbo(tmp_path)["cpus"]["kinds"]
    assert [(kind["rank"], kind["cpulist"], kind["max_freq_khz"], kind["base_freq_khz"]) for kind in kinds] == [
        (0, "0-7,40-47,80-87,120-127", 4600000, 2000000), (1, "8-39,48-79,88-119,128-159", 4000000, 2000000)]


def test_cpu_kinds_are_read_at_a_start_only_when_the_request_wants_them(tmp_path):
    assert priority_core_turbo(tmp_path / "a", plan_only=True)["cpus"]["kinds"] == []
    assert len(priority_core_turbo(tmp_path / "b", plan_only=True, cpu_kinds=True)["cpus"]["kinds"]) == 2
    assert build(tmp_path / "c", "dual_socket_gpus")["cpus"]["kinds"] == []  # no cpufreq: nothing tells them apart


SWITCH = ["pci0000:80", "0000:80:01.0", "0000:81:00.0"]


def test_a_devices_pci_path_is_read_from_its_bus_link_without_following_it(tmp_path):
    machine = sysfs.dual_socket_gpus()
    machine.add_pci("0000:82:00.0", 0x030200, 0x10de, 0x2330, 1, range(40, 80), bridges=SWITCH)
    machine.add_pci("0000:83:00.0", 0x020700, 0x15b3, 0x101d, 1, range(40, 80), net="ibp1", rdma="mlx5_1",
                    bridges=SWITCH + ["0000:82:01.0"])
    facts = read(machine.write(str(tmp_path)))
    by_address = {device["address"]: device for device in facts["gpus"] + facts["nics"]}
    assert by_address["0000:82:00.0"]["pci_path"] == SWITCH
    assert by_address["0000:83:00.0"]["pci_path"] == SWITCH + ["0000:82:01.0"]
    assert by_address["0000:83:00.0"]["rdma_name"] == "mlx5_1"  # read through the link, inside the root
    assert by_address["0000:81:00.0"]["pci_path"] == []  # a directory, as some captures copy them: no path known
    assert facts["warnings"] == []


@pytest.mark.parametrize("target, device", [
    ("../../../devices/pci0000:80/0000:80:01.0/0000:99:00.0", "sys/devices/pci0000:80/0000:80:01.0/0000:99:00.0"),
    ("../../../devices/pci0000:80/../../../../etc/0000:82:00.0", "etc/0000:82:00.0"),  # climbs: stops at the root
    ("../../../devices/pci0000:80/x\x1b[2J/0000:82:00.0", "sys/devices/pci0000:80/x\x1b[2J/0000:82:00.0")])
def test_a_bus_link_that_does_not_lead_to_its_device_by_pci_addresses_is_a_warning(tmp_path, target, device):
    machine = sysfs.dual_socket_gpus()
    machine.put("sys/devices/pci0000:80/uevent", "")  # the host bridge's directory, which the link climbs out of
    machine.put(device + "/class", "0x030200")
    machine.link("sys/bus/pci/devices/0000:82:00.0", target)
    facts = read(machine.write(str(tmp_path)))
    json.dumps(facts)
    assert all(device.get("pci_path") == [] for device in facts["gpus"] if device["address"] == "0000:82:00.0")
    warned = [warning for warning in facts["warnings"] if "0000:82:00.0" in warning and "host bridge" in warning]
    assert len(warned) == 1 and "\x1b" not in warned[0], facts["warnings"]

