"""The preflight: the roles' inputs checked against their argument specs (plugin_utils/preflight.py) and the host
checked read-only (module_utils/numa/read/preflight.py), each problem one line naming what, why and the fix."""
import errno
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.numa.plugins.filter.systemd_unit import FilterModule
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import gate
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import audit
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import kernel_files
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


def test_a_service_to_take_back_needs_its_name_alone():
    entries, problems = preflight.check_entries([{"name": "old", "state": "absent"}], {})
    assert problems == [] and entries[0]["state"] == "absent" and entries[0]["command"] is None
    assert preflight.check_entries([{"name": "old", "state": "gone"}], {})[1][0].startswith(
        "service old: state: 'gone' is not one of its choices")
    assert preflight.check_entries([{"state": "absent"}], {})[1][0].startswith(
        "inference_service_list[0]: name: missing")


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


# --- what fails later, refused before any change: names, URLs, the A/B gate, {port}, NaN, close variables --------

def _problems(**keys):
    """The problems of one entry: SERVICE with ``keys`` over it."""
    return preflight.check_entries([dict(SERVICE, **keys)], {})[1]


def _one_line(problem):
    return "\n" not in problem and all(" " <= char <= "~" for char in problem)


@pytest.mark.parametrize("name", ["a\nb", "x{{ y }}", "{{ name }}", "../etc", "..", "a/b", "llama@1", "ll\u00e1ma", "",
                                  "x" * 300, "a b", "a:b"])
def test_a_name_no_unit_can_carry_is_refused_as_the_unit_filter_refuses_it(name):

    problems = _problems(name=name)
    assert len(problems) == 1 and problems[0].startswith(
        "inference_service_list[0]: name: service name "), problems
    assert "cannot name a systemd template unit" in problems[0] and _one_line(problems[0])
    with pytest.raises(AnsibleFilterError):  # the role's own filter, later: the same verdict
        FilterModule().filters()["systemd_unit_prefix"](name)


def test_the_name_rule_is_the_unit_filters_own_function():

    assert preflight.UNIT_CHECKS["name"] is FilterModule().filters()["systemd_unit_prefix"].__wrapped__


@pytest.mark.parametrize("name", ["llama", "llama-3.1_8b", "x" * 200, "0"])
def test_a_name_the_units_carry_passes(name):
    assert _problems(name=name) == []


@pytest.mark.parametrize("url, cause", [
    ("htp://127.0.0.1:{port}/health", "is not an http or https URL with a host"),
    ("ftp://127.0.0.1:{port}/health", "is not an http or https URL with a host"),
    ("file:///etc/passwd", "is not an http or https URL with a host"),
    ("127.0.0.1:{port}/health", "is not an http or https URL with a host"),
    ("http:///health", "is not an http or https URL with a host"),
    ("http://:{port}/health", "is not an http or https URL with a host"),
    ("http://127.0.0.1:{port}/health now", "holds a space, a control or a non-ASCII character"),
    ("http://127.0.0.1:{port}/\thealth", "holds a space, a control or a non-ASCII character"),
    ("http://127.0.0.1:{port}/health\nHost: evil", "holds a space, a control or a non-ASCII character"),
    ("http://h\u00f6st:{port}/", "holds a space, a control or a non-ASCII character"),
    ("http://127.0.0.1:99999/health", "is not a URL (Port out of range"),
    ("http://127.0.0.1:port/health", "is not a URL ("),
    ("http://127.0.0.1:{port}/node/{node}", "uses {node}, which the probe does not fill in (only {port})"),
    ("http://127.0.0.1:0/health", "asks port 0, where no server listens; give the instance's port, {port}"),
])
def test_a_health_url_the_probe_cannot_ask_is_refused(url, cause):
    problems = _problems(health_url=url, port_base=8000)
    assert len(problems) == 1 and problems[0].startswith("service llama: health_url: '"), problems
    assert cause in problems[0] and _one_line(problems[0]), problems
    if "{node}" not in cause and "port 0" not in cause:
        assert problems[0].endswith("; give one like http://127.0.0.1:{port}/health") or problems[0].endswith(
            "; give the URL percent-encoded, like http://127.0.0.1:{port}/health"), problems


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}/ready", "https://gpu-7.example:8443/v1/health?deep=1",
                                 "http://[::1]:{port}/health"])
def test_an_http_url_with_a_host_passes(url):
    assert _problems(health_url=url, port_base=8000) == []


@pytest.mark.parametrize("values, problem", [
    ({"rounds": 0}, "rounds: 0 is not a number from 1 to 50; give one in that range"),
    ({"rounds": 10 ** 6}, "rounds: 1000000 is not a number from 1 to 50; give one in that range"),
    ({"max_tokens": 0}, "max_tokens: 0 is not a number from 1 to 4096; give one in that range"),
    ({"max_noise_percent": 0.1}, "max_noise_percent: 0.1 is not a number from 0.5 to 50; give one in that range"),
    ({"rounds": 20}, "max_rounds: 15 is fewer than rounds (20); give max_rounds of at least rounds"),
    ({"prompt": ""}, "prompt: give a text of 1 to 4096 characters"),
    ({"rouns": 3}, "rouns: no such key; did you mean rounds?"),
    ({"api": "grpc"}, "api: 'grpc' is not one of its choices; use one of: auto, llama.cpp, openai"),
    ({"rounds": "many"}, "rounds: argument 'rounds' is of type "),  # the validator's words vary by core
    ({"min_gain_percent": "nan"}, "min_gain_percent: nan is not a finite number; give a number"),
    ({"min_gain_percent": float("nan")}, "min_gain_percent: nan is not a finite number; give a number"),
    ({"min_gain_percent": float("inf")}, "min_gain_percent: inf is not a finite number; give a number"),
    ({"max_noise_percent": "-inf"}, "max_noise_percent: -inf is not a finite number; give a number"),
    ({"min_gain_percent": 2000}, "min_gain_percent: 2000.0 is not a number from -100 to 1000; give one in that range"),
])
def test_an_ab_gate_the_gate_would_refuse_after_the_restart_is_refused_before(values, problem):
    problems = _problems(ab_gate=values, port_base=8000)
    assert len(problems) == 1 and problems[0].startswith("service llama: ab_gate: " + problem), problems


def test_an_ab_gate_is_checked_against_the_gates_own_table():
    assert preflight.check_gate({"rounds": "7", "api": "openai", "min_gain_percent": None}) == (
        {"rounds": 7, "api": "openai", "min_gain_percent": None}, [])
    assert preflight.check_gate({"rouns": 3, "api": "grpc"})[1] == [
        "rouns: no such key; did you mean rounds?",
        "api: 'grpc' is not one of its choices; use one of: auto, llama.cpp, openai"]
    (entry,), problems = preflight.check_entries([dict(SERVICE, port_base=8000, ab_gate={"rounds": "3"})], {})
    assert problems == [] and entry["ab_gate"] == {"rounds": 3}


def test_an_ab_gate_of_the_wrong_type_is_named_once():
    (problem,) = _problems(ab_gate="fast", port_base=8000)
    assert problem.startswith("service llama: ab_gate: argument 'ab_gate' is of type ") and problem.endswith(
        "; give a mapping"), problem


def test_the_roles_spec_documents_the_gates_table():
    """meta/argument_specs.yml's ab_gate suboptions are text for people: the check is built from inputs/gate."""
    with open(os.path.join(preflight.COLLECTION, "roles", "inference_service", "meta", "argument_specs.yml")) as handle:
        documented = yaml.safe_load(handle)["argument_specs"]["main"]["options"]["inference_service_list"][
            "options"]["ab_gate"]["options"]
    table = gate.argument_spec()
    assert list(documented) == list(table)
    for name, spec in table.items():
        said = documented[name]
        assert (said["type"], said.get("default"), said.get("choices")) == (
            spec["type"], spec.get("default"), spec.get("choices")), name
        if name in gate.BOUNDS:
            assert "%g to %g" % gate.BOUNDS[name] in said["description"], name


def test_an_ab_gate_without_port_base_is_refused():
    assert _problems(ab_gate={"rounds": 3}) == [
        "service llama: ab_gate: needs port_base, the port the gate measures each instance at; set port_base, "
        "or remove ab_gate"]
    assert _problems(ab_gate={"rounds": 3}, port_base=8000) == []


@pytest.mark.parametrize("keys, line", [
    ({"command": ["/opt/llama/llama-server", "--port", "{port}"]},
     "service llama: command: argument '{port}' uses {port} but the plan has no port: set port_base on the service"),
    ({"command": ["/opt/llama/llama-server", "--listen=0.0.0.0:{port}"]},
     "service llama: command: argument '--listen=0.0.0.0:{port}' uses {port} but the plan has no port"),
    ({"health_url": "http://127.0.0.1:{port}/ready"},
     "service llama: health_url: argument 'http://127.0.0.1:{port}/ready' uses {port} but the plan has no port"),
])
def test_a_port_token_without_port_base_is_refused(keys, line):
    problems = _problems(**keys)
    assert len(problems) == 1 and problems[0].startswith(line), problems
    assert _problems(port_base=8000, **keys) == []


def test_the_other_tokens_need_no_port_base():
    assert _problems(command=["/opt/llama/llama-server", "-t", "{threads}", "--numa-node", "{node}", "{instance}",
                              "{cpulist}"]) == []


@pytest.mark.parametrize("value", ["nan", float("nan"), "inf", float("-inf"), "1e400"])
def test_a_min_local_percent_that_is_no_number_is_refused(value):
    assert _problems(min_local_percent=value) == [
        "service llama: min_local_percent: %s is not a finite number; give a value from 0 to 100"
        % float(value)]


def test_no_bound_lets_nan_or_an_infinity_through():
    spec = {"type": "float"}
    assert preflight.check_value("x", "nan", spec, (0, 100))[1] == "nan is not a finite number; give a value from 0 to 100"
    assert preflight.check_value("x", "inf", spec, (0, None))[1] == "inf is not a finite number; give 0 or more"
    assert preflight.check_value("x", "nan", spec)[1] == "nan is not a finite number; give a number"
    assert preflight.check_value("x", "99.5", spec, (0, 100)) == (99.5, None)
    _, problems = preflight.check_settings({"inference_service_audit_settle_seconds": "nan"})
    assert problems == ["inference_service_audit_settle_seconds: nan is not a finite number; give a value from 0 to "
                        "86400"]


def test_a_number_the_validator_cannot_take_is_a_problem_not_a_traceback():
    assert _problems(port_base=10 ** 5000) == [
        "service llama: port_base: (a 16610-bit number) is out of range; give a value from 1 to 65535"]
    # ansible-core 2.19+ raises OverflowError making an int of an infinity, 2.14 says so in an error: one line either way.
    (problem,) = _problems(port_base=float("inf"))
    assert problem.startswith("service llama: port_base: ") and problem.endswith("; give a whole number"), problem


def test_a_key_that_is_no_name_is_quoted_and_the_entry_still_checked():
    problems = preflight.check_entries([{**SERVICE, 7: "x", "bad\nkey": 1}], {})[1]
    assert problems == ["service llama: 7: no such key; valid keys: " + ", ".join(
        sorted(preflight.role_options("inference_service")[preflight.ENTRIES]["options"])), problems[1]]
    assert problems[1].startswith("service llama: 'bad\\nkey': no such key; ") and _one_line(problems[1])


OWN = frozenset(["inference_service_list", "numa_host_balancing", "inference_service_entries"])


def test_a_play_variable_very_close_to_an_option_is_named_with_it():
    names = ["inference_services_list", "numa_hots_balancing", "inferenceservice_list", "inference_service_list",
             "ansible_host", "ansible_inference_service_list", "_inference_service_lis", "groups", "hostvars",
             "numa_serial", "numa_preflight", "inference_service_lst", "my_inference_list", "inference_services"]
    assert preflight.close_variables(names, OWN) == [
        "inference_services: no such variable; did you mean inference_service_list?",
        "inference_services_list: no such variable; did you mean inference_service_list?",
        "inferenceservice_list: no such variable; did you mean inference_service_list?",
        "numa_hots_balancing: no such variable; did you mean numa_host_balancing?"]


def test_a_close_variable_is_named_by_the_action_among_the_plays_variables():
    """The action reads only the names of task_vars: every variable of the play, the roles' own left out."""
    own = preflight.role_own_vars()
    assert {"inference_service_list", "inference_service_entries", "numa_host_helper_path"} <= own
    assert preflight.close_variables(list(own), own) == []


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
    assert host.host_findings(root, [dict(SERVICE, layout="per_node")], "disabled")[0] == []


def _gpu_host(tmp_path, nic=True):
    """dual_socket_gpus with a third GPU, on node 0, where no NIC is (the host's NIC is on node 1); ``nic``:
    without it, the host has no NIC at all."""
    machine = sysfs.dual_socket_gpus()
    machine.add_pci("0000:18:00.0", 0x030200, 0x10de, 0x2330, 0, list(range(0, 40)) + list(range(80, 120)))
    if not nic:
        machine.files = {rel: text for rel, text in machine.files.items() if "0000:41:00.0" not in rel}
    return _host(tmp_path, machine)


def test_a_gpu_with_no_nic_on_its_node_is_a_warning_not_a_problem(tmp_path):
    root = _gpu_host(tmp_path)
    assert host.host_findings(root, [dict(SERVICE, layout="per_gpu", gpus=1, engine="vllm")]) == ([], [
        "service llama: llama@0.service: GPU(s) 0000:18:00.0 have no NIC on their node: their traffic to other "
        "hosts (NCCL, UCX) crosses the socket link; give the instance GPUs on a node with a NIC, or put one there"])


@pytest.mark.parametrize("nic, entry", [
    (False, dict(SERVICE, layout="per_gpu", gpus=1, engine="vllm")),  # no NIC on the host
    (True, dict(SERVICE, engine="vllm")),  # no GPU asked for
    (True, dict(SERVICE, layout="per_gpu", gpus=1)),  # an engine that talks to no other host (told no NIC)
])
def test_no_nic_warning_without_nics_on_the_host_gpus_in_the_request_or_an_engine_that_uses_them(tmp_path, nic,
                                                                                                 entry):
    assert host.host_findings(_gpu_host(tmp_path, nic), [entry]) == ([], [])


def test_a_host_without_systemd_a_server_or_a_fit_is_told_each(tmp_path):
    root = _host(tmp_path, pid1="bash", server=False)
    problems = host.host_findings(root, [dict(SERVICE, layout="single", model_size="4T")])[0]
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
    problems = host.host_findings(root, [SERVICE])[0]
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
    assert host.host_findings(root, [], "disabled")[0] == []
    monkeypatch.setattr(host.os, "access", lambda path, mode: path != knob)
    assert host.host_findings(root, [], "keep")[0] == []
    assert host.host_findings(root, [], "disabled")[0][0].startswith(
        "numa_host_balancing: /proc/sys/kernel/numa_balancing is read-only here")


def _status(tmp_path, cap_eff):
    self_dir = tmp_path / "proc" / "self"
    self_dir.mkdir(parents=True, exist_ok=True)
    (self_dir / "status").write_text("Name:\tpython3\nCapInh:\t0000000000000000\nCapEff:\t%s\n" % cap_eff)


FULL_CAPS = "000001ffffffffff"
NO_PTRACE = "%016x" % (0x000001ffffffffff & ~(1 << 19))
# Docker's default set: chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service net_raw
# sys_chroot mknod audit_write setfcap.
DOCKER_DEFAULT = "00000000a80425fb"


@pytest.mark.parametrize("cap_eff", [NO_PTRACE, DOCKER_DEFAULT])
def test_root_without_cap_sys_ptrace_is_told_before_a_service_of_another_user_audits(tmp_path, cap_eff):
    root = _host(tmp_path)
    _status(tmp_path, cap_eff)
    services = [dict(SERVICE), dict(SERVICE, name="vllm", user="svc-vllm"), dict(SERVICE, name="quiet", audit=False),
                dict(SERVICE, name="mine", user="root")]
    assert host.audit_problems(root, services, euid=0) == [
        "service llama: audit: root here lacks CAP_SYS_PTRACE, so it cannot read /proc/<pid>/numa_maps of the "
        "service's user llama (a container's default capabilities); grant CAP_SYS_PTRACE to the run, or set "
        "audit: false",
        "service vllm: audit: root here lacks CAP_SYS_PTRACE, so it cannot read /proc/<pid>/numa_maps of the "
        "service's user svc-vllm (a container's default capabilities); grant CAP_SYS_PTRACE to the run, or set "
        "audit: false"]


def test_the_capability_check_is_part_of_the_hosts_problems(tmp_path, monkeypatch):
    root = _host(tmp_path, slice_cpus=("0-159", "0-1"))
    _status(tmp_path, NO_PTRACE)
    monkeypatch.setattr(host.os, "geteuid", lambda: 0)
    problems = host.host_findings(root, [SERVICE])[0]
    assert len(problems) == 1 and problems[0].startswith("service llama: audit: root here lacks CAP_SYS_PTRACE")
    _status(tmp_path, FULL_CAPS)
    assert host.host_findings(root, [SERVICE])[0] == []


@pytest.mark.parametrize("cap_eff, euid, services", [
    (FULL_CAPS, 0, [SERVICE]),                               # the capability is there
    (NO_PTRACE, 1000, [SERVICE]),                            # not root: the audit runs as whoever may read
    (NO_PTRACE, 0, [dict(SERVICE, audit=False)]),            # no audit
    (NO_PTRACE, 0, [dict(SERVICE, user="root")]),            # root reads its own processes' pages
    (NO_PTRACE, 0, [dict(SERVICE, user="0")]),
    ("not hex", 0, [SERVICE]),                                # a status that says nothing: nothing to claim
])
def test_no_capability_problem_where_the_audit_can_read(tmp_path, cap_eff, euid, services):
    root = _host(tmp_path)
    _status(tmp_path, cap_eff)
    assert host.audit_problems(root, services, euid=euid) == []


def test_no_capability_problem_without_a_status_to_read(tmp_path):
    assert host.audit_problems(_host(tmp_path), [SERVICE], euid=0) == []


def _process(tmp_path, pid=4242):
    proc = tmp_path / "proc" / str(pid)
    proc.mkdir(parents=True)
    (proc / "status").write_text("Name:\tllama-server\nCpus_allowed_list:\t0-3\nMems_allowed_list:\t0\n")
    (proc / "stat").write_text("%d (llama-server) S 1 0 0\n" % pid)
    (proc / "numa_maps").write_text("")
    (proc / "maps").write_text("")
    return str(tmp_path), pid


def _refuse(monkeypatch, name):
    """The kernel's answer to root without CAP_SYS_PTRACE: EACCES opening another user's ``name``."""
    opened = kernel_files.Root._open_file

    def refusing(self, rel):
        if rel.endswith("/" + name):
            raise PermissionError(13, "Permission denied")
        return opened(self, rel)

    monkeypatch.setattr(kernel_files.Root, "_open_file", refusing)


@pytest.mark.parametrize("name", ["numa_maps", "maps"])
def test_the_audit_names_the_missing_capability_when_root_is_refused(tmp_path, monkeypatch, name):
    root, pid = _process(tmp_path)
    _refuse(monkeypatch, name)
    monkeypatch.setattr(audit.os, "geteuid", lambda: 0)
    with pytest.raises(NumaError) as refused:
        audit.read_process(root, pid, 4096)
    message = str(refused.value)
    assert message.startswith("cannot read %s/proc/%d/%s: permission denied to root, which lacks CAP_SYS_PTRACE"
                              % (root, pid, name)), message
    assert "grant CAP_SYS_PTRACE to the run" in message and "run as root" not in message


def test_the_audit_still_tells_another_user_to_run_as_root(tmp_path, monkeypatch):
    root, pid = _process(tmp_path)
    _refuse(monkeypatch, "numa_maps")
    monkeypatch.setattr(audit.os, "geteuid", lambda: 1000)
    with pytest.raises(NumaError, match="permission denied; run as root"):
        audit.read_process(root, pid, 4096)


def test_a_readable_process_is_read(tmp_path):
    root, pid = _process(tmp_path)
    assert audit.read_process(root, pid, 4096)["name"] == "llama-server"


# --- exact bounds and refusals (tests/mutants.py) ----------------------------------------------------------------

@pytest.mark.parametrize("key, edges, outside", [("port_base", (1, 65535), (0, 65536)),
                                                 ("min_local_percent", (0, 100), (-0.01, 100.01))])
def test_a_value_exactly_at_a_bound_passes_and_one_step_past_it_is_refused(key, edges, outside):
    for value in edges:
        merged, problems = preflight.check_entries([dict(SERVICE, **{key: value})], {})
        assert problems == [] and merged[0][key] == value
    for value in outside:
        assert preflight.check_entries([dict(SERVICE, **{key: value})], {})[1] == [
            "service llama: %s: %s is out of range; give a value from %s to %s" % (key, value, edges[0], edges[1])]


def test_a_bound_without_an_upper_end_takes_its_lower_end():
    spec = {"type": "int"}
    assert preflight.check_value("inference_service_restart_batch", 1, spec, (1, None)) == (1, None)
    assert preflight.check_value("inference_service_restart_batch", 0, spec, (1, None)) == (
        0, "0 is out of range; give 1 or more")


@pytest.mark.parametrize("pid1, booted", [("bash", True), ("systemd", False), ("init", False)])
def test_systemd_must_be_pid_1_and_booted_both(tmp_path, pid1, booted):
    root = _host(tmp_path, pid1=pid1)
    marker = tmp_path / "run" / "systemd" / "system"  # the directory systemd makes when it booted the host
    if booted:
        marker.mkdir(parents=True, exist_ok=True)
    elif marker.exists():
        marker.rmdir()
    (problem,) = host.systemd_problems(root)
    assert problem.startswith("systemd: PID 1 here is %s, not systemd; " % pid1)


@pytest.mark.parametrize("refusal, told", [(errno.EPERM, True), (errno.ENOSYS, True), (errno.EACCES, True),
                                           (errno.EINVAL, False), (None, False)])
def test_set_mempolicy_refused_by_the_host_is_told_and_any_other_answer_is_not(monkeypatch, refusal, told):
    from ansible_collections.inferops.numa.plugins.module_utils.numa.system import kernel

    calls = []

    def set_mempolicy(policy, nodes):
        calls.append((policy, list(nodes)))
        if refusal is not None:
            raise kernel.KernelCallError("set_mempolicy", refusal, "refused")
    monkeypatch.setattr(kernel, "set_mempolicy", set_mempolicy)
    problems = host.mempolicy_problems()
    assert calls == [("default", [])]  # the process's own policy, set back to the default: nothing changes
    assert problems == ([] if not told else [
        "memory policy: set_mempolicy is refused here (%s): numa-pin could not bind memory; allow the syscall (the "
        "container's seccomp profile) or run on the host" % errno.errorcode[refusal]])
