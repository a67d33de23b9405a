"""The fleet report plans a service exactly as the inference_service role deploys it, inventory defaults
included: one ansible-playbook run plans the same services on one captured host with the role's own tasks
(tasks/entries.yml, then the planning tasks of tasks/service.yml) and with fleet_report.yml's own tasks (read
from the playbook); every instance's placement must agree."""

import json
import os
import subprocess
import sys

import yaml

from tests.fixtures import sysfs
from tests.tools import ansible_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVICE_TASKS = os.path.join(REPO, "roles", "inference_service", "tasks", "service.yml")
FLEET_REPORT = os.path.join(REPO, "playbooks", "fleet_report.yml")
# From the unit's name to the plan of each instance: the role's tasks that decide the placement.
PLANNING_TASKS = ("Name the service's unit", "Build the placement request of each instance",
                  "Check the layout fits this host", "Note the instance count and the request", "Plan each instance")
COMPARED = ("policy", "mem_nodes", "cpulist", "threads", "gpus", "port")

PLAYBOOK = """\
- name: Plan the services as the role deploys them and as the fleet report reports them
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
    - name: Merge the defaults as the role and fleet_report.yml do
      ansible.builtin.include_role:
        name: inferops.numa.inference_service
        tasks_from: entries
    - name: Plan every service with the role's own tasks
      ansible.builtin.include_tasks: service.yml
      loop: "{{ inference_service_entries }}"
      loop_control:
        loop_var: _inference_service_cfg
    - name: Plan them as fleet_report.yml does
      ansible.builtin.include_tasks: fleet_report_tasks.yml
    - name: Keep both
      ansible.builtin.copy:
        content: "{{ {'deployed': deployed, 'reported': fleet_report_result.planned} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""

DEFAULTS = {"layout": "per_node", "smt": False, "memory_headroom": "0", "reserve_cpus": "0", "port_base": 8000}
SERVICES = [
    {"name": "llama", "model_size": "1G"},
    {"name": "vllm", "layout": "per_gpu", "model_size": "2G", "smt": True},
    {"name": "big", "layout": "single", "policy": "interleave", "port_base": 9000},
]


def _role_planning_tasks():
    with open(SERVICE_TASKS) as handle:
        tasks = {task["name"]: task for task in yaml.safe_load(handle)}
    keep = {"name": "Keep what the role planned", "ansible.builtin.set_fact": {
        "deployed": "{{ deployed | default([]) + [{'service': _inference_service_cfg.name, "
                    "'plans': _inference_service_plans.results | map(attribute='plan') | list}] }}"}}
    return [tasks[name] for name in PLANNING_TASKS] + [keep]


def _fleet_report_host_tasks():
    """The tasks fleet_report.yml runs on each host, up to the one that reads the metrics and plans the services."""
    with open(FLEET_REPORT) as handle:
        tasks = yaml.safe_load(handle)[0]["tasks"]
    names = [task["name"] for task in tasks]
    return tasks[:names.index("Read the metrics and plan the services") + 1]


def test_the_fleet_report_plans_each_service_as_the_role_deploys_it_with_the_inventory_defaults(tmp_path):
    root = sysfs.dual_socket_gpus().write(str(tmp_path / "root"))
    (tmp_path / "service.yml").write_text(yaml.safe_dump(_role_planning_tasks()))
    (tmp_path / "fleet_report_tasks.yml").write_text(yaml.safe_dump(_fleet_report_host_tasks()))
    (tmp_path / "plan.yml").write_text(PLAYBOOK)
    (tmp_path / "plans").mkdir()
    out = tmp_path / "planned.json"
    variables = {"root": root, "numa_root": root, "out": str(out),
                 "inference_service_plan_dir": str(tmp_path / "plans"),
                 "inference_service_defaults": DEFAULTS, "inference_service_list": SERVICES}
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", str(tmp_path / "plan.yml"),
                           "-e", "@" + str(tmp_path / "vars.json"), "-e", "ansible_python_interpreter=" + sys.executable],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    assert done.returncode == 0 and out.exists(), done.stdout
    written = json.loads(out.read_text())
    deployed = [(outcome["service"], index, [plan[key] for key in COMPARED])
                for outcome in written["deployed"] for index, plan in enumerate(outcome["plans"])]
    reported = [(row["service"], row["index"], [row[key] for key in COMPARED]) for row in written["reported"]]
    assert reported == deployed
    # The defaults reached both: llama is per_node (two instances) without SMT siblings, ports from 8000.
    assert [(service, index, placement[5]) for service, index, placement in deployed] == [
        ("llama", 0, 8000), ("llama", 1, 8001), ("vllm", 0, 8000), ("vllm", 1, 8001), ("big", 0, 9000)]
    assert all(row["error"] is None for row in written["reported"])
