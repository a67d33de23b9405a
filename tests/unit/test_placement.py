"""The placement planner's decision rules, one test (or a few) per rule."""
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit import topo_factory as tf
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import (
    PlacementError, plan)
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs.request import Request, parse_headroom

GIB = tf.GIB
NODE0 = list(range(0, 40)) + list(range(80, 120))
NODE1 = list(range(40, 80)) + list(range(120, 160))


def place(topology, **options):
    return plan(topology, Request(**options))


def reasons(result):
    return "\n".join(result.reasons)


# ---------------------------------------------------------------- request ---

def test_request_defaults():
    request = Request()
    assert (request.node, request.gpus, request.model_size, request.memory_headroom) == (None, "auto", None, "10%+1G")
    assert (request.smt, request.reserve_cpus, request.scope) == (True, [], "node")
    assert (request.instances, request.instance, request.policy, request.on_unfit, request.port_base) == (
        1, 0, "auto", "interleave", None)


def test_from_options_treats_none_as_default_and_coerces_cli_strings():
    request = Request.from_options({"node": "1", "gpus": "81:00.0,0000:C1:00.0", "model_size": "14G",
                                    "reserve_cpus": "0-1", "policy": None, "instances": "2", "instance": 1})
    assert request.node == 1
    assert request.gpus == ["0000:81:00.0", "0000:c1:00.0"]
    assert request.model_size == 14 * GIB
    assert request.reserve_cpus == [0, 1]
    assert request.policy == "auto"
    assert (request.instances, request.instance) == (2, 1)


@pytest.mark.parametrize("gpus, expected", [
    ("auto", "auto"), ("NONE", "none"), (2, 2), ("3", 3), (0, "none"), ([], "none"),
    (["0000:c1:00.0", "81:00.0"], ["0000:c1:00.0", "0000:81:00.0"]),
])
def test_gpus_option_is_normalised(gpus, expected):
    assert Request(gpus=gpus).gpus == expected


@pytest.mark.parametrize("options, message", [
    ({"polcy": "bind"}, "unknown placement option(s) polcy"),
    ({"policy": "spread"}, "unknown policy 'spread': choose one of auto, bind, preferred, interleave"),
    ({"on_unfit": "swap"}, "unknown on_unfit 'swap'"),
    ({"scope": "rack"}, "unknown scope 'rack'"),
    ({"instances": 2, "instance": 2}, "instance 2 is out of range for instances=2"),
    ({"instances": 0}, "instances must be 1 or more"),
    ({"model_size": -5}, "model_size: size -5 is negative"),
    ({"model_size": "lots"}, "model_size: cannot read size 'lots'"),
    ({"node": "one"}, "node must be an integer, got 'one'"),
    ({"node": True}, "node must be an integer"),
    ({"node": 1.0}, "node must be an integer"),
    ({"node": -1}, "node must be 0 or more"),
    ({"gpus": -1}, "gpus count must be 0 or more, got -1"),
    ({"gpus": ["gpu0"]}, "'gpu0' is not a PCI address"),
    ({"gpus": {"a": 1}}, "gpus must be 'auto', 'none', a count or a list of PCI addresses"),
    ({"smt": "yes"}, "smt must be true or false"),
    ({"reserve_cpus": "0-x"}, "reserve_cpus: cannot read cpu list '0-x'"),
    ({"reserve_cpus": [0, -1]}, "reserve_cpus must be 0 or more"),
    ({"reserve_cpus": 3}, "reserve_cpus must be a cpu list"),
    ({"memory_headroom": "10%+lots"}, "term 'lots' is neither a percentage nor a size"),
    ({"memory_headroom": ""}, "memory_headroom '' is not a size"),
    ({"port_base": 0}, "port_base must be 1 or more"),
    ({"port_base": 65535, "instances": 2}, "pick a port_base of at most 65534"),
])
def test_from_options_rejects_bad_values_with_clear_messages(options, message):
    with pytest.raises(NumaError) as error:
        Request.from_options(options)
    assert message in str(error.value)


# Each (options, message): a hostile or mistaken value and the one line that names it.
BOUND_CASES = {
    "instances past any kernel's cpus": ({"instances": 100000000}, "instances must be at most 8192, got 100000000"),
    "instances of 5000 digits": ({"instances": "9" * 5000}, "instances must be at most 8192, got '99999"),
    "instances of -5000 digits": ({"instances": "-" + "9" * 5000}, "instances must be 1 or more, got '-9999"),
    "huge int instance": ({"instance": 10 ** 5000}, "instance must be at most 8191, got (a 16610-bit number)"),
    "node past MAX_NUMNODES": ({"node": "1024"}, "node must be at most 1023, got '1024'"),
    "port_base past 65535": ({"port_base": 65536}, "port_base must be at most 65535, got 65536"),
    "port range past 65535": ({"port_base": 65000, "instances": 600}, "pick a port_base of at most 64936"),
    "commas only": ({"gpus": ",,,"}, "gpus entry 1 of 4 is empty"),
    "empty gpus": ({"gpus": ""}, "gpus entry 1 of 1 is empty"),
    "empty middle entry": ({"gpus": "81:00.0,,c1:00.0"}, "gpus entry 2 of 3 is empty"),
    "empty list entry": ({"gpus": ["81:00.0", " "]}, "gpus entry 2 of 2 is empty"),
    "GPU twice": ({"gpus": "81:00.0,0000:81:00.0"}, "gpus names GPU 0000:81:00.0 twice"),
    "function past 7": ({"gpus": "0000:81:00.8"}, "'0000:81:00.8' is not a PCI address"),
    "bus of three digits": ({"gpus": "0000:811:00.0"}, "is not a PCI address"),
    "superscript digit": ({"gpus": "\u00b2"}, "is not a PCI address"),
    "GPU count past any host": ({"gpus": 1025}, "gpus count must be at most 1024"),
    "GPU count of 5000 digits": ({"gpus": "7" * 5000}, "gpus count must be at most 1024, got '77777"),
    "model of 5000 digits": ({"model_size": "9" * 5000}, "model_size: number '99999"),
    "model past 16 EiB": ({"model_size": "20000P"}, "model_size: size '20000P' is 16 EiB or more"),
    "model plus headroom past 16 EiB": ({"model_size": "15000P", "memory_headroom": "10%"},
                                        "model_size 15360000 TiB plus memory_headroom '10%' needs 16 EiB or more"),
    "headroom percent of 50 digits": ({"memory_headroom": "1" * 50 + "%"}, "has more than 40 digits"),
    "headroom nan": ({"memory_headroom": "nan"}, "term 'nan' is neither a percentage nor a size"),
    "headroom float": ({"memory_headroom": float("nan")}, "memory_headroom nan is not a size"),
    "reserved cpu past NR_CPUS": ({"reserve_cpus": "0,8192"}, "reserve_cpus: cannot read cpu list '0,8192'"),
    "reserved cpu id past NR_CPUS": ({"reserve_cpus": [0, 8192]}, "reserve_cpus must be at most 8191"),
    "anchor past MAX_NUMNODES": ({"anchors": "1024"}, "anchors entry must be at most 1023"),
    "anchors longer than instances": ({"anchors": "0,1"}, "anchors '0,1' name 2 node(s) for 1 instance(s)"),
    "anchors list of a million": ({"anchors": [0] * 10 ** 6}, "name 1000000 node(s) for 1 instance(s)"),
}


@pytest.mark.parametrize("options, message", list(BOUND_CASES.values()), ids=list(BOUND_CASES))
def test_every_bound_is_one_line_naming_the_value(options, message):
    with pytest.raises(NumaError) as error:
        Request.from_options(options)
    assert message in str(error.value)
    assert "\n" not in str(error.value) and len(str(error.value)) < 300


BOUNDED_INTS = {"instances": (1, 8192), "instance": (0, 0), "node": (0, 1023), "port_base": (1, 65535),
                "gpus": (0, 1024)}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(BOUNDED_INTS)), st.one_of(st.integers(), st.integers(-2, 70000)), st.booleans())
def test_an_integer_option_is_taken_exactly_in_its_range_and_refused_outside(name, number, as_text):
    low, high = BOUNDED_INTS[name]
    try:
        request = Request.from_options({name: str(number) if as_text else number})
    except NumaError as error:
        assert not low <= number <= high
        assert name in str(error) and "\n" not in str(error)
        return
    assert low <= number <= high
    assert getattr(request, name) == (number or "none" if name == "gpus" else number)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(alphabet="0123456789abcdefABCDEF:., ", max_size=40))
def test_gpu_text_is_a_count_a_list_of_distinct_addresses_or_one_error(text):
    try:
        selection = Request(gpus=text).gpus
    except NumaError as error:
        assert str(error).startswith("gpus") and "\n" not in str(error)
        return
    if isinstance(selection, list):
        assert len(set(selection)) == len(selection) == len(text.split(","))
    else:
        assert selection == "none" or 0 < selection <= 1024


def test_the_absolute_instance_cap_is_checked_before_any_planning():
    # 8192 instances on a 4-CPU box: refused by the host's count, not by simulating 8192 placements.
    with pytest.raises(PlacementError, match="instances=8192 but this host has 4 usable CPU"):
        place(tf.one_node_vm(), instances=8192, instance=8191)


@pytest.mark.parametrize("text, percent, fixed", [
    ("10%+1G", 10, GIB), ("2G", 0, 2 * GIB), ("0", 0, 0), ("12.5%", 12.5, 0), ("1G + 5% + 512M", 5, GIB + 512 * 2 ** 20),
])
def test_parse_headroom(text, percent, fixed):
    assert parse_headroom(text) == (percent, fixed)


def test_required_bytes_is_model_plus_percentage_rounded_up_plus_fixed():
    assert Request(model_size=1001).required_bytes() == 1001 + 101 + GIB
    assert Request(model_size=14 * GIB, memory_headroom="0").required_bytes() == 14 * GIB
    assert Request(model_size=14 * GIB, memory_headroom=GIB).required_bytes() == 15 * GIB
    assert Request().required_bytes() is None


# ------------------------------------------------------------- candidates ---

def test_cpuset_restricts_nodes_and_cpus():
    result = place(tf.cgroup_restricted(), gpus="none")
    assert result.node == 1
    assert result.cpulist == "40-59,120-139"
    assert "node 0: its memory is not allowed by the cpuset (mems_allowed 1)" in reasons(result)
    assert "cpuset allows cpus 40-59,120-139 of online 0-159" in reasons(result)


def test_empty_allowed_and_mems_allowed_mean_everything():
    result = place(tf.dual_socket_gpu(allowed="", mems_allowed=""), gpus="none")
    assert result.cpus == NODE0
    assert "usable nodes: 0-1" in reasons(result)


def test_node_whose_cpus_are_all_reserved_is_not_a_candidate():
    result = place(tf.dual_socket_gpu(), gpus="none", reserve_cpus=NODE0)
    assert result.node == 1
    assert "node 0: all its allowed CPUs are reserved" in reasons(result)


def test_reserved_cpus_are_never_handed_out():
    result = place(tf.dual_socket_gpu(), gpus="none", reserve_cpus="0-1,80-81")
    assert result.cpus == [cpu for cpu in NODE0 if cpu not in (0, 1, 80, 81)]
    assert result.threads == 76


def test_memory_less_cpu_node_nobody_serves_is_not_a_candidate():
    topology = tf.make_topology([tf.make_node(0, range(4), has_memory=False), tf.make_node(1, range(4, 8))])
    result = place(topology)
    assert result.node == 1
    assert "node 0: no memory, and no node's memory is known to serve it (CPU-only node)" in reasons(result)


@pytest.mark.parametrize("topology, node, message", [
    (tf.dual_socket_gpu(), 7, "node 7 does not exist: this host has node(s) 0-1"),
    (tf.cxl_memory(), 2, "node 2 cannot be used: no CPUs (memory-only node); usable node(s): 0-1"),
    (tf.cgroup_restricted(), 0, "node 0 cannot be used: its memory is not allowed by the cpuset"),
    (tf.dual_socket_gpu(allowed="40-79"), 0, "node 0 cannot be used: its CPUs 0-39,80-119 are not allowed "
                                             "by the cpuset (allowed 40-79)"),
])
def test_explicit_node_must_be_a_candidate(topology, node, message):
    with pytest.raises(PlacementError) as error:
        place(topology, node=node)
    assert message in str(error.value)


def test_explicit_node_with_every_cpu_reserved_says_so():
    with pytest.raises(PlacementError) as error:
        place(tf.dual_socket_gpu(), node=0, reserve_cpus=NODE0)
    assert "node 0 cannot be used: all its allowed CPUs are reserved (reserve_cpus 0-39,80-119)" in str(error.value)


def test_no_usable_node_at_all_is_a_placement_error():
    with pytest.raises(PlacementError) as error:
        place(tf.one_node_vm(), reserve_cpus="0-3")
    assert "no usable NUMA node" in str(error.value)
    assert "shrink reserve_cpus" in str(error.value)


def test_explicit_node_wins_over_gpu_locality_and_says_so():
    result = place(tf.dual_socket_gpu(), node=0)
    assert (result.node, result.gpus) == (0, ["0000:81:00.0"])
    assert "GPU 0000:81:00.0 is local to node 1, not to the requested node 0" in reasons(result)


# ------------------------------------------------------------------- GPUs ---

def test_auto_gpus_pick_the_gpu_local_node_and_set_cuda_env():
    result = place(tf.dual_socket_gpu())
    assert (result.node, result.policy, result.mem_nodes, result.cpus) == (1, "bind", [1], NODE1)
    assert result.gpus == ["0000:81:00.0"]
    assert result.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "80"}
    assert "node 1 chosen: local to GPU 0000:81:00.0" in reasons(result)


def test_auto_counts_every_gpu_the_reader_lists_whatever_its_vendor():
    # An accelerator or display of another vendor (the lab's emulated display) is a GPU too.
    topology = tf.dual_socket_gpu()
    topology["gpus"] = [tf.make_gpu("0000:81:00.0", 1, vendor="other", klass="0x038000")]
    result = place(topology)
    assert (result.node, result.gpus) == (1, ["0000:81:00.0"])
    assert "CUDA_VISIBLE_DEVICES" not in result.env


def test_auto_gpus_give_instance_i_the_ith_gpu_and_split_the_shared_node():
    first = place(tf.dual_socket_gpu(), instances=2, instance=0)
    second = place(tf.dual_socket_gpu(), instances=2, instance=1)
    assert second.gpus == ["0000:c1:00.0"]
    assert second.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert first.node == second.node == 1
    assert not set(first.cpus) & set(second.cpus)
    assert sorted(first.cpus + second.cpus) == NODE1
    assert first.threads == second.threads == 40
    assert "node 1 is shared by instances 0-1: this instance gets 20 of its 40 cores" in reasons(second)


def test_auto_gpus_round_robin_when_instances_outnumber_gpus():
    result = place(tf.dual_socket_gpu(), instances=3, instance=2)
    assert result.gpus == ["0000:81:00.0"]
    assert "3 instances share 2 GPU(s) round-robin" in reasons(result)


def test_gpu_count_gives_consecutive_gpus_per_instance():
    assert place(tf.dual_socket_gpu(), gpus=2).gpus == ["0000:81:00.0", "0000:c1:00.0"]
    assert place(tf.dual_socket_gpu(), gpus=2).env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert place(tf.dual_socket_gpu(), gpus=1, instances=2, instance=1).gpus == ["0000:c1:00.0"]


def test_gpu_count_beyond_the_hosts_gpus_fails_for_that_instance():
    with pytest.raises(PlacementError) as error:
        place(tf.dual_socket_gpu(), gpus=2, instances=2, instance=1)
    assert "instance 1 of 2: gpus=2 per instance needs GPUs 2..3 for instance 1 but this host has 2" in str(error.value)
    # Instance 0 still has its GPUs; the instance that cannot be placed is left out of its simulation.
    result = place(tf.dual_socket_gpu(), gpus=2, instances=2, instance=0)
    assert result.gpus == ["0000:81:00.0", "0000:c1:00.0"]
    assert result.cpus == NODE1
    assert "instance 1 cannot be placed" in reasons(result)


def test_gpus_by_address_including_a_device_of_another_vendor():
    topology = tf.dual_socket_gpu()
    topology["gpus"].append(tf.make_gpu("0000:03:00.0", 0, vendor="other", klass="0x120000"))
    result = place(topology, gpus=["0000:03:00.0"])
    assert (result.node, result.gpus) == (0, ["0000:03:00.0"])
    assert "CUDA_VISIBLE_DEVICES" not in result.env
    assert "GPU 0000:03:00.0 (other): no visibility variable is set for this vendor" in reasons(result)


def test_unknown_gpu_address_fails_listing_the_known_ones():
    with pytest.raises(PlacementError) as error:
        place(tf.dual_socket_gpu(), gpus="0000:99:00.0")
    assert "GPU(s) 0000:99:00.0 not found: this host has 0000:81:00.0, 0000:c1:00.0" in str(error.value)


def test_gpus_none_ignores_gpus_and_places_by_memory():
    result = place(tf.dual_socket_gpu(), gpus="none")
    assert (result.node, result.gpus, result.env) == (0, [], {"OMP_NUM_THREADS": "80"})


def test_gpu_without_numa_node_gives_no_preference():
    topology = tf.make_topology([tf.make_node(0, range(4)), tf.make_node(1, range(4, 8))],
                                gpus=[tf.make_gpu("0000:81:00.0", None)])
    result = place(topology)
    assert result.node == 0
    assert result.gpus == ["0000:81:00.0"]
    assert "GPU 0000:81:00.0 reports no NUMA node: no locality preference from it" in reasons(result)
    assert "chosen by memory score" in reasons(result)


def test_gpu_on_a_cpu_less_node_maps_to_the_nearest_cpu_node():
    result = place(tf.grace_like(), model_size=20 * GIB)
    assert (result.node, result.policy, result.mem_nodes) == (0, "bind", [0])
    assert ("GPU 0009:01:00.0 is on node 1, which is not usable: no CPUs (memory-only node); "
            "nearest usable node by SLIT is 0 (distance 40)") in reasons(result)


@pytest.mark.parametrize("to_node0, to_node1, expected", [(30, 30, 0), (40, 30, 1), (30, 40, 0)])
def test_cpu_less_gpu_node_nearest_by_slit_ties_by_lowest_id(to_node0, to_node1, expected):
    nodes = [tf.make_node(0, range(4)), tf.make_node(1, range(4, 8)), tf.make_node(2, (), 96)]
    distances = [[10, 20, to_node0], [20, 10, to_node1], [to_node0, to_node1, 10]]
    topology = tf.make_topology(nodes, distances=distances, gpus=[tf.make_gpu("0000:01:00.0", 2)])
    assert place(topology).node == expected


def test_gpu_local_node_outside_the_cpuset_maps_to_the_nearest_usable_node():
    result = place(tf.dual_socket_gpu(allowed="0-39", mems_allowed="0"))
    assert result.node == 0
    assert "GPU 0000:81:00.0 is on node 1, which is not usable" in reasons(result)


def test_instance_with_gpus_on_two_nodes_goes_where_most_of_them_are():
    gpus = [tf.make_gpu("0000:01:00.0", 0), tf.make_gpu("0000:41:00.0", 1), tf.make_gpu("0000:81:00.0", 1)]
    topology = tf.make_topology([tf.make_node(0, range(4)), tf.make_node(1, range(4, 8))], gpus=gpus)
    assert place(topology, gpus=3).node == 1
    assert place(topology, gpus=["0000:01:00.0", "0000:41:00.0"]).node == 0  # a tie: lowest id


def test_amd_gpus_set_rocr_visible_devices_by_amd_ordinal():
    gpus = [tf.make_gpu("0000:05:00.0", 0, vendor="amd"), tf.make_gpu("0000:45:00.0", 2, vendor="amd"),
            tf.make_gpu("0000:85:00.0", 5, vendor="amd")]
    result = place(tf.amd_nps4(gpus=gpus), instances=3, instance=2)
    assert (result.node, result.gpus) == (5, ["0000:85:00.0"])
    assert result.env == {"ROCR_VISIBLE_DEVICES": "2", "OMP_NUM_THREADS": "32"}


def test_nvidia_index_falls_back_to_pci_order_when_the_reader_gave_none():
    topology = tf.dual_socket_gpu()
    for gpu in topology["gpus"]:
        gpu["cuda_index"] = None
    assert place(topology, instances=2, instance=1).env["CUDA_VISIBLE_DEVICES"] == "1"


# ------------------------------------------------------------ memory score ---

def test_equal_nodes_get_one_instance_each():
    assert [place(tf.dual_socket_gpu(), gpus="none", instances=2, instance=i).node for i in (0, 1)] == [0, 1]
    assert [place(tf.amd_nps4(), instances=8, instance=i).node for i in range(8)] == list(range(8))


def test_more_free_memory_wins():
    result = place(tf.dual_socket_gpu(available_gib=(100, 200)), gpus="none")
    assert result.node == 1
    assert "node 1 chosen by memory score" in reasons(result)


def test_instances_spread_then_double_up_in_order():
    nodes = [place(tf.dual_socket_gpu(), gpus="none", instances=3, instance=i).node for i in range(3)]
    assert nodes == [0, 1, 0]


def test_earlier_instances_memory_counts_against_a_node():
    result = place(tf.dual_socket_gpu(), gpus="none", node=0, model_size=150 * GIB, instances=2, instance=1)
    assert (result.policy, result.mem_nodes) == ("interleave", [0, 1])
    assert "instance 0 placed before this one: bind on node(s) 0" in reasons(result)
    assert "does not fit node 0 (64 GiB available)" in reasons(result)


def test_memory_score_sees_what_earlier_instances_took():
    # Untouched, node 0 (250 of 256 GiB free) would outscore node 1 (150 GiB) even holding one instance;
    # after instance 0 took 100 GiB of it, node 1 wins.
    topology = tf.dual_socket_gpu(available_gib=(250, 150))
    nodes = [place(topology, gpus="none", model_size=90 * GIB, memory_headroom="10G", instances=2, instance=i).node
             for i in (0, 1)]
    assert nodes == [0, 1]


def test_a_node_where_the_model_fits_beats_a_better_score():
    nodes = [tf.make_node(0, range(4), total_gib=100, available_gib=50),
             tf.make_node(1, range(4, 8), total_gib=30, available_gib=25)]
    result = place(tf.make_topology(nodes), model_size=40 * GIB)
    assert (result.node, result.policy) == (0, "bind")
    assert "only nodes where the model fits were considered" in reasons(result)


# ----------------------------------------------------------------- memory ---

def test_fitting_model_binds_to_the_anchor():
    result = place(tf.amd_nps4(), model_size=14 * GIB)
    assert (result.policy, result.mem_nodes, result.cpu_nodes) == ("bind", [0], [0])
    assert result.required_bytes == 14 * GIB + 1503238554 + GIB  # 10% of 14 GiB, rounded up
    assert result.available_bytes == 60 * GIB
    assert "model 14 GiB + headroom 2.4 GiB (10%+1G) = 16.4 GiB fits node 0 (60 GiB available): binding" in reasons(result)


def test_too_big_for_one_node_interleaves_over_the_nearest_fitting_set():
    result = place(tf.amd_nps4(), model_size=100 * GIB)
    assert (result.policy, result.node, result.mem_nodes, result.cpu_nodes) == ("interleave", 0, [0, 1], [0, 1])
    assert result.available_bytes == 120 * GIB
    assert ("does not fit node 0 (60 GiB available); interleaving over nodes 0-1 (nearest by SLIT, "
            "120 GiB available)") in reasons(result)


def test_interleave_set_grows_nearest_first_ties_by_id():
    result = place(tf.amd_nps4(), node=5, model_size=150 * GIB)
    assert result.mem_nodes == [4, 5, 6]


def test_interleave_crosses_sockets_only_when_the_socket_is_not_enough():
    result = place(tf.amd_nps4(), node=1, model_size=210 * GIB)
    assert result.mem_nodes == [0, 1, 2, 3]
    result = place(tf.amd_nps4(), node=1, model_size=230 * GIB)
    assert result.mem_nodes == [0, 1, 2, 3, 4]


def test_weighted_interleave_when_kernel_weights_differ_within_the_set():
    weights = {"0": 3, "1": 1, "2": 1, "3": 1, "4": 1, "5": 1, "6": 1, "7": 1}
    result = place(tf.amd_nps4(weighted_interleave=weights), model_size=100 * GIB)
    assert result.policy == "weighted-interleave"
    assert "kernel interleave weights differ (node 0: 3, node 1: 1)" in reasons(result)


@pytest.mark.parametrize("weights", [None, {"0": 1, "1": 1, "2": 5}, {}])
def test_plain_interleave_when_weights_are_equal_absent_or_outside_the_set(weights):
    assert place(tf.amd_nps4(weighted_interleave=weights), model_size=100 * GIB).policy == "interleave"


def test_nothing_fits_is_a_placement_error_naming_sizes_and_fix():
    with pytest.raises(PlacementError) as error:
        place(tf.dual_socket_gpu(), gpus="none", model_size=500 * GIB)
    message = str(error.value)
    assert "model 500 GiB + headroom 51 GiB (10%+1G) = 551 GiB does not fit even all usable node(s) 0-1" in message
    assert "460 GiB available" in message
    assert "leave model_size unset" in message


def test_on_unfit_fail_refuses_to_interleave():
    with pytest.raises(PlacementError) as error:
        place(tf.amd_nps4(), model_size=100 * GIB, on_unfit="fail")
    assert "does not fit node 0 (60 GiB available" in str(error.value)
    assert "set on_unfit to 'interleave' to spread it over nodes 0-1" in str(error.value)


def test_cpu_less_memory_node_never_enters_a_memory_set():
    result = place(tf.cxl_memory(), model_size=100 * GIB)
    assert result.mem_nodes == [0, 1]
    assert "node 2: no CPUs (memory-only node)" in reasons(result)


def test_unknown_model_size_binds_without_a_fit_check():
    result = place(tf.one_node_vm())
    assert (result.policy, result.mem_nodes, result.cpus, result.required_bytes) == ("bind", [0], [0, 1, 2, 3], None)
    assert "model size unknown: binding to node 0 without a fit check" in result.reasons


# ------------------------------------------------------- explicit policies ---

def test_bind_that_does_not_fit_fails_with_on_unfit_fail():
    with pytest.raises(PlacementError):
        place(tf.amd_nps4(), policy="bind", model_size=100 * GIB, on_unfit="fail")


def test_bind_that_does_not_fit_falls_back_to_interleave_by_default():
    result = place(tf.amd_nps4(), policy="bind", model_size=100 * GIB)
    assert (result.policy, result.mem_nodes) == ("interleave", [0, 1])


def test_preferred_never_fails_on_fit():
    result = place(tf.one_node_vm(), policy="preferred", model_size=1024 * GIB, on_unfit="fail")
    assert (result.policy, result.mem_nodes, result.cpu_nodes) == ("preferred", [0], [0])
    assert "the kernel spills the rest to other nodes" in reasons(result)


def test_explicit_interleave_uses_the_minimal_fitting_set():
    assert place(tf.amd_nps4(), policy="interleave", model_size=14 * GIB).mem_nodes == [0]
    assert place(tf.amd_nps4(), policy="interleave", model_size=14 * GIB).policy == "interleave"
    assert place(tf.amd_nps4(), policy="interleave", model_size=100 * GIB).mem_nodes == [0, 1]


def test_explicit_interleave_of_unknown_size_covers_the_anchors_package():
    result = place(tf.amd_nps4(), policy="interleave", node=6)
    assert (result.policy, result.mem_nodes, result.cpu_nodes) == ("interleave", [4, 5, 6, 7], [4, 5, 6, 7])


# ------------------------------------------------------------------ scope ---

def test_socket_scope_takes_the_whole_package():
    result = place(tf.amd_nps4(), scope="socket", model_size=100 * GIB)
    assert (result.policy, result.mem_nodes, result.cpu_nodes) == ("bind", [0, 1, 2, 3], [0, 1, 2, 3])
    assert result.cpulist == "0-63,128-191"


def test_socket_scope_places_instances_on_different_packages():
    assert place(tf.amd_nps4(), scope="socket", instances=2, instance=1).mem_nodes == [4, 5, 6, 7]


def test_socket_scope_grows_past_the_package_when_it_does_not_fit():
    result = place(tf.amd_nps4(), scope="socket", model_size=300 * GIB)
    assert (result.policy, result.mem_nodes) == ("interleave", [0, 1, 2, 3, 4, 5])


# ------------------------------------------------------------------- CPUs ---

def test_smt_off_takes_the_lowest_sibling_of_each_core():
    result = place(tf.dual_socket_gpu(), smt=False)
    assert result.cpus == list(range(40, 80))
    assert result.threads == 40
    assert result.env["OMP_NUM_THREADS"] == "40"


def test_smt_off_uses_the_other_sibling_when_the_lowest_is_reserved():
    result = place(tf.dual_socket_gpu(), gpus="none", smt=False, reserve_cpus=[0])
    assert result.cpus == list(range(1, 40)) + [80]


def with_kinds(topology, *kinds):
    """``topology`` with the facts' cpus.kinds: one cpu list per kind, fastest first."""
    topology["cpus"]["kinds"] = [{"capacity": None, "max_freq_khz": 4000000 - 500000 * rank, "base_freq_khz": None,
                                  "cpulist": cpulist, "rank": rank} for rank, cpulist in enumerate(kinds)]
    return topology


def test_cores_fast_takes_only_each_nodes_fastest_kind_and_says_what_it_left():
    # Priority Core Turbo on each socket: its first 8 cores (and their siblings) of 40 turbo higher.
    topology = with_kinds(tf.dual_socket_gpu(), "0-7,40-47,80-87,120-127", "8-39,48-79,88-119,128-159")
    result = place(topology, gpus="none", node=1, cores="fast")
    assert result.cpus == list(range(40, 48)) + list(range(120, 128))
    assert "cores fast: node 1 uses its fastest CPUs 40-47,120-127 and leaves the slower 48-79,128-159" in reasons(
        result)
    assert place(topology, gpus="none", node=1).cpus == NODE1
    assert result.to_dict()["inputs"]["cores"] == "fast" and "cores" not in place(topology).to_dict()["inputs"]


def test_cores_fast_keeps_a_nodes_best_kind_when_its_fastest_cpus_are_reserved():
    topology = with_kinds(tf.make_topology([tf.make_node(0, range(4)), tf.make_node(1, range(4, 8))]), "0-1", "2-7")
    assert place(topology, gpus="none", node=0, cores="fast").cpus == [0, 1]
    assert place(topology, gpus="none", node=0, cores="fast", reserve_cpus="0-1").cpus == [2, 3]
    assert place(topology, gpus="none", node=1, cores="fast").cpus == [4, 5, 6, 7]


def test_cores_fast_leaves_no_cpu_of_no_kind_and_uses_all_on_a_host_of_one_kind():
    topology = with_kinds(tf.make_topology([tf.make_node(0, range(4))]), "0", "1")
    assert place(topology, gpus="none", cores="fast").cpus == [0, 2, 3]  # 2 and 3 are of no kind: not known slower
    alike = place(tf.one_node_vm(), gpus="none", cores="fast")
    assert alike.cpus == place(tf.one_node_vm(), gpus="none").cpus
    assert "cores fast: every CPU of this host is of one kind" in reasons(alike)


@pytest.mark.parametrize("kinds", [[{"cpulist": "0-1"}], [{"cpulist": "x", "rank": 0}], ["0-1"], "0-1",
                                   [{"cpulist": "0", "rank": -1}], [{"cpulist": "0", "rank": True}]])
def test_cores_fast_refuses_kinds_numa_facts_would_not_write(kinds):
    topology = tf.one_node_vm()
    topology["cpus"]["kinds"] = kinds
    with pytest.raises(PlacementError, match="cpus.kinds entry .* has no cpulist and rank: plan on the numa facts"):
        place(topology, cores="fast")


def test_instances_sharing_a_small_node_share_all_its_cpus():
    topology = tf.make_topology([tf.make_node(0, range(2)), tf.make_node(1, range(2, 4))])
    result = place(topology, instances=3, instance=2, anchors="0,0,0")
    assert result.cpus == [0, 1]
    assert "node 0 has 2 usable core(s) for instances 0-2: they share all of them" in reasons(result)


def test_more_instances_than_usable_cpus_fail_before_planning():
    with pytest.raises(PlacementError, match=r"instances=5 but this host has 4 usable CPU\(s\)"):
        place(tf.one_node_vm(), instances=5)
    with pytest.raises(PlacementError, match=r"instances=3 but this host has 2 usable CPU\(s\)"):
        place(tf.one_node_vm(), instances=3, reserve_cpus="0-1")
    assert place(tf.one_node_vm(), instances=4, instance=3).cpus == [3]


def test_instances_on_one_node_split_its_cores():
    cpus = [place(tf.one_node_vm(), instances=2, instance=i).cpus for i in (0, 1)]
    assert cpus == [[0, 1], [2, 3]]


# ----------------------------------------------------------------- output ---

def test_plan_to_dict_is_json_with_every_field():
    result = place(tf.dual_socket_gpu(), instances=2, instance=1, port_base=8080, model_size="14G")
    data = json.loads(json.dumps(result.to_dict()))
    assert set(data) == {"policy", "node", "mem_nodes", "cpu_nodes", "cpus", "cpulist", "threads", "gpus", "gpu_map",
                         "engine", "env",
                         "instance", "instances", "port", "required_bytes", "available_bytes", "reasons", "inputs"}
    assert (data["port"], data["instance"], data["instances"], data["cpulist"]) == (8081, 1, 2, "60-79,140-159")
    assert data["inputs"]["model_size"] == 14 * GIB
    assert data["inputs"]["port_base"] == 8080


def test_port_is_null_without_port_base():
    assert place(tf.one_node_vm()).port is None


def test_summary_is_one_line():
    assert place(tf.dual_socket_gpu()).summary() == (
        "instance 0/1: bind memory on node(s) 1, cpus 40-79,120-159 (80 threads), gpus 0000:81:00.0")


def _shuffled(topology, seed):
    rng = random.Random(seed)
    rng.shuffle(topology["nodes"])
    rng.shuffle(topology["gpus"])
    for node in topology["nodes"]:
        items = list(node["distances"].items())
        rng.shuffle(items)
        node["distances"] = dict(items)
    return topology


@pytest.mark.parametrize("seed", range(5))
def test_same_input_same_plan_whatever_the_dict_and_list_order(seed):
    topology = tf.amd_nps4(gpus=[tf.make_gpu("0000:05:00.0", 3), tf.make_gpu("0000:85:00.0", 6)])
    expected = place(topology, instances=3, instance=2, model_size=100 * GIB).to_dict()
    # The node-order matrix moves with the nodes, so drop it and rely on each node's own distances.
    shuffled = _shuffled(tf.amd_nps4(gpus=[tf.make_gpu("0000:85:00.0", 6), tf.make_gpu("0000:05:00.0", 3)]), seed)
    shuffled["distances"] = []
    assert place(shuffled, instances=3, instance=2, model_size=100 * GIB).to_dict() == expected


# ---------------------------------------------------------------- anchors ---

def test_anchors_fix_each_instance_node_whatever_memory_is_free_now():
    # Instance 0 already runs on node 0 and used memory there: without anchors the
    # simulation would count it twice and send instance 1 to node 0 as well.
    busy = tf.dual_socket_gpu(available_gib=(170, 230))
    assert place(busy, gpus="none", instances=2, instance=1).node == 0
    pinned = place(busy, gpus="none", instances=2, instance=1, anchors="0,1", model_size="14G")
    assert (pinned.node, pinned.mem_nodes, pinned.policy) == (1, [1], "bind")
    assert "node 1 chosen: the deployment's anchor for instance 1" in reasons(pinned)


def test_anchors_keep_order_and_repeats():
    assert Request(instances=3, anchors=[1, 0, 1]).anchors == [1, 0, 1]
    assert Request(instances=2, anchors="1,0").anchors == [1, 0]


@pytest.mark.parametrize("options, message", [
    ({"instances": 2, "anchors": "0"}, r"name 1 node\(s\) for 2 instance\(s\)"),
    ({"instances": 2, "anchors": "0,x"}, "anchors entry"),
    ({"instances": 1, "anchors": "0", "node": 1}, "node and anchors both given"),
])
def test_bad_anchors_are_clear_errors(options, message):
    with pytest.raises(NumaError, match=message):
        Request(**options)


def test_an_anchor_on_a_node_the_host_lacks_fails_whichever_instance_it_names():
    for instance in (0, 1):
        with pytest.raises(PlacementError, match=r"anchors name node\(s\) 5, which this host does not have "
                                                 r"\(node\(s\) 0-1\)"):
            place(tf.dual_socket_gpu(), instances=2, anchors="0,5", instance=instance)


# ------------------------------------------------- exact boundaries (tests/mutants.py) ---
# Each of these fails when one rule of the planner is inverted or off by one: a node's free memory equal to the
# need, a score decided by its 3/5 and 2/5 weights, the last node of a spill.

def _exact_fit_host():
    """Node 0 scores higher (90 % of its 10 GiB free), node 1 has 50 GiB free of 100: only node 1 can hold 50 GiB."""
    return tf.make_topology([tf.make_node(0, range(4), total_gib=10, available_gib=9),
                             tf.make_node(1, range(4, 8), total_gib=100, available_gib=50)])


def test_a_model_of_exactly_a_nodes_free_memory_fits_it_and_binds_there():
    result = place(_exact_fit_host(), model_size=50 * GIB, memory_headroom="0")
    assert (result.node, result.policy, result.mem_nodes) == (1, "bind", [1])
    assert result.required_bytes == result.available_bytes == 50 * GIB
    assert "only nodes where the model fits were considered" in reasons(result)
    assert "model 50 GiB + headroom 0 B (0) = 50 GiB fits node 1 (50 GiB available): binding" in reasons(result)


def test_a_model_one_byte_over_a_nodes_free_memory_spills_to_the_next_node():
    result = place(_exact_fit_host(), node=1, model_size=50 * GIB + 1, memory_headroom="0")
    assert (result.policy, result.mem_nodes) == ("interleave", [0, 1])
    assert result.available_bytes == 59 * GIB


def test_preferred_memory_of_exactly_the_nodes_free_memory_is_said_to_fit():
    result = place(_exact_fit_host(), policy="preferred", node=1, model_size=50 * GIB, memory_headroom="0")
    assert "preferred memory on node 1: model 50 GiB + headroom 0 B (0) = 50 GiB fits (50 GiB available)" \
        in reasons(result)
    over = place(_exact_fit_host(), policy="preferred", node=1, model_size=50 * GIB + 1, memory_headroom="0")
    assert "does not fit (50 GiB available); the kernel spills the rest" in reasons(over)


def test_a_spill_reaches_the_last_usable_node_and_no_further():
    nodes = [tf.make_node(node, range(2 * node, 2 * node + 2), total_gib=10, available_gib=10) for node in range(3)]
    result = place(tf.make_topology(nodes), node=0, model_size=30 * GIB, memory_headroom="0")
    assert (result.policy, result.mem_nodes) == ("interleave", [0, 1, 2])
    with pytest.raises(PlacementError, match="does not fit even all usable node"):
        place(tf.make_topology(nodes), node=0, model_size=30 * GIB + 1, memory_headroom="0")


def test_the_score_weighs_free_memory_three_fifths_and_the_spread_two_fifths():
    # Instance 1: node 0 (all free, instance 0 there) scores 0.6 * 1 + 0.4 / 2 = 0.8, node 1 (half free, empty)
    # 0.6 * 0.5 + 0.4 = 0.7, so it doubles up on node 0; weights of 2/5 and 3/5 would give 0.7 and 0.8.
    topology = tf.make_topology([tf.make_node(0, range(4), total_gib=100, available_gib=100),
                                 tf.make_node(1, range(4, 8), total_gib=100, available_gib=50)])
    results = [place(topology, instances=2, instance=index) for index in (0, 1)]
    assert [result.node for result in results] == [0, 0]
    assert "node 0 chosen by memory score 1.000: 100% of its memory available, 0 instance(s) already there" \
        in reasons(results[0])
    assert "node 0 chosen by memory score 0.800: 100% of its memory available, 1 instance(s) already there" \
        in reasons(results[1])


def test_a_spill_takes_the_nearest_node_by_slit_not_the_lowest_id_or_the_farthest():
    nodes = [tf.make_node(node, range(2 * node, 2 * node + 2), total_gib=10, available_gib=10) for node in range(3)]
    distances = [[10, 30, 12], [30, 10, 12], [12, 12, 10]]
    result = place(tf.make_topology(nodes, distances=distances), node=0, model_size=15 * GIB, memory_headroom="0")
    assert (result.policy, result.mem_nodes) == ("interleave", [0, 2])
    assert "interleaving over nodes 0,2 (nearest by SLIT, 20 GiB available)" in reasons(result)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(0, 1), st.integers(-2, 2), st.sampled_from(["one", "all"]))
def test_a_model_binds_exactly_when_it_fits_the_node_and_spills_exactly_when_it_fits_both(free0, free1, node, off,
                                                                                          target):
    # Sizes in MiB around the boundaries: the node's own free memory, and both nodes' together.
    mib = 1024 * 1024
    topology = tf.make_topology([tf.make_node(0, range(2), total_gib=1, available_gib=free0 / 1024),
                                 tf.make_node(1, range(2, 4), total_gib=1, available_gib=free1 / 1024)])
    own = (free0, free1)[node] * mib
    both = (free0 + free1) * mib
    size = max(0, (own if target == "one" else both) + off)
    try:
        result = place(topology, node=node, model_size=size, memory_headroom="0")
    except PlacementError:
        assert size > both
        return
    if size <= own:
        assert (result.policy, result.mem_nodes, result.available_bytes) == ("bind", [node], own)
    else:
        assert size <= both and (result.policy, result.mem_nodes) == ("interleave", [0, 1])
        assert result.available_bytes == both
