"""The inference_service role's own planning tasks, run by ansible-playbook on a captured host: one playbook
frame for the tests that hold the role's plans against numa-pin's (test_request_processes.py) and against the
fleet report's (test_report_plans_as_deployed.py)."""

import json
import os
import subprocess
import sys

import yaml

from tests.tools import ansible_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVICE_TASKS = os.path.join(REPO, "roles", "inference_service", "tasks", "service.yml")
# From the unit's name to the plan of each instance: the role's tasks that decide the placement.
PLANNING_TASKS = ("Name the service's unit", "Build the placement request of each instance",
                  "Check the layout fits this host", "Note the instance count and the request", "Plan each instance")

# Reads the captured host ``root``, runs ``tasks`` (a list of task mappings), then writes the variable ``kept``
# as JSON to ``out``.
PLAYBOOK_FRAME = """\
- name: Plan services on a captured host with the inference_service role's own tasks
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
%s
    - name: Keep what was planned
      ansible.builtin.copy:
        content: "{{ kept | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


def planning_tasks(keep_as: str) -> list:
    """The role's planning tasks for one ``_inference_service_cfg``, then one that appends
    ``{'service', 'request', 'plans'}`` to the list variable ``keep_as``."""
    with open(SERVICE_TASKS) as handle:
        tasks = {task["name"]: task for task in yaml.safe_load(handle)}
    keep = {"name": "Keep what the role planned", "ansible.builtin.set_fact": {
        keep_as: "{{ %s | default([]) + [{'service': _inference_service_cfg.name, "
                 "'request': _inference_service_request, "
                 "'plans': _inference_service_plans.results | map(attribute='plan') | list}] }}" % keep_as}}
    return [tasks[name] for name in PLANNING_TASKS] + [keep]


def run_playbook(work, tasks: list, files: dict, variables: dict) -> tuple:
    """Run PLAYBOOK_FRAME around ``tasks`` in ``work`` with ``files`` (name -> task list) written beside it;
    returns (what ``kept`` held, ansible-playbook's output). Fails the test when the run fails."""
    for name, content in files.items():
        (work / name).write_text(yaml.safe_dump(content))
    body = yaml.safe_dump(tasks, sort_keys=False)
    (work / "plan.yml").write_text(PLAYBOOK_FRAME % "\n".join("    " + line for line in body.splitlines()))
    out = work / "kept.json"
    (work / "vars.json").write_text(json.dumps(dict(variables, out=str(out))))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", str(work / "plan.yml"),
                           "-e", "@" + str(work / "vars.json"), "-e", "ansible_python_interpreter=" + sys.executable],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    assert done.returncode == 0 and out.exists(), done.stdout
    return json.loads(out.read_text()), done.stdout
