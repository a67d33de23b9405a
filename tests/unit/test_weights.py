"""Weighted-interleave weights: chosen from measured, HMAT or the kernel's auto (decide/weights.py), written to the
kernel and a tmpfiles.d drop-in (act/interleave_weights.py), on constructed sysfs trees."""

import json
import os
import re

import pytest
from hypothesis import given, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import interleave_weights, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import cost
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
    plan = interleave_weights.make_plan(root, read_record=no_record)
    assert plan.source == "hmat" and plan.desired == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1}
    assert "measured: no numa_cost record" in plan.reasons[0]
    assert interleave_weights.result(plan, True)["msg"].startswith("would set node0 1 -> 2")
    knobs.apply(plan.knob)
    assert kernel_weights(root) == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1}
    dropin = open(os.path.join(root, "etc/tmpfiles.d", interleave_weights.DROPIN_NAME)).read()
    assert "w /sys/kernel/mm/mempolicy/weighted_interleave/node4 - - - - 1\n" in dropin
    again = interleave_weights.make_plan(root, read_record=no_record)
    assert not again.changed and interleave_weights.result(again, False)["msg"].startswith("weights already as wanted")


def test_check_mode_plan_shows_the_diff_and_changes_nothing(tmp_path):
    root = host(tmp_path)
    plan = interleave_weights.make_plan(root, read_record=no_record)
    dropin_diff, runtime_diff = interleave_weights.diff(plan)
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
    plan = interleave_weights.make_plan(root, record_dir=state)
    assert plan.source == "measured" and plan.desired == {0: 10, 1: 10, 2: 10, 3: 10, 4: 3}, plan.reasons


def test_a_record_of_another_topology_is_passed_over_with_the_reason(tmp_path):
    root = host(tmp_path)
    record = {"nodes": [0, 1], "bandwidth_gbps": [[1.0, 1.0], [1.0, 1.0]], "topology_signature": "node0:2cpu"}
    plan = interleave_weights.make_plan(root, read_record=lambda _directory: record)
    assert plan.source == "hmat"
    assert "of another topology" in plan.reasons[0]
    with pytest.raises(NumaError, match="no measured bandwidth to weigh by: measured: the numa_cost record is of"):
        interleave_weights.make_plan(root, "measured", read_record=lambda _directory: record)


def test_an_untrusted_record_is_passed_over_by_auto_and_refused_by_measured(tmp_path):
    root = host(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / cost.RECORD_NAME).write_text(json.dumps({"nodes": []}))
    os.chmod(str(state / cost.RECORD_NAME), 0o666)
    plan = interleave_weights.make_plan(root, record_dir=str(state))
    assert plan.source == "hmat" and "only a regular file that root alone may write" in plan.reasons[0]
    with pytest.raises(NumaError, match="ignoring .*cost.json"):
        interleave_weights.make_plan(root, "measured", record_dir=str(state))


def test_without_hmat_or_record_a_616_kernel_computes_them(tmp_path):
    root = host(tmp_path, hmat=False, auto=False)
    plan = interleave_weights.make_plan(root, read_record=no_record)
    assert plan.source == "kernel" and plan.auto_after is True and plan.desired == {}
    knobs.apply(plan.knob)
    assert open(os.path.join(root, WEIGHTS, "auto")).read().strip() == "true"
    assert "w /sys/kernel/mm/mempolicy/weighted_interleave/auto - - - - true" in plan.dropin_after


def test_explicit_weights_switch_a_kernels_auto_mode_off(tmp_path):
    root = host(tmp_path, auto=True)
    plan = interleave_weights.make_plan(root, "hmat", read_record=no_record)
    assert plan.auto_before is True and plan.auto_after is False
    knobs.apply(plan.knob)
    assert open(os.path.join(root, WEIGHTS, "auto")).read().strip() == "false"


def test_nothing_to_weigh_by_changes_nothing_and_says_why(tmp_path):
    root = host(tmp_path, hmat=False)
    plan = interleave_weights.make_plan(root, read_record=no_record)
    assert not plan.changed and plan.source is None
    assert plan.reasons[-1] == "weights left as they are"
    assert any("HMAT gives no bandwidth" in reason for reason in plan.reasons)
    with pytest.raises(NumaError, match="choose source hmat or measured"):
        interleave_weights.make_plan(root, "kernel", read_record=no_record)
    with pytest.raises(NumaError, match="no hmat bandwidth"):
        interleave_weights.make_plan(root, "hmat", read_record=no_record)


def test_a_kernel_without_weighted_interleave_gets_plain_interleave_and_the_reason(tmp_path):
    root = host(tmp_path, weights=False)
    plan = interleave_weights.make_plan(root, read_record=no_record)
    assert not plan.supported and not plan.changed
    assert "6.1.0-40-amd64" in plan.reasons[0] and "plain interleave" in plan.reasons[0]


def test_persist_false_removes_the_dropin(tmp_path):
    root = host(tmp_path)
    knobs.apply(interleave_weights.make_plan(root, read_record=no_record).knob)
    plan = interleave_weights.make_plan(root, persist=False, read_record=no_record)
    assert plan.changed and plan.dropin_after is None and not plan.runtime_changes
    knobs.apply(plan.knob)
    assert not os.path.exists(os.path.join(root, "etc/tmpfiles.d", interleave_weights.DROPIN_NAME))


def test_a_planted_symlink_at_the_dropin_is_refused(tmp_path):
    root = host(tmp_path)
    os.makedirs(os.path.join(root, "etc/tmpfiles.d"))
    os.symlink("/etc/shadow", os.path.join(root, "etc/tmpfiles.d", interleave_weights.DROPIN_NAME))
    with pytest.raises(NumaError, match="refusing to use .*a symlink"):
        interleave_weights.make_plan(root, read_record=no_record)


def test_a_weight_file_replaced_by_a_symlink_is_never_written_through(tmp_path):
    root = host(tmp_path)
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    node0 = os.path.join(root, WEIGHTS, "node0")
    os.unlink(node0)
    os.symlink(str(target), node0)
    plan = interleave_weights.make_plan(root, read_record=no_record)
    with pytest.raises(NumaError, match="refusing to write"):
        knobs.apply(plan.knob)
    assert target.read_text() == "keep\n"


def test_the_facts_carry_each_memory_nodes_hmat_figures(tmp_path):
    facts = read(host(tmp_path))
    assert facts["nodes"][4]["hmat"] == {"read_bandwidth": 10000, "write_bandwidth": 10000,
                                         "read_latency": 250, "write_latency": 250}
    assert read(host(tmp_path / "bare", hmat=False))["nodes"][0]["hmat"] is None


# --- a corrupt or extreme numa_cost record: the next source, a one-line warning, never a traceback -----------------

def record_text(root, cell="30.0", **fields):
    """A numa_cost record of this host's topology as JSON text, node 0 -> node 0's bandwidth written as ``cell``
    (any JSON text, kept as written), other fields replaced by ``fields`` (JSON texts too)."""
    nodes = [0, 1, 2, 3, 4]
    matrix = [["@cell" if (row, col) == (0, 0) else 30.0 if row < 4 else None for col in nodes] for row in nodes]
    record = {"nodes": nodes, "bandwidth_gbps": matrix, "latency_ns": matrix,
              "topology_signature": choice.topology_signature(read(root))}
    text = json.dumps(record).replace('"@cell"', cell)
    for name, value in fields.items():
        text = text.replace('"%s": ' % name, '"%s": %s, "was": ' % (name, value), 1)
    return text


def write_record(tmp_path, text):
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / cost.RECORD_NAME).write_text(text)
    os.chmod(str(state / cost.RECORD_NAME), 0o644)
    return str(state)


CORRUPT = [
    ("1e999", {}, r"bandwidth from node 0 to node 0 is inf, not a number of GB/s from 0 to 1e\+06"),
    ("9" * 400, {}, r"bandwidth from node 0 to node 0 is \(a 1329-bit number\), not a number of GB/s"),
    ("NaN", {}, "bandwidth from node 0 to node 0 is nan"),
    ("-Infinity", {}, "bandwidth from node 0 to node 0 is -inf"),
    ("-3.5", {}, "bandwidth from node 0 to node 0 is -3.5"),
    ("2e6", {}, "bandwidth from node 0 to node 0 is 2000000.0"),
    ('"30"', {}, "bandwidth from node 0 to node 0 is '30'"),
    ("[30.0]", {}, "bandwidth from node 0 to node 0 is a JSON list"),
    ("true", {}, "bandwidth from node 0 to node 0 is True"),
    ("30.0", {"nodes": "[0, 1, 2, 3, %s]" % ("9" * 400)}, "has no node list and bandwidth matrix of its size"),
    ("30.0", {"nodes": "[0, 1, 2, 3, 3]"}, "has no node list and bandwidth matrix of its size"),
    ("30.0", {"nodes": '"0-4"'}, "has no node list and bandwidth matrix of its size"),
    ("30.0", {"bandwidth_gbps": '{"0": 1}'}, "has no node list and bandwidth matrix of its size"),
    ("30.0", {"topology_signature": "[" * 500 + "]" * 500}, r"is of another topology \(its signature is no text\)"),
    ("[" * 100000 + "]" * 100000, {}, "not a JSON object of at most"),
]


@pytest.mark.parametrize("cell, fields, said", CORRUPT)
def test_a_corrupt_record_falls_back_to_hmat_with_one_line_saying_why(tmp_path, cell, fields, said):
    root = host(tmp_path)
    plan = interleave_weights.make_plan(root, record_dir=write_record(tmp_path, record_text(root, cell, **fields)))
    assert plan.source == "hmat" and plan.desired == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1}
    (warning,) = plan.warnings
    assert re.search(said, warning) and re.search(said, plan.reasons[0]), (warning, plan.reasons)
    assert warning.startswith("the numa_cost record is not used, the next source is: ") and "\n" not in warning
    assert re.search("; (measure again with numa_cost record: true|remove it)", warning), warning
    with pytest.raises(NumaError):  # asked for the measurement alone: refused, naming the same cause
        interleave_weights.make_plan(root, "measured",
                                     record_dir=write_record(tmp_path, record_text(root, cell, **fields)))


def test_a_sound_record_gives_no_warning_and_no_record_is_no_warning(tmp_path):
    root = host(tmp_path)
    assert not interleave_weights.make_plan(root, read_record=no_record).warnings
    plan = interleave_weights.make_plan(root, record_dir=write_record(tmp_path, record_text(root, "30.0")))
    assert plan.source == "measured" and not plan.warnings


def test_a_record_that_is_no_object_is_passed_over(tmp_path):
    root = host(tmp_path)
    plan = interleave_weights.make_plan(root, read_record=lambda _directory: [1, 2])
    assert plan.source == "hmat" and plan.warnings == (
        "the numa_cost record is not used, the next source is: the numa_cost record is no JSON object; measure again "
        "with numa_cost record: true",)


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                 st.lists(st.floats(), max_size=3)))
def test_any_value_in_a_cell_is_a_bandwidth_or_the_reason_it_is_none(cell):
    facts = {"nodes": [{"id": 0, "has_memory": True, "cpus": [0]}], "distances": [[10]]}
    record = {"nodes": [0], "bandwidth_gbps": [[cell]], "topology_signature": choice.topology_signature(facts)}
    found = choice.measured_bandwidths(facts, record)
    if found.by_node:
        assert 0 < found.by_node[0] <= choice.MAX_GBPS and choice.weights_from_bandwidth(found.by_node) == {0: 1}
    else:
        assert found.reason and "\n" not in found.reason


def test_numa_weights_warns_in_one_line_and_sets_the_hmat_weights(tmp_path, capsys, monkeypatch):
    from ansible_collections.inferops.numa.plugins.modules import numa_weights
    from tests.ansible_compat import clear_warnings, patch_module_args

    clear_warnings(monkeypatch)
    root = host(tmp_path)
    state = write_record(tmp_path, record_text(root, "1e999"))
    with patch_module_args({"root": root, "record_dir": state}), pytest.raises(SystemExit) as stop:
        numa_weights.main()
    result = json.loads(capsys.readouterr().out)
    assert stop.value.code == 0 and result["source"] == "hmat" and result["changed"]
    # ansible-core >= 2.19 wraps each warning in a WarningSummary dict
    assert [w["event"]["msg"] if isinstance(w, dict) else w for w in result["warnings"]] == [
        "the numa_cost record is not used, the next source is: the numa_cost record's bandwidth from node 0 to node 0 "
        "is inf, not a number of GB/s from 0 to 1e+06; measure again with numa_cost record: true"]


# --- exact rules of the choice (tests/mutants.py) ----------------------------------------------------------------

def test_a_weight_is_its_bandwidth_rounded_to_the_nearest_tenth_of_the_fastest():
    assert choice.weights_from_bandwidth({0: 20.0, 1: 17.6}) == {0: 10, 1: 9}  # 8.8 tenths round to 9, not 8
    assert choice.weights_from_bandwidth({0: 20.0, 1: 17.4}) == {0: 10, 1: 9}  # 8.7
    assert choice.weights_from_bandwidth({0: 20.0, 1: 16.8}) == {0: 5, 1: 4}  # 8.4 -> 8, then halved
    # In tenths of the fastest, whichever node is listed first.
    assert choice.weights_from_bandwidth({0: 18.0, 1: 20.0}) == {0: 9, 1: 10}


def test_a_node_below_a_twentieth_of_the_fastest_still_gets_weight_1():
    assert choice.weights_from_bandwidth({0: 100.0, 1: 4.9}) == {0: 10, 1: 1}  # 0.49 tenths: 0, raised to 1
    assert choice.weights_from_bandwidth({0: 100.0, 1: 0.01, 2: 100.0}) == {0: 10, 1: 1, 2: 10}


def _facts(nodes):
    return {"nodes": [dict({"id": node, "has_memory": True, "cpus": [node]}, **extra) for node, extra in nodes],
            "distances": [[10 if row == column else 20 for column, _ in nodes] for row, _ in nodes]}


def test_a_memory_nodes_measured_figure_is_the_best_any_cpu_node_got_from_it():
    facts = _facts([(0, {}), (1, {})])
    record = {"nodes": [0, 1], "bandwidth_gbps": [[40.0, 12.0], [20.0, 30.0]],
              "topology_signature": choice.topology_signature(facts)}
    found = choice.measured_bandwidths(facts, record)
    assert (found.source, found.by_node, found.reason) == ("measured", {0: 40.0, 1: 30.0}, "")
    record["bandwidth_gbps"] = [[choice.MAX_GBPS, None], [0, 1.0]]  # the bound itself is a bandwidth
    assert choice.measured_bandwidths(facts, record).by_node == {0: choice.MAX_GBPS, 1: 1.0}


def test_hmat_gives_the_lower_of_read_and_write_bandwidth():
    facts = _facts([(0, {"hmat": {"read_bandwidth": 20000, "write_bandwidth": 10000}}),
                    (1, {"hmat": {"read_bandwidth": 8000, "write_bandwidth": 16000}}),
                    (2, {"hmat": {"read_bandwidth": choice.MAX_HMAT_MBPS}})])
    found = choice.hmat_bandwidths(facts)
    assert (found.by_node, found.reason) == ({0: 10000.0, 1: 8000.0, 2: choice.MAX_HMAT_MBPS}, "")


def test_source_original_puts_back_the_weights_and_the_dropin(tmp_path, capsys, monkeypatch):
    from ansible_collections.inferops.numa.plugins.modules import numa_weights
    from tests.ansible_compat import clear_warnings, patch_module_args

    def run(**args):
        clear_warnings(monkeypatch)
        with patch_module_args(dict(args, root=root)), pytest.raises(SystemExit) as stop:
            numa_weights.main()
        return stop.value.code, json.loads(capsys.readouterr().out)

    root = host(tmp_path)
    dropin = os.path.join(root, "etc/tmpfiles.d", interleave_weights.DROPIN_NAME)
    record = os.path.join(root, "var/lib/inferops-numa/originals/numa_weights.json")
    assert run(source="hmat")[1]["changed"] and kernel_weights(root) == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1}
    assert os.path.exists(dropin) and os.path.exists(record)
    code, checked = run(source="original", _ansible_check_mode=True, _ansible_diff=True)
    assert code == 0 and checked["changed"] and checked["weights"] == {str(node): 1 for node in range(5)}
    assert checked["diff"][0]["after"] == "" and kernel_weights(root) == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1}
    code, restored = run(source="original")
    assert code == 0 and restored["changed"] and restored["source"] == "original"
    assert kernel_weights(root) == {node: 1 for node in range(5)}
    assert not os.path.exists(dropin) and not os.path.exists(record)
    code, again = run(source="original")
    assert code == 0 and not again["changed"] and "nothing to restore" in again["msg"]
