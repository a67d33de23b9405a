"""Far memory (CXL, HBM as CPU-less nodes) as a slower tier, and weighted interleave, on a constructed SNC2 host
with a CXL expander beside socket 0 (tests/fixtures/sysfs.py snc2_cxl): nodes 0-1 on package 0, 2-3 on package 1,
15 GiB available on each, node 4 64 GiB of far memory."""

import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import PlacementError, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs.request import Request
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs.service_entry import service_requests
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read
from tests.fixtures import sysfs

WEIGHTS = "sys/kernel/mm/mempolicy/weighted_interleave"


@pytest.fixture
def host(tmp_path):
    return read(sysfs.snc2_cxl().write(str(tmp_path)))


def weighted_host(tmp_path, weights):
    root = sysfs.snc2_cxl().write(str(tmp_path))
    for node, weight in weights.items():
        with open(os.path.join(root, WEIGHTS, "node%d" % node), "w") as handle:
            handle.write("%d\n" % weight)
    return read(root)


def place(topology, **options):
    return plan(topology, Request(memory_headroom="0", **options))


def test_per_socket_spreads_each_instance_over_its_packages_dram_only(host):
    wanted = service_requests({"name": "llama", "layout": "per_socket"}, host)
    assert wanted["instances"] == 2
    options = {name: value for name, value in wanted["request"].items() if name in Request.FIELDS}
    for instance, (nodes, cpus) in enumerate((([0, 1], "0-15"), ([2, 3], "16-31"))):
        result = plan(host, Request.from_options(dict(options, instance=instance)))
        assert (result.policy, result.mem_nodes, result.cpulist) == ("interleave", nodes, cpus)


def test_an_instance_outgrowing_its_socket_takes_the_sockets_expander_before_the_other_socket(host):
    result = place(host, node=0, model_size="40G")
    assert (result.policy, result.mem_nodes, result.cpu_nodes) == ("interleave", [0, 1, 4], [0, 1])
    assert any("node(s) 4 are far memory" in reason and "numa_host_interleave_weights" in reason
               for reason in result.reasons)


def test_far_memory_is_never_an_instances_only_memory(host):
    # 50G fits the expander alone; the instance still gets its own node's DRAM first, then its socket's.
    assert place(host, node=0, model_size="50G").mem_nodes == [0, 1, 4]
    assert place(host, node=0, model_size="10G").mem_nodes == [0]


def test_the_other_sockets_expander_less_instance_spills_to_its_sibling_then_across(host):
    assert place(host, node=2, model_size="20G").mem_nodes == [2, 3]
    # Socket 1's DRAM (30G) is not enough: the nearest other node follows, before socket 0's expander.
    assert place(host, node=2, model_size="40G").mem_nodes == [0, 2, 3]
    assert place(host, node=2, model_size="70G").mem_nodes == [0, 1, 2, 3, 4]


def test_unequal_kernel_weights_make_the_spill_weighted(tmp_path):
    topology = weighted_host(tmp_path, {0: 2, 1: 2, 2: 2, 3: 2, 4: 1})
    result = place(topology, node=0, model_size="40G")
    assert (result.policy, result.mem_nodes) == ("weighted-interleave", [0, 1, 4])
    assert not any("far memory" in reason for reason in result.reasons)


def test_weighted_interleave_asked_for_uses_the_kernels_weights_even_when_equal(host):
    result = place(host, node=0, model_size="20G", policy="weighted_interleave")
    assert (result.policy, result.mem_nodes) == ("weighted-interleave", [0, 1])


def test_weighted_interleave_on_an_older_kernel_is_plain_interleave_with_the_reason(tmp_path):
    topology = read(sysfs.snc2_cxl(weights=False).write(str(tmp_path)))
    result = place(topology, node=0, model_size="20G", policy="weighted_interleave")
    assert (result.policy, result.mem_nodes) == ("interleave", [0, 1])
    assert any("no weighted interleave (Linux 6.9+)" in reason for reason in result.reasons)


def test_a_gpus_memory_node_is_no_spill_tier(tmp_path):
    topology = read(sysfs.gh200_like().write(str(tmp_path)))
    with pytest.raises(PlacementError, match="does not fit even all usable node"):
        place(topology, model_size="450G", gpus="none")


def test_far_memory_the_cpuset_forbids_is_left_out(tmp_path):
    machine = sysfs.snc2_cxl()
    machine.put("proc/self/status", "Name:\tpython3\nCpus_allowed_list:\t0-31\nMems_allowed_list:\t0-3\n")
    topology = read(machine.write(str(tmp_path)))
    assert 4 not in place(topology, node=0, model_size="40G").mem_nodes


def test_memory_only_dram_is_spilled_to_as_dram_with_no_far_memory_warning(tmp_path):
    topology = read(sysfs.put_hmat(sysfs.snc2_cxl(), 4, 20000, 110).write(str(tmp_path)))
    result = place(topology, node=0, model_size="40G")
    assert (result.policy, result.mem_nodes) == ("interleave", [0, 1, 4])
    assert not any("far memory" in reason for reason in result.reasons)


def test_a_sockets_near_memory_comes_before_its_far_memory_even_when_slit_puts_the_far_one_nearer(tmp_path):
    """Node 4 at DRAM speed (near) and a copy of it, node 5, as far memory SLIT puts nearer to node 0: an instance
    outgrowing socket 0's DRAM takes node 4 first, as the spill order lists the faster class first."""
    topology = read(sysfs.put_hmat(sysfs.snc2_cxl(), 4, 20000, 110).write(str(tmp_path)))
    far = dict(topology["nodes"][4], id=5, memory_class="far", memory_class_from="hmat",
               distances=dict(topology["nodes"][4]["distances"], **{"0": 13, "5": 10}))
    far["distances"]["4"] = 20
    for node in topology["nodes"]:
        node["distances"]["5"] = far["distances"][str(node["id"])]
    topology["nodes"].append(far)
    topology["distances"] = []
    topology["cpus"]["mems_allowed"] = "0-5"
    assert place(topology, node=0, model_size="80G").mem_nodes == [0, 1, 4]
    assert place(topology, node=0, model_size="130G").mem_nodes == [0, 1, 4, 5]
