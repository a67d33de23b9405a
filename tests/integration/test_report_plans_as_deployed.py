"""The fleet report plans a service exactly as the inference_service role deploys it, inventory defaults
included: one ansible-playbook run plans the same services on one captured host with the role's own tasks
(the merge of tasks/main.yml, then the planning tasks of tasks/service.yml) and with fleet_report.yml's own tasks (read
from the playbook); every instance's placement must agree."""

import os

import yaml

from tests.fixtures import sysfs
from tests.integration.role_planning import REPO, planning_tasks, run_playbook

FLEET_REPORT = os.path.join(REPO, "playbooks", "fleet_report.yml")
COMPARED = ("policy", "mem_nodes", "cpulist", "threads", "gpus", "port")

ROLE_TASKS = os.path.join(REPO, "roles", "inference_service", "tasks", "main.yml")


def _role_merge_tasks():
    """The role's own tasks that merge each service's defaults and keep those to deploy (tasks/main.yml)."""
    names = ("Merge the defaults of every service", "Note the services to deploy and those to take back")
    with open(ROLE_TASKS) as handle:
        tasks = [task for task in yaml.safe_load(handle) if task["name"] in names]
    assert [task["name"] for task in tasks] == list(names)
    return tasks


TASKS = [
    *_role_merge_tasks(),
    {"name": "Plan every service with the role's own tasks", "ansible.builtin.include_tasks": "service.yml",
     "loop": "{{ inference_service_entries }}", "loop_control": {"loop_var": "_inference_service_cfg"}},
    {"name": "Plan them as fleet_report.yml does", "ansible.builtin.include_tasks": "fleet_report_tasks.yml"},
    {"name": "Note both", "ansible.builtin.set_fact": {
        "kept": "{{ {'deployed': deployed, 'reported': fleet_report_result.planned} }}"}},
]

DEFAULTS = {"layout": "per_node", "smt": False, "memory_headroom": "0", "reserve_cpus": "0", "port_base": 8000}
SERVICES = [dict(service, command=["/usr/bin/server"]) for service in [
    {"name": "llama", "model_size": "1G"},
    {"name": "vllm", "layout": "per_gpu", "model_size": "2G", "smt": True},
    {"name": "big", "layout": "single", "policy": "interleave", "port_base": 9000},
]]


def _fleet_report_host_tasks():
    """The tasks fleet_report.yml runs on each host, up to the one that reads the metrics and plans the services."""
    with open(FLEET_REPORT) as handle:
        tasks = yaml.safe_load(handle)[0]["tasks"]
    names = [task["name"] for task in tasks]
    return tasks[:names.index("Read the metrics and plan the services") + 1]


def test_the_fleet_report_plans_each_service_as_the_role_deploys_it_with_the_inventory_defaults(tmp_path):
    root = sysfs.dual_socket_gpus().write(str(tmp_path / "root"))
    (tmp_path / "plans").mkdir()
    variables = {"root": root, "numa_root": root, "inference_service_plan_dir": str(tmp_path / "plans"),
                 "inference_service_defaults": DEFAULTS, "inference_service_remove": [],
                 # a service being taken back is planned by neither
                 "inference_service_list": SERVICES + [{"name": "gone", "state": "absent"}]}
    written, _ = run_playbook(tmp_path, TASKS, {"service.yml": planning_tasks("deployed"),
                                                "fleet_report_tasks.yml": _fleet_report_host_tasks()}, variables)
    deployed = [(outcome["service"], index, [plan[key] for key in COMPARED])
                for outcome in written["deployed"] for index, plan in enumerate(outcome["plans"])]
    reported = [(row["service"], row["index"], [row[key] for key in COMPARED]) for row in written["reported"]]
    assert reported == deployed
    # The defaults reached both: llama is per_node (two instances) without SMT siblings, ports from 8000.
    assert [(service, index, placement[5]) for service, index, placement in deployed] == [
        ("llama", 0, 8000), ("llama", 1, 8001), ("vllm", 0, 8000), ("vllm", 1, 8001), ("big", 0, 9000)]
    assert all(row["error"] is None for row in written["reported"])
