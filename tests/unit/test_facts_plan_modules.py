"""numa_facts and numa_plan as Ansible runs them: main() in-process with module args, and ad hoc."""

import json
import os

import pytest

from ansible_collections.inferops.numa.plugins.modules import numa_facts, numa_plan

from tests.ansible_compat import patch_module_args
from tests.fixtures import sysfs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def run(capsys):
    def _run(module, args, check=False):
        with patch_module_args(dict(args, _ansible_check_mode=check)), pytest.raises(SystemExit) as stop:
            module.main()
        return stop.value.code, json.loads(capsys.readouterr().out)
    return _run


def test_numa_facts_returns_the_contract_and_changes_nothing(tmp_path, run):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    code, out = run(numa_facts, {"root": root}, check=True)
    assert code == 0 and out["changed"] is False
    numa = out["ansible_facts"]["numa"]
    assert numa["schema_version"] == 1 and numa["node_count"] == 2
    assert [gpu["address"] for gpu in numa["gpus"]] == ["0000:81:00.0", "0000:c1:00.0"]


def test_numa_facts_root_not_a_directory_fails_cleanly(tmp_path, run):
    code, out = run(numa_facts, {"root": str(tmp_path / "nope")})
    assert code == 1 and out["failed"] and "not a directory" in out["msg"]


def test_numa_plan_per_node_instances_on_a_captured_box(tmp_path, run):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    plans = [run(numa_plan, {"root": root, "instances": 2, "instance": i, "gpus": "none", "port_base": 8080,
                             "model_size": "14G"})[1]["plan"] for i in (0, 1)]
    assert [(p["node"], p["port"], p["policy"], p["threads"]) for p in plans] == [(0, 8080, "bind", 80),
                                                                                  (1, 8081, "bind", 80)]


def test_numa_plan_impossible_request_fails_with_sizes(tmp_path, run):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    code, out = run(numa_plan, {"root": root, "model_size": "3T", "on_unfit": "fail"})
    assert code == 1 and "TiB" in out["msg"]


@pytest.mark.parametrize("args, message", [
    ({"instances": 100000000}, "instances must be at most 8192, got 100000000"),
    ({"instances": 161}, "instances=161 but this host has 160 usable CPU(s)"),
    ({"instances": 2, "reserve_cpus": "1-159"}, "instances=2 but this host has 1 usable CPU(s)"),
    ({"gpus": ",,,"}, "gpus entry 1 of 4 is empty"),
    ({"gpus": ["81:00.0", "0000:81:00.0"]}, "gpus names GPU 0000:81:00.0 twice"),
    ({"model_size": "9" * 5000}, "has more than 40 digits"),
    ({"memory_headroom": "nan"}, "term 'nan' is neither a percentage nor a size"),
    ({"port_base": 65536}, "port_base must be at most 65535"),
    ({"instances": 2, "anchors": "0,9"}, "anchors name node(s) 9, which this host does not have"),
], ids=["hundred million", "past usable cpus", "past unreserved cpus", "commas", "gpu twice", "5000 digits",
        "headroom nan", "port", "anchor"])
def test_numa_plan_refuses_what_numa_pin_refuses_with_the_same_message(tmp_path, run, args, message):
    root = sysfs.dual_socket_gpus().write(str(tmp_path))
    code, out = run(numa_plan, dict(args, root=root, instance=0))
    assert code == 1 and out["failed"] and message in out["msg"] and "\n" not in out["msg"]


# --- ad hoc, as a user runs them (tests/matrix.py runs this on the oldest and the newest core) -------------------
