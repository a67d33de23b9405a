"""The inference_service role's planning tasks, run by ansible-playbook: each instance planned as numa-pin will plan it
from the unit's flags, with the argument specs' entry defaults."""

import json

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import request
from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.fixtures import sysfs
from tests.integration.role_planning import planning_tasks, run_playbook
from tests.unit.test_request import ROLE, _role_request_names, _role_yaml

TASKS = [
    {"name": "Plan every case", "ansible.builtin.include_tasks": "case.yml", "loop": "{{ cases }}",
     "loop_control": {"loop_var": "_case"}},
    {"name": "Note what the role asked and numa_plan answered, and the entry defaults the role read",
     "ansible.builtin.set_fact": {
         "kept": "{{ {'planned': planned, 'entry_defaults': [PROBE] | inferops.numa.numa_service_entries | first} }}"}},
]
# Each case resolved as tasks/main.yml resolves an entry, then the role's own planning tasks.
RESOLVE = {"name": "Resolve the entry", "ansible.builtin.set_fact": {
    "_inference_service_cfg": "{{ [_case] | inferops.numa.numa_service_entries | first }}"}}
# An entry of only the keys it must give: the merge gives it every other key's default.
PROBE = {"name": "probe", "command": ["/usr/bin/server"]}


@pytest.fixture(scope="module")
def role_plans(tmp_path_factory):
    """[(entry, the role's request, [numa_plan's plan per instance])] from one ansible-playbook run, the root, and
    PROBE with the role's entry defaults merged, as the role merges them."""
    work = tmp_path_factory.mktemp("role_plans")
    root = sysfs.dual_socket_gpus().write(str(work / "root"))
    model = work / "model.gguf"
    model.write_bytes(b"\1" * 3 * 1024 * 1024)
    cases = [
        {"name": "single", "model": str(model)},
        {"name": "nodes", "layout": "per_node", "policy": "bind", "smt": False, "reserve_cpus": "0",
         "memory_headroom": "0", "on_unfit": "fail", "port_base": 8080, "scope": "node", "model": str(model),
         "model_size": 5000000},
        {"name": "gpus", "layout": "per_gpu", "model_size": "1G"},
        {"name": "pinned", "node": 1, "gpus": "none", "page_cache": "replicate", "replica_dir": "/srv/replicas",
         "model": str(model)},
    ]
    cases = [dict(case, command=PROBE["command"]) for case in cases]
    variables = dict(_role_yaml("vars", "main.yml"), cases=cases, root=root, role_path=ROLE, PROBE=PROBE,
                     inference_service_defaults={}, inference_service_plan_dir=str(work / "plans"))
    written, output = run_playbook(work, TASKS, {"case.yml": [RESOLVE] + planning_tasks("planned")}, variables)
    assert "[WARNING]" not in output, output
    return ([(case, outcome["request"], outcome["plans"]) for case, outcome in zip(cases, written["planned"])], root,
            written["entry_defaults"])


def test_the_role_plans_each_instance_as_numa_pin_will_from_the_units_flags(role_plans):
    outcomes, root, _ = role_plans
    topology = read(root)
    for case, role_request, plans in outcomes:
        assert set(role_request) == set(request.BY_NAME) - {"instance"}, case["name"]
        assert len(plans) == role_request["instances"], case["name"]
        for instance, deployed in enumerate(plans):
            # What the unit's ExecStart= hands numa-pin exec for this instance.
            argv = ["exec", "--instance", str(instance)] + unit_text.request_flags(role_request) + ["--", "server"]
            args, _ = numa_pin._parse(argv)
            at_start = plan(topology, request.build_request(vars(args))).to_dict()
            assert deployed == json.loads(json.dumps(at_start)), (case["name"], instance)


def test_role_entries_get_the_argument_specs_defaults_and_leave_request_defaults_to_the_planner(role_plans):
    """The merge reads the entry defaults from meta/argument_specs.yml, the one place they are written."""
    spec = _role_yaml("meta", "argument_specs.yml")["argument_specs"]["main"]["options"]["inference_service_list"]
    written = {name: option.get("default") for name, option in spec["options"].items() if not option.get("required")}
    defaults = role_plans[2]
    assert defaults == dict(written, **PROBE)
    assert defaults["layout"] == "single" and defaults["min_local_percent"] == 99
    names = _role_request_names()
    assert {name: defaults.get(name, "missing") for name in names} == dict.fromkeys(names)
