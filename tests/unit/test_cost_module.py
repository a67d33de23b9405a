"""The numa_cost module: options reach the engine, results come back, nothing is ever changed."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import cost
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.modules import numa_cost

from tests.ansible_compat import patch_module_args

RESULT = {"nodes": [0, 1], "latency_ns": [[90.0, 140.0], [None, None]], "bandwidth_gbps": [[30.0, 20.0], [None, None]],
          "latency_ratio": [[1.0, 1.56], [None, None]], "bandwidth_ratio": [[1.0, 0.67], [None, None]],
          "distance": [[10, 21], [21, 10]], "distance_ratio": [[1.0, 2.1], [2.1, 1.0]],
          "local_reference": [0, 1], "unmeasured": {"1->0": "node 1 has no CPUs", "1->1": "node 1 has no CPUs"},
          "placement": {}, "notes": [], "method": {"measured": "latency"}, "elapsed_seconds": 1.0,
          "remote_ratio": {"window_seconds": 1.0}, "topology_signature": "node0:2cpu node1:0cpu slit=10,21/21,10"}


@pytest.fixture
def run_module(capsys, monkeypatch):
    """main() with module args and the engine replaced; (exit code, parsed result)."""
    def _run(args, fake):
        monkeypatch.setattr(numa_cost, "run", fake)
        with patch_module_args(args), pytest.raises(SystemExit) as stop:
            numa_cost.main()
        return stop.value.code, json.loads(capsys.readouterr().out)
    return _run


def recording_run(calls, result=None, error=None):
    def fake(options, window_seconds, pids, unit, plan):
        calls.append({"options": vars(options), "window": window_seconds, "pids": pids, "unit": unit, "plan": plan})
        if error:
            raise error
        return dict(result or RESULT)
    return fake


def test_defaults_reach_the_engine_and_every_contract_key_returns_unchanged(run_module):
    calls = []
    code, out = run_module({}, recording_run(calls))
    assert code == 0
    assert calls == [{"options": {"buffer_mb": None, "small_kb": None, "chase_steps": 1000000, "repeats": 5,
                                  "max_seconds": 120.0, "rounds": 2},
                      "window": 1.0, "pids": None, "unit": None, "plan": None}]
    assert out["changed"] is False
    for key in ("nodes", "latency_ns", "bandwidth_gbps", "latency_ratio", "bandwidth_ratio", "distance_ratio",
                "unmeasured", "remote_ratio", "method"):
        assert out[key] == RESULT[key]


def test_check_mode_measures_and_changes_nothing(run_module):
    calls = []
    code, out = run_module({"_ansible_check_mode": True, "buffer_mb": 64, "pids": [12],
                                    "plan": {"mem_nodes": [0]}}, recording_run(calls))
    assert code == 0 and out["changed"] is False
    assert calls[0]["options"]["buffer_mb"] == 64
    assert calls[0]["pids"] == [12] and calls[0]["plan"] == {"mem_nodes": [0]}


def test_engine_error_becomes_fail_json_with_its_message(run_module):
    calls = []
    code, out = run_module({"unit": "gone.service"},
                           recording_run(calls, error=NumaError("unit gone.service has no running process: start it")))
    assert code == 1
    assert out["failed"] is True
    assert out["msg"] == "unit gone.service has no running process: start it"


def test_bad_option_value_fails_naming_it(run_module):
    code, out = run_module({"chase_steps": 0}, recording_run([]))
    assert code == 1 and "chase_steps=0" in out["msg"]


def test_pids_and_unit_are_mutually_exclusive(run_module):
    code, out = run_module({"pids": [1], "unit": "x.service"}, recording_run([]))
    assert code == 1 and "mutually exclusive" in out["msg"]


# --- every numeric option is range-checked before anything is measured ------------------------------------

@pytest.mark.parametrize("option, value, message", [
    ("max_seconds", float("nan"), "max_seconds=nan is not a number of seconds above 0 and at most 86400"),
    ("max_seconds", float("inf"), "max_seconds=inf is not a number of seconds"),
    ("max_seconds", 86401.0, "max_seconds=86401.0 is not a number of seconds"),
    ("rounds", 10 ** 18, "rounds=1000000000000000000 is not a whole number from 1 to 1000"),
    ("repeats", -1, "repeats=-1 is not a whole number from 1 to 1000"),
    ("chase_steps", 10 ** 10, "chase_steps=10000000000 is not a whole number from 1 to 1000000000"),
    ("buffer_mb", 0, "buffer_mb=0 is not a whole number from 1 to 1048576: give one like 64 or leave it unset"),
    ("small_kb", 1 << 30, "small_kb=1073741824 is not a whole number from 1 to 1048576"),
], ids=lambda value: str(value)[:20])
def test_module_refuses_each_numeric_option_out_of_range(run_module, option, value, message):
    calls = []
    code, out = run_module({option: value}, recording_run(calls))
    assert code == 1 and message in out["msg"] and calls == []


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.sampled_from(["chase_steps", "repeats", "rounds", "buffer_mb", "small_kb"]),
       st.one_of(st.integers(), st.floats(), st.booleans()))
def test_a_count_option_is_a_whole_number_within_its_bound(name, value):
    valid = type(value) is int and 0 < value <= cost.MAX_OPTIONS[name]
    try:
        cost.CostOptions(**{name: value})
    except NumaError as error:
        assert not valid and name in str(error) and "\n" not in str(error)
        return
    assert valid


@pytest.mark.parametrize("window, pids, message", [
    (float("nan"), None, "window_seconds=nan is not a number of seconds"),
    (0, None, "window_seconds=0 is not a number of seconds"),
    (7200, None, "window_seconds=7200 is not a number of seconds above 0 and at most 3600"),
    (1.0, [0], "PID 0 is not a process ID"),
    (1.0, [12, 12], "PID 12 is given twice"),
])
def test_window_and_pids_are_checked_before_the_host_is_read(monkeypatch, window, pids, message):
    monkeypatch.setattr(cost.topology, "read", lambda root: pytest.fail("read the host before checking"))
    with pytest.raises(NumaError, match=re.escape(message)):
        cost.run(cost.CostOptions(), window, pids)


def test_numa_pin_cost_refuses_a_bad_option_in_one_line(capsys):
    assert numa_pin.main(["cost", "--rounds", "0"]) == numa_pin.EXIT_BAD_REQUEST
    err = capsys.readouterr().err
    assert err == "numa-pin: cost option rounds=0 is not a whole number from 1 to 1000: give one like 2\n"
