"""The inference_service role's planning tasks, run by ansible-playbook: each instance planned as numa-pin will plan it
from the unit's flags, with the argument specs' entry defaults."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import request
from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.fixtures import sysfs
from tests.tools import ansible_command
from tests.unit.test_request import REPO, ROLE, _role_request_names, _role_yaml, _service_task


PLANNING_TASKS = ("Build the placement request of each instance", "Check the layout fits this host",
                  "Note the instance count and the request", "Plan each instance")


PLAN_PLAYBOOK = """\
- name: Plan each case as the inference_service role does
  hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    inferops.numa.numa_plan:
      root: "{{ root }}"
  tasks:
    - name: Read the captured host
      inferops.numa.numa_facts:
        root: "{{ root }}"
    - name: Plan every case
      ansible.builtin.include_tasks: case.yml
      loop: "{{ cases }}"
      loop_control:
        loop_var: _case
    - name: Keep what the role asked and numa_plan answered, and the entry defaults the role read
      ansible.builtin.copy:
        content: "{{ {'planned': planned, 'entry_defaults': inference_service_entry_defaults} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


def _case_tasks():
    """The role's own planning tasks between a set_fact that resolves the entry and one that keeps the outcome."""
    resolve = {"name": "Resolve the entry", "ansible.builtin.set_fact": {
        "_inference_service_cfg": "{{ inference_service_entry_defaults | combine(_case) }}",
        "_inference_service_unit": "{{ _case.name }}"}}
    keep = {"name": "Keep the outcome", "ansible.builtin.set_fact": {
        "planned": "{{ planned | default([]) + [{'request': _inference_service_request, "
                   "'plans': _inference_service_plans.results | map(attribute='plan') | list}] }}"}}
    return [resolve] + [_service_task(name) for name in PLANNING_TASKS] + [keep]


@pytest.fixture(scope="module")
def role_plans(tmp_path_factory):
    """[(entry, the role's request, [numa_plan's plan per instance])] from one ansible-playbook run, the root, and
    the role's entry defaults (vars/main.yml) as Ansible evaluated them."""
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
    (work / "case.yml").write_text(yaml.safe_dump(_case_tasks()))
    (work / "plan.yml").write_text(PLAN_PLAYBOOK)
    out = work / "planned.json"
    variables = dict(_role_yaml("vars", "main.yml"), cases=cases, root=root, out=str(out), role_path=ROLE,
                     inference_service_defaults={}, inference_service_plan_dir=str(work / "plans"))
    (work / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", str(work / "plan.yml"),
                           "-e", "@" + str(work / "vars.json"), "-e", "ansible_python_interpreter=" + sys.executable],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    assert done.returncode == 0 and out.exists(), done.stdout
    assert "[WARNING]" not in done.stdout, done.stdout
    written = json.loads(out.read_text())
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
    """vars/main.yml reads the entry defaults from meta/argument_specs.yml, the one place they are written."""
    spec = _role_yaml("meta", "argument_specs.yml")["argument_specs"]["main"]["options"]["inference_service_list"]
    written = {name: option.get("default") for name, option in spec["options"].items() if not option.get("required")}
    defaults = role_plans[2]
    assert defaults == written
    assert defaults["layout"] == "single" and defaults["min_local_percent"] == 99
    names = _role_request_names()
    assert {name: defaults.get(name, "missing") for name in names} == dict.fromkeys(names)
