"""Weighted-interleave weights: chosen from measured, HMAT or the kernel's auto (decide/weights.py), written to the
kernel and a tmpfiles.d drop-in (act/weights.py), on constructed sysfs trees."""

import json
import os

import pytest
from hypothesis import given, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import cost, weights
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide import weights as choice
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read
from tests.fixtures import sysfs

WEIGHTS = "sys/kernel/mm/mempolicy/weighted_interleave"


def host(tmp_path, **recipe):
    root = str(tmp_path / "root")
    sysfs.snc2_cxl(**recipe).write(root)
    return root


def kernel_weights(root):
    return {int(name[4:]): int(open(os.path.join(root, WEIGHTS, name)).read())
            for name in os.listdir(os.path.join(root, WEIGHTS)) if name.startswith("node")}


def no_record(_directory):
    return None


def test_bandwidths_become_tenths_of_the_fastest_reduced():
    assert choice.weights_from_bandwidth({0: 20000, 1: 20000, 4: 10000}) == {0: 2, 1: 2, 4: 1}
    assert choice.weights_from_bandwidth({0: 20000, 1: 18000}) == {0: 10, 1: 9}
    # Measurement noise between two identical nodes makes no difference in weight.
    assert choice.weights_from_bandwidth({0: 41.8, 1: 41.5}) == {0: 1, 1: 1}
    # A node far below the others still gets pages.
    assert choice.weights_from_bandwidth({0: 1000.0, 1: 1.0}) == {0: 10, 1: 1}
    assert choice.weights_from_bandwidth({}) == {}


@given(st.dictionaries(st.integers(0, 63), st.floats(0.01, 1e6), min_size=1, max_size=16))
def test_weights_are_kernel_values_in_the_bandwidths_order(bandwidths):
    result = choice.weights_from_bandwidth(bandwidths)
    assert set(result) == set(bandwidths)
    assert all(1 <= weight <= choice.STEPS for weight in result.values())
    for node, bandwidth in bandwidths.items():
        for other, other_bandwidth in bandwidths.items():
            if bandwidth > other_bandwidth:
                assert result[node] >= result[other]


def test_hmat_weights_are_written_to_the_kernel_and_a_boot_time_dropin(tmp_path):
    root = host(tmp_path)
    plan = weights.make_plan(root, read_record=no_record)
    assert plan.source == "hmat" and plan.desired == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1}
    assert "measured: no numa_cost record" in plan.reasons[0]
    assert weights.result(plan, True)["msg"].startswith("would set node0 1 -> 2")
    weights.apply(plan)
    assert kernel_weights(root) == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1}
    dropin = open(os.path.join(root, "etc/tmpfiles.d", weights.DROPIN_NAME)).read()
    assert "w /sys/kernel/mm/mempolicy/weighted_interleave/node4 - - - - 1\n" in dropin
    again = weights.make_plan(root, read_record=no_record)
    assert not again.changed and weights.result(again, False)["msg"].startswith("weights already as wanted")


def test_check_mode_plan_shows_the_diff_and_changes_nothing(tmp_path):
    root = host(tmp_path)
    plan = weights.make_plan(root, read_record=no_record)
    dropin_diff, runtime_diff = weights.diff(plan)
    assert dropin_diff["before"] == "" and "node0 - - - - 2" in dropin_diff["after"]
    assert "node4 = 1\n" in runtime_diff["before"] and "node0 = 2\n" in runtime_diff["after"]
    assert kernel_weights(root) == {node: 1 for node in range(5)}
    assert not os.path.exists(os.path.join(root, "etc/tmpfiles.d"))


def test_a_measured_record_of_this_topology_wins_over_hmat(tmp_path):
    root = host(tmp_path)
    nodes = [0, 1, 2, 3, 4]
    # Rows are CPU nodes 0-3 (node 4 has none); the expander gave a third of DRAM's bandwidth.
    matrix = [[30.0 if col == row else 20.0 if col < 4 else 10.0 for col in nodes] for row in range(4)] + [[None] * 5]
    state = str(tmp_path / "state")
    cost.record({"nodes": nodes, "bandwidth_gbps": matrix, "latency_ns": matrix,
                 "topology_signature": choice.topology_signature(read(root))}, state)
    plan = weights.make_plan(root, record_dir=state)
    assert plan.source == "measured" and plan.desired == {0: 10, 1: 10, 2: 10, 3: 10, 4: 3}, plan.reasons


def test_a_record_of_another_topology_is_passed_over_with_the_reason(tmp_path):
    root = host(tmp_path)
    record = {"nodes": [0, 1], "bandwidth_gbps": [[1.0, 1.0], [1.0, 1.0]], "topology_signature": "node0:2cpu"}
    plan = weights.make_plan(root, read_record=lambda _directory: record)
    assert plan.source == "hmat"
    assert "of another topology" in plan.reasons[0]
    with pytest.raises(NumaError, match="no measured bandwidth to weigh by: measured: the numa_cost record is of"):
        weights.make_plan(root, "measured", read_record=lambda _directory: record)


def test_an_untrusted_record_is_passed_over_by_auto_and_refused_by_measured(tmp_path):
    root = host(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / cost.RECORD_NAME).write_text(json.dumps({"nodes": []}))
    os.chmod(str(state / cost.RECORD_NAME), 0o666)
    plan = weights.make_plan(root, record_dir=str(state))
    assert plan.source == "hmat" and "only a regular file that root alone may write" in plan.reasons[0]
    with pytest.raises(NumaError, match="ignoring .*cost.json"):
        weights.make_plan(root, "measured", record_dir=str(state))


def test_without_hmat_or_record_a_616_kernel_computes_them(tmp_path):
    root = host(tmp_path, hmat=False, auto=False)
    plan = weights.make_plan(root, read_record=no_record)
    assert plan.source == "kernel" and plan.auto_after is True and plan.desired == {}
    weights.apply(plan)
    assert open(os.path.join(root, WEIGHTS, "auto")).read().strip() == "true"
    assert "w /sys/kernel/mm/mempolicy/weighted_interleave/auto - - - - true" in plan.dropin_after


def test_explicit_weights_switch_a_kernels_auto_mode_off(tmp_path):
    root = host(tmp_path, auto=True)
    plan = weights.make_plan(root, "hmat", read_record=no_record)
    assert plan.auto_before is True and plan.auto_after is False
    weights.apply(plan)
    assert open(os.path.join(root, WEIGHTS, "auto")).read().strip() == "false"


def test_nothing_to_weigh_by_changes_nothing_and_says_why(tmp_path):
    root = host(tmp_path, hmat=False)
    plan = weights.make_plan(root, read_record=no_record)
    assert not plan.changed and plan.source is None
    assert plan.reasons[-1] == "weights left as they are"
    assert any("HMAT gives no bandwidth" in reason for reason in plan.reasons)
    with pytest.raises(NumaError, match="choose source hmat or measured"):
        weights.make_plan(root, "kernel", read_record=no_record)
    with pytest.raises(NumaError, match="no hmat bandwidth"):
        weights.make_plan(root, "hmat", read_record=no_record)


def test_a_kernel_without_weighted_interleave_gets_plain_interleave_and_the_reason(tmp_path):
    root = host(tmp_path, weights=False)
    plan = weights.make_plan(root, read_record=no_record)
    assert not plan.supported and not plan.changed
    assert "6.1.0-40-amd64" in plan.reasons[0] and "plain interleave" in plan.reasons[0]


def test_persist_false_removes_the_dropin(tmp_path):
    root = host(tmp_path)
    weights.apply(weights.make_plan(root, read_record=no_record))
    plan = weights.make_plan(root, persist=False, read_record=no_record)
    assert plan.changed and plan.dropin_after is None and not plan.runtime_changes
    weights.apply(plan)
    assert not os.path.exists(os.path.join(root, "etc/tmpfiles.d", weights.DROPIN_NAME))


def test_a_planted_symlink_at_the_dropin_is_refused(tmp_path):
    root = host(tmp_path)
    os.makedirs(os.path.join(root, "etc/tmpfiles.d"))
    os.symlink("/etc/shadow", os.path.join(root, "etc/tmpfiles.d", weights.DROPIN_NAME))
    with pytest.raises(NumaError, match="refusing to use .*a symlink"):
        weights.make_plan(root, read_record=no_record)


def test_a_weight_file_replaced_by_a_symlink_is_never_written_through(tmp_path):
    root = host(tmp_path)
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    node0 = os.path.join(root, WEIGHTS, "node0")
    os.unlink(node0)
    os.symlink(str(target), node0)
    plan = weights.make_plan(root, read_record=no_record)
    with pytest.raises(NumaError, match="refusing to write"):
        weights.apply(plan)
    assert target.read_text() == "keep\n"


def test_the_facts_carry_each_memory_nodes_hmat_figures(tmp_path):
    facts = read(host(tmp_path))
    assert facts["nodes"][4]["hmat"] == {"read_bandwidth": 10000, "write_bandwidth": 10000,
                                         "read_latency": 250, "write_latency": 250}
    assert read(host(tmp_path / "bare", hmat=False))["nodes"][0]["hmat"] is None
