"""The preflight: the roles' inputs checked against their argument specs (plugin_utils/preflight.py) and the host
checked read-only (module_utils/numa/read/preflight.py), each problem one line naming what, why and the fix."""
import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.read import preflight as host
from ansible_collections.inferops.numa.plugins.plugin_utils import preflight
from tests.fixtures import sysfs

SERVICE = {"name": "llama", "command": ["/opt/llama/llama-server", "-t", "{threads}"], "layout": "per_node",
           "model_size": "4G"}


# --- the controller: variables and entries against the roles' specs --------------------------------------

@pytest.mark.parametrize("given, wanted", [("false", False), ("no", False), ("True", True), (0, False)])
def test_a_boolean_given_as_text_comes_back_a_boolean(given, wanted):
    settings, problems = preflight.check_settings({"numa_host_metrics": given})
    assert problems == [] and settings["numa_host_metrics"] is wanted


def test_a_number_given_as_text_comes_back_a_number_and_unset_ones_take_the_spec_default():
    settings, problems = preflight.check_settings({"numa_host_metrics_period_seconds": "120"})
    assert problems == [] and settings["numa_host_metrics_period_seconds"] == 120
    assert settings["numa_host_balancing"] == "auto" and settings["inference_service_list"] == []


def test_a_templated_default_is_left_to_the_role_to_render():
    settings, _ = preflight.check_settings({})
    assert "numa_host_helper_source" not in settings


def test_every_bad_variable_is_named_at_once_with_its_fix():
    _, problems = preflight.check_settings({"numa_host_metrics_period_seconds": 5, "numa_host_metrics": "maybe",
                                            "numa_host_balancing": "off"}, unknown=["numa_host_metricz"])
    assert problems == [
        "numa_host_balancing: 'off' is not one of its choices; use one of: auto, disabled, enabled, tiering, keep",
        problems[1],
        "numa_host_metrics_period_seconds: 5 is out of range; give a value from 10 to 86400",
        "numa_host_metricz: no such key; did you mean numa_host_metrics?",
    ]
    assert problems[1].startswith("numa_host_metrics: ") and problems[1].endswith("; give true or false")


def test_a_variable_the_roles_have_is_not_unknown():
    assert preflight.check_settings({}, unknown=["numa_host_metrics"])[1] == []


def test_entries_come_back_merged_and_converted():
    entries, problems = preflight.check_entries([dict(SERVICE, audit="false", port_base="8080")],
                                                {"min_local_percent": "95"})
    assert problems == []
    (entry,) = entries
    assert entry["audit"] is False and entry["port_base"] == 8080 and entry["min_local_percent"] == 95.0
    assert entry["pin_mode"] == "wrapper" and entry["gpus"] is None


class _Lazy(dict):
    """A mapping like ansible-core 2.19+'s lazy containers: its deep copy drags state the validator must not copy."""

    def __deepcopy__(self, memo):
        raise AssertionError("the validator deep-copied the caller's container")


class _TaggedText(str):
    pass


def test_entries_given_as_lazy_containers_are_checked_as_plain_data():
    entries, problems = preflight.check_entries([_Lazy(SERVICE, environment=_Lazy(MODE=_TaggedText("fast")))], {})
    assert problems == []
    assert entries[0]["environment"] == {"MODE": "fast"} and type(entries[0]["environment"]["MODE"]) is str


def test_the_role_and_the_fleet_report_merge_with_the_preflights_own_check():
    """Their filter, numa_service_entries: the preflight's merge, and one error naming every problem."""
    from ansible.errors import AnsibleFilterError
    from ansible_collections.inferops.numa.plugins.filter.systemd_unit import FilterModule

    merge = FilterModule().filters()["numa_service_entries"]
    assert merge([dict(SERVICE, port_base="8080")], {"smt": "false"}) == preflight.check_entries(
        [dict(SERVICE, port_base="8080")], {"smt": "false"})[0]
    assert merge([SERVICE])[0]["layout"] == "per_node" and merge([SERVICE])[0]["pin_mode"] == "wrapper"
    with pytest.raises(AnsibleFilterError) as refused:
        merge([dict(SERVICE, page_cahce="evict"), {"name": "b"}], {})
    assert str(refused.value).startswith("2 problem(s) in the services: service llama: page_cahce: no such key; "
                                         "did you mean page_cache?; service b: command: missing")


def test_a_typo_in_an_entry_or_the_defaults_is_named_with_the_closest_key():
    entries, problems = preflight.check_entries([dict(SERVICE, page_cahce="evict")], {"min_local_percnt": 90})
    assert entries == []
    assert problems == ["inference_service_defaults: min_local_percnt: no such key; did you mean min_local_percent?",
                        "service llama: page_cahce: no such key; did you mean page_cache?"]


def test_a_bad_layout_a_missing_command_and_a_repeated_name_are_each_one_line():
    _, problems = preflight.check_entries([dict(SERVICE, layout="per-node"), {"name": "llama"},
                                           dict(SERVICE, name="b"), dict(SERVICE, name="b")], {})
    assert problems[0] == ("service llama: layout: 'per-node' is not one of its choices; "
                           "use one of: single, per_node, per_socket, per_gpu, gpu_groups")
    assert problems[1].startswith("service llama: command: missing; ")
    assert problems[2] == "service b: name: given to 2 entries; give each service its own name"
    assert len(problems) == 3


def test_an_out_of_range_port_and_a_non_list_are_refused():
    assert preflight.check_entries([dict(SERVICE, port_base=70000)], {})[1] == [
        "service llama: port_base: 70000 is out of range; give a value from 1 to 65535"]
    assert preflight.check_entries("llama", {})[1] == [
        "inference_service_list: is str, not a list; give a list of service entries"]
    assert preflight.check_entries(["llama"], {})[1] == [
        "inference_service_list[0]: is str, not a mapping; give name, command and the service's keys"]


@pytest.mark.parametrize("key, value, problem", [
    ("environment", {"INFEROPS_NUMA_AB_BASELINE": "unbound"}, "environment variable INFEROPS_NUMA_AB_BASELINE is "
                                                              "numa-pin's own"),
    ("environment", {"A": "x\ny"}, "environment variable A 'x\\ny' contains a newline"),
    ("user", "a:b", "no user or group name systemd accepts"),
    ("read_write_paths", ["relative/dir"], "read_write_paths entry 'relative/dir' must be an absolute path"),
    ("extra_settings", {"Bad Name": "1"}, "is not a systemd setting name"),
])
def test_a_value_the_unit_cannot_hold_is_named_before_any_change(key, value, problem):
    _, problems = preflight.check_entries([dict(SERVICE, **{key: value})], {})
    assert len(problems) == 1 and problems[0].startswith("service llama: %s: " % key), problems
    assert problem in problems[0]


# --- the host: read-only checks under a root ---------------------------------------------------------------

def _host(tmp_path, machine=None, pid1="systemd", server=True, slice_cpus=None):
    root = (machine or sysfs.dual_socket_gpus()).write(str(tmp_path))
    (tmp_path / "proc" / "1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "1" / "comm").write_text(pid1 + "\n")
    if pid1 == "systemd":
        (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    if server:
        binary = tmp_path / "opt" / "llama" / "llama-server"
        binary.parent.mkdir(parents=True)
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    if slice_cpus is not None:
        cgroup = tmp_path / "sys" / "fs" / "cgroup" / "system.slice"
        cgroup.mkdir(parents=True)
        (cgroup / "cpuset.cpus.effective").write_text(slice_cpus[0] + "\n")
        (cgroup / "cpuset.mems.effective").write_text(slice_cpus[1] + "\n")
    return root


def test_a_host_that_offers_what_the_services_need_has_no_problem(tmp_path):
    root = _host(tmp_path, slice_cpus=("0-159", "0-1"))
    assert host.host_problems(root, [dict(SERVICE, layout="per_node")], "disabled") == []


def test_a_host_without_systemd_a_server_or_a_fit_is_told_each(tmp_path):
    root = _host(tmp_path, pid1="bash", server=False)
    problems = host.host_problems(root, [dict(SERVICE, layout="single", model_size="4T")])
    assert problems[0].startswith("systemd: PID 1 here is bash, not systemd; ")
    assert problems[1] == ("service llama: command: /opt/llama/llama-server is not an executable file here; "
                           "install the server first, or give command[0] the path of its binary")
    assert problems[2].startswith("service llama: llama@0.service: model 4 TiB") and len(problems) == 3


def test_a_command_without_a_slash_is_searched_where_systemd_searches(tmp_path):
    root = _host(tmp_path)
    assert host.command_problems(root, ["vllm"]) == [
        "command: vllm is in none of %s; install the server first, or give command[0] the path of its binary"
        % ":".join(host.SYSTEMD_PATH)]
    binary = tmp_path / "usr" / "bin" / "vllm"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    assert host.command_problems(root, ["vllm"]) != [], "not executable yet"
    binary.chmod(0o755)
    assert host.command_problems(root, ["vllm"]) == []


def test_a_plan_outside_the_slice_cpuset_is_named_with_the_fix(tmp_path):
    root = _host(tmp_path, slice_cpus=("0-39,80-119", "0"))
    problems = host.host_problems(root, [SERVICE])
    assert problems == [
        "service llama: llama@1.service: CPUs 40-79,120-159 of its plan are outside system.slice's cpuset "
        "(0-39,80-119, /sys/fs/cgroup/system.slice/cpuset.cpus.effective); widen the slice's AllowedCPUs= or "
        "reserve those CPUs (reserve_cpus)",
        "service llama: llama@1.service: memory nodes 1 of its plan are outside system.slice's cpuset (0, "
        "/sys/fs/cgroup/system.slice/cpuset.mems.effective); widen the slice's AllowedMemoryNodes= or pin "
        "another node"]


def test_a_read_only_balancing_knob_is_a_problem_only_when_it_is_to_be_set(tmp_path, monkeypatch):
    root = _host(tmp_path)
    knob = os.path.join(root, host.BALANCING_KNOB)
    assert host.host_problems(root, [], "disabled") == []
    monkeypatch.setattr(host.os, "access", lambda path, mode: path != knob)
    assert host.host_problems(root, [], "keep") == []
    assert host.host_problems(root, [], "disabled")[0].startswith(
        "numa_host_balancing: /proc/sys/kernel/numa_balancing is read-only here")
