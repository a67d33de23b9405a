"""One request schema: request.py's table against everything that spells a placement request out.

numa-pin's flags, numa_plan's argument spec and a unit's ExecStart= flags are built
from the table, and are checked here through their own parsers. The role's
meta/argument_specs.yml, vars and tasks are text written for people: these tests fail when that text and the
table disagree (numa_plan's DOCUMENTATION is held to its argument spec by test_doc_fragments.py).
tests/integration/test_request_processes.py runs the role's planning tasks with
ansible-playbook and checks that numa_plan plans what numa-pin would plan from the
unit's flags.
"""

import json
import os
import re

import pytest
import yaml

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import request
from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs.service_entry import service_requests
from ansible_collections.inferops.numa.plugins.modules import numa_plan


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(REPO, "roles", "inference_service")
SPEC_KEYS = ("type", "elements", "choices", "default")

# A value for every option, each unlike its default; adding an option to the table means adding it here.
EVERY_OPTION = {"node": "1", "gpus": "2", "model_size": "14G", "model": "/srv/models/m.gguf",
                "memory_headroom": "5%+2G", "smt": False, "cores": "fast", "reserve_cpus": "0-1", "scope": "socket",
                "instances": 4,
                "instance": 3, "policy": "bind", "on_unfit": "fail", "page_cache": "replicate",
                "replica_dir": "/srv/replicas", "port_base": 8000, "anchors": "0,0,1,1", "engine": "vllm",
                "container_runtime": "docker"}

# The role works these out per layout and instance instead of reading them from a service entry (the runtime from
# the entry's container).
ROLE_COMPUTED = ("instances", "instance", "anchors", "container_runtime")


def _table_spec(option):
    return _typing({"type": option.kind, "elements": option.elements, "choices": option.choices,
                    "default": option.default})


def _role_spelling(option):
    """(name, spec) an inference_service_list entry gives the option: one model file; node ids may be YAML numbers.
    No default: the entry's null leaves the planner's, the same at deploy time and at start."""
    if option.name == "model":
        return "model", {"type": "str"}
    if option.name == "node":
        return "node", {"type": "raw"}
    spec = _table_spec(option)
    spec.pop("default", None)
    return option.name, spec


def _typing(spec):
    return {key: list(spec[key]) if key == "choices" else spec[key] for key in SPEC_KEYS if spec.get(key) is not None}


def _role_yaml(*parts):
    with open(os.path.join(ROLE, *parts)) as handle:
        return yaml.safe_load(handle)


def _service_task(name):
    return next(task for task in _role_yaml("tasks", "service.yml") if task["name"] == name)


def _role_request_names():
    return [_role_spelling(option)[0] for option in request.OPTIONS if option.name not in ROLE_COMPUTED]


# --- what is built from the table ---------------------------------------------------------------------

def test_every_option_has_a_sample_value():
    assert list(EVERY_OPTION) == [option.name for option in request.OPTIONS]


def test_numa_pin_defaults_are_the_tables():
    args, _ = numa_pin._parse(["explain"])
    assert {name: getattr(args, name) for name in request.BY_NAME} == request.DEFAULTS


@pytest.mark.parametrize("option", [option for option in request.OPTIONS if option.choices], ids=lambda o: o.name)
def test_numa_pin_takes_exactly_the_tables_choices(option):
    for choice in option.choices:
        assert getattr(numa_pin._parse(["explain", option.flag, choice])[0], option.name) == choice
    with pytest.raises(SystemExit):
        numa_pin._parse(["explain", option.flag, "nonsense"])


@pytest.mark.parametrize("smt", [False, True])
def test_unit_flags_read_back_by_numa_pin_exec_are_the_request(smt):
    wanted = dict(EVERY_OPTION, smt=smt)
    flags = unit_text.request_flags(wanted)
    args, server = numa_pin._parse(["exec"] + flags + ["--", "/usr/bin/server"])
    assert server == ["/usr/bin/server"]
    assert {name: getattr(args, name) for name in request.BY_NAME} == dict(wanted, model=[wanted["model"]])
    named = [flag for flag in flags if flag.startswith("--")]
    assert named == [option.negative_flag if wanted[option.name] is False else option.flag
                     for option in request.OPTIONS]


def test_numa_plan_argument_spec_is_the_tables_planning_part():
    spec = numa_plan.ARGUMENT_SPEC
    assert {name: spec[name] for name in spec if name in request.BY_NAME} == request.argument_spec()
    assert set(request.argument_spec()) == {option.name for option in request.OPTIONS
                                            if option.stage != request.START}
    for option in request.OPTIONS:
        expected = {} if option.stage == request.START else _table_spec(option)
        assert _typing(spec.get(option.name, {})) == expected, option.name


def test_request_takes_its_fields_defaults_and_choices_from_the_table():
    planner = [option for option in request.OPTIONS if option.stage == request.PLANNER]
    assert Request.FIELDS == tuple(option.name for option in planner)
    # An option added after plan records were first written is recorded only where a request sets it.
    assert list(Request().to_dict()) == [option.name for option in planner if option.recorded_default]
    every_set = Request(**{option.name: EVERY_OPTION[option.name] for option in planner
                           if option.name not in ("instance", "anchors")})
    assert list(every_set.to_dict()) == list(Request.FIELDS)
    for option in planner:
        if option.default is not None:
            assert getattr(Request(), option.name) == option.default, option.name
    for option in planner:
        for choice in option.choices or ():
            assert getattr(Request(**{option.name: choice}), option.name) == choice
        if option.choices:
            with pytest.raises(NumaError, match="choose one of %s" % ", ".join(option.choices)):
                Request(**{option.name: "nonsense"})


def test_numa_plan_args_keep_the_set_options_numa_plan_takes():
    args = request.module_args(dict(EVERY_OPTION, node=1, gpus=1, smt=None))
    assert set(args) == set(request.argument_spec()) - {"smt"}
    assert (args["node"], args["gpus"], args["instances"]) == ("1", 1, 4)  # numa_plan's node is a string
    assert args["model"] == [EVERY_OPTION["model"]]  # one path, even with a comma in it
    with pytest.raises(NumaError, match="unknown placement option"):
        request.module_args({"threads": 4})


def test_build_request_measures_the_model_when_no_size_is_given(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"\1" * 4096)
    assert request.build_request({"model": [str(model)]}).model_size == 4096
    assert request.build_request({"model_size": str(model), "node": "auto"}).model_size == 4096
    assert request.build_request({"model_size": "1K", "model": [str(model)]}).model_size == 1024
    assert request.build_request({"node": "auto"}).node is None


@pytest.mark.parametrize("model", [None, [], ""], ids=["unset", "empty list", "empty path"])
def test_replicate_without_a_model_is_refused_on_every_path(model):
    asked = {"page_cache": "replicate", "model": model}
    for path in (request.module_args, request.build_request):  # the role's numa_plan_args, numa-pin and numa_plan
        with pytest.raises(NumaError, match="page_cache replicate copies the model files .* no model is given: set "
                                            "model"):
            path(asked)


def test_replicate_with_a_model_and_other_page_cache_actions_without_one_pass():
    assert request.module_args({"page_cache": "replicate", "model": "/srv/m.gguf"})["model"] == ["/srv/m.gguf"]
    for action in ("evict", "warn", "ignore", None):
        assert request.build_request({"page_cache": action}).model_size is None


# --- what is written for people --------------------------------------------------------------------------

def test_role_argument_specs_spell_the_request_like_the_table():
    entry = _role_yaml("meta", "argument_specs.yml")["argument_specs"]["main"]["options"]["inference_service_list"]
    expected = dict(_role_spelling(option) for option in request.OPTIONS if option.name not in ROLE_COMPUTED)
    assert {name: _typing(entry["options"].get(name, {})) for name in expected} == expected
    # Every option is either an entry's, or one the role works out (an entry giving it is refused as unknown).
    assert [name for name in ROLE_COMPUTED if name in entry["options"]] == []


def test_role_builds_every_request_option_and_plans_with_every_numa_plan_option():
    built = _service_task("Build the placement request of each instance")["ansible.builtin.set_fact"]
    assert "inferops.numa.numa_service_requests(ansible_facts.numa)" in built["_inference_service_wanted"]
    # Every option but instance, which is the unit's %i and the loop item of the planning task.
    wanted = service_requests({"name": "s", "layout": "per_node"}, {"nodes": [{"id": 0, "has_cpus": True}]})
    assert set(wanted["request"]) == set(request.BY_NAME) - {"instance"}
    planned = _service_task("Plan each instance")["inferops.numa.numa_plan"]
    # container: the runtime, recorded (not planned with) so the audit finds a container's processes.
    assert set(planned) - {"record_file", "container"} == set(request.argument_spec())
    assert planned["container"] == "{{ _inference_service_request.container_runtime or omit }}"
    # Each option handed on under its own name (instance is the loop's item).
    assert [name for name, value in planned.items() if name not in ("instance", "record_file", "container")
            and value != "{{ _inference_service_plan_args.%s | default(omit) }}" % name] == []


def test_placement_docs_give_the_planners_defaults_and_choices():
    with open(os.path.join(REPO, "docs", "placement.md")) as handle:
        rows = re.findall(r"^\| (`\w+`(?:, `\w+`)*) \| ([^|]*) \| ([^|]*) \|$", handle.read(), re.MULTILINE)
    documented = {}
    for names, defaults, meaning in rows:
        names = re.findall(r"`(\w+)`", names)
        defaults = defaults.split(", ") if len(names) > 1 else [defaults]
        documented.update((name, (default, meaning)) for name, default in zip(names, defaults))
    planner = [option for option in request.OPTIONS if option.stage == request.PLANNER]
    assert set(documented) == {option.name for option in planner}
    for option in planner:
        default, meaning = documented[option.name]
        if option.default is not None:
            assert default == "`%s`" % json.dumps(option.default).strip('"'), option.name
        for choice in option.choices or ():
            assert "`%s`" % choice in default + meaning, (option.name, choice)


def test_the_systemd_numa_minimum_is_one_number():
    minimum = unit_text.SYSTEMD_NUMA_MIN_VERSION
    assert _role_yaml("vars", "main.yml")["inference_service_systemd_numa_min_version"] == minimum
    with open(os.path.join(ROLE, "tasks", "service.yml")) as handle:
        assert str(minimum) not in handle.read()
    for text_file in ("README.md", os.path.join("meta", "argument_specs.yml")):
        with open(os.path.join(ROLE, text_file)) as handle:
            assert "systemd >= %d" % minimum in handle.read(), text_file


# --- the role's planning tasks, run by Ansible --------------------------------------------------------------
