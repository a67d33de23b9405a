"""GPU servers: instances whose GPUs span nodes, the per-GPU map, GPU groups, memory-less CPU nodes.

Synthetic machines (topo_factory): a DGX-like 2-socket 8-GPU board whose PCI addresses alternate
between the sockets, an 8-node NPS4 EPYC with a GPU per node, a GB200-like pair of Grace nodes
with GPU memory on CPU-less nodes, and CPU nodes without memory served by memory nodes.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.cpulist import parse_cpulist
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import PlacementError, Request, plan

from tests.unit import topo_factory as tf


def place(topology, **options):
    return plan(topology, Request(**options))


def node_cpus(topology, node):
    return next(record for record in topology["nodes"] if record["id"] == node)["cpus"]


# ------------------------------------------------------------------ spanning ---

def test_tensor_parallel_over_all_eight_gpus_covers_both_sockets():
    topology = tf.dgx_like()
    result = place(topology, gpus=8, model_size="70G")
    assert result.cpu_nodes == [0, 1] and result.mem_nodes == [0, 1]
    assert result.policy == "interleave"  # never bound to the node with the most GPUs
    assert result.cpus == sorted(node_cpus(topology, 0) + node_cpus(topology, 1))
    assert any("span nodes 0-1" in reason and "handed to the engine" in reason for reason in result.reasons)


@pytest.mark.parametrize("policy, expected", [("bind", ("bind", [0, 1])), ("interleave", ("interleave", [0, 1])),
                                              ("preferred", ("preferred", [0]))])
def test_a_spanning_instance_keeps_every_gpu_node_whatever_the_policy(policy, expected):
    result = place(tf.dgx_like(), gpus=8, model_size="70G", policy=policy)
    assert (result.policy, result.mem_nodes) == expected
    assert result.cpu_nodes == [0, 1]


def test_a_spanning_model_too_big_for_its_gpu_nodes_follows_on_unfit():
    topology = tf.nps4_eight_gpus(available_gib=60)
    interleaved = place(topology, gpus=2, model_size="150G")  # GPUs on nodes 0 and 1: 120 GiB there
    assert interleaved.policy == "interleave" and interleaved.mem_nodes[:2] == [0, 1]
    assert len(interleaved.mem_nodes) == 3 and interleaved.cpu_nodes == interleaved.mem_nodes
    with pytest.raises(PlacementError, match="on_unfit is 'fail'"):
        place(topology, gpus=2, model_size="150G", on_unfit="fail")


def test_an_explicit_node_overrides_the_span_and_says_what_crosses():
    result = place(tf.dgx_like(), gpus=8, node=1)
    assert result.cpu_nodes == [1] and result.mem_nodes == [1]
    assert any("not to the requested node 1" in reason for reason in result.reasons)
    assert result.engine["env"] == {}  # generic


def test_gpus_on_one_node_do_not_span():
    result = place(tf.dual_socket_gpu(), gpus=2)
    assert result.cpu_nodes == [1] and result.policy == "bind"
    assert not any("span" in reason for reason in result.reasons)


def test_scope_socket_spans_the_gpus_whole_packages():
    result = place(tf.nps4_eight_gpus(), gpus=2, scope="socket")  # GPUs on nodes 0, 1: both in package 0
    assert result.cpu_nodes == [0, 1, 2, 3]


# ------------------------------------------------------------------ GPU map ---

def test_the_map_gives_each_worker_its_gpus_node_cpus_memory_and_nics():
    topology = tf.dgx_like()
    result = place(topology, gpus=8)
    assert [entry["gpu"] for entry in result.gpu_map] == result.gpus
    assert [entry["node"] for entry in result.gpu_map] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [entry["mem_nodes"] for entry in result.gpu_map] == [[0]] * 4 + [[1]] * 4
    node0 = [parse_cpulist(entry["cpulist"]) for entry in result.gpu_map[:4]]
    assert sorted(cpu for cpus in node0 for cpu in cpus) == node_cpus(topology, 0)  # split, all used
    assert all(len(cpus) == 28 for cpus in node0)  # 14 cores each, both SMT siblings
    assert all(set(a).isdisjoint(b) for index, a in enumerate(node0) for b in node0[index + 1:])
    assert [nic["rdma_name"] for nic in result.gpu_map[0]["nics"]] == ["mlx5_0", "mlx5_2"]
    assert [nic["rdma_name"] for nic in result.gpu_map[7]["nics"]] == ["mlx5_1", "mlx5_3"]


def test_the_map_follows_the_visible_device_order():
    result = place(tf.dgx_like(), gpus=8)
    # CUDA numbers GPUs by bus; the instance lists them node-first, and the map in that same order.
    order = {gpu["address"]: gpu["cuda_index"] for gpu in tf.dgx_like()["gpus"]}
    assert result.env["CUDA_VISIBLE_DEVICES"] == ",".join(str(order[entry["gpu"]]) for entry in result.gpu_map)


def test_smt_off_gives_each_worker_one_cpu_per_core():
    result = place(tf.dgx_like(), gpus=8, smt=False)
    assert all(len(parse_cpulist(entry["cpulist"])) == 14 for entry in result.gpu_map)


def test_gpu_memory_nodes_are_tied_to_their_gpus_and_never_hold_the_workers_memory():
    result = place(tf.gb200_like(), gpus=4)
    assert [entry["memory_node"] for entry in result.gpu_map] == [2, 3, 4, 5]
    assert [entry["mem_nodes"] for entry in result.gpu_map] == [[0], [0], [1], [1]]
    assert result.mem_nodes == [0, 1]


def test_a_gpu_of_no_known_node_goes_with_the_instance():
    topology = tf.dual_socket_gpu()
    topology["gpus"][1]["numa_node"] = None
    result = place(topology, gpus=2)
    assert [entry["node"] for entry in result.gpu_map] == [1, 1]
    assert any("has no known node" in reason for reason in result.reasons)


def test_no_gpus_no_map():
    assert place(tf.one_node_vm()).gpu_map == []


# --------------------------------------------------------------- GPU groups ---

def test_tp4_on_an_8_gpu_2_socket_host_gives_one_instance_per_socket():
    topology = tf.dgx_like()
    first, second = (place(topology, gpus=4, instances=2, instance=index) for index in (0, 1))
    assert (first.cpu_nodes, second.cpu_nodes) == ([0], [1])
    assert {entry["node"] for entry in first.gpu_map} == {0} and {entry["node"] for entry in second.gpu_map} == {1}
    assert set(first.gpus).isdisjoint(second.gpus)
    assert first.policy == second.policy == "bind"


def test_tp4_on_nps4_keeps_each_instance_in_one_socket():
    topology = tf.nps4_eight_gpus()
    plans = [place(topology, gpus=4, instances=2, instance=index) for index in (0, 1)]
    assert [plan_.cpu_nodes for plan_ in plans] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(8)), st.sampled_from([1, 2, 4, 8]))
def test_groups_take_a_nodes_gpus_first_whatever_the_bus_numbering(nodes, size):
    """Whatever node each bus address hangs off, a group of N GPUs never spans more nodes than it must."""
    gpus = [tf.make_gpu("0000:%02x:00.0" % (0x10 * (index + 1)), nodes[index] // 2) for index in range(8)]
    topology = tf.amd_nps4(gpus=gpus)  # two GPUs per node on nodes 0-3
    for instance in range(8 // size):
        result = place(topology, gpus=size, instances=8 // size, instance=instance)
        assert len({entry["node"] for entry in result.gpu_map}) == max(1, size // 2)


# ------------------------------------------------------- memory-less CPU nodes ---

def test_cpu_nodes_without_memory_are_usable_with_the_memory_serving_them():
    result = place(tf.memoryless_cpu_nodes(), gpus=1, model_size="10G")
    assert (result.cpu_nodes, result.mem_nodes, result.policy) == ([0], [2], "bind")
    assert "node 0 has no memory of its own: its memory is node(s) 2 (HMAT)" in result.reasons


def test_memory_less_nodes_fit_against_their_memory_nodes():
    with pytest.raises(PlacementError, match="does not fit"):
        place(tf.memoryless_cpu_nodes(), gpus=1, model_size="300G", on_unfit="fail")


def test_a_cpuset_without_the_serving_memory_excludes_the_node():
    result = place(tf.memoryless_cpu_nodes(mems_allowed="3"), gpus="none")
    assert result.cpu_nodes == [1] and result.mem_nodes == [3]
    assert any("the memory serving it (node(s) 2) is not allowed by the cpuset" in reason
               for reason in result.reasons)


def test_preferred_on_a_memory_less_node_prefers_its_memory_node():
    result = place(tf.memoryless_cpu_nodes(), gpus=1, policy="preferred")
    assert (result.policy, result.mem_nodes, result.cpu_nodes) == ("preferred", [2], [0])
