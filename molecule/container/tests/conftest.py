"""What the container scenario's checks share: the container, its snapshots, and site.yml run again from here.

A snapshot (lab/container.py snapshot) is what the container holds: files under the system's roots with their
modes, owners and contents' hashes, users, groups, units and their states, unit files, kernel knobs. create.yml
takes one of the fresh container (snapshot-fresh.json in the scenario's ephemeral directory), before anything of
ours is in it; checks take more before and after a run and compare them (lab/container.py differences).

Each check is measured against a budget like the lab's (molecule/default/tests/conftest.py, whose report code this
reuses): seconds on the reference machine, unscaled, since a container runs at the host's speed.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY",
                         os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__))))))
sys.path.insert(0, os.path.join(PROJECT, "lab"))
import container  # noqa: E402  (lab/ is not a package)

SCENARIO_DIR = os.environ.get("MOLECULE_SCENARIO_DIRECTORY",
                              os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = container.container_name(os.environ.get("MOLECULE_SCENARIO_NAME", "container"), PROJECT)
FRESH = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent"), "snapshot-fresh.json")
# The variables converge.yml loads; the nested runs pass the same files. ports.yml: the free ports create.yml chose.
PORTS_FILE = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent"), "ports.yml")
SERVICES_FILE = os.path.join(SCENARIO_DIR, "vars", "services.yml")
VARS_FILES = [PORTS_FILE, SERVICES_FILE, os.path.join(SCENARIO_DIR, "vars", "host.yml")]
# What converge.yml itself puts in the container, which no role of ours is to remove.
CONVERGE_OWN = ["/opt/inferops-container"]
# What the metrics timer (numa_host_metrics) changes on its own every period while a check runs: whether it and its
# service are running at that instant, and the textfile it rewrites. A before/after comparison around one run leaves
# them out; the removal's comparison with the fresh container does not (all of it must be gone).
TIMER_OWN = ["inferops-numa-metrics.", "/var/lib/prometheus/node-exporter/"]
PLAYBOOK_S = 180  # one site.yml run (converge took about 50 s)

_lab_spec = importlib.util.spec_from_file_location(
    "lab_conftest_budgets", os.path.join(PROJECT, "molecule", "default", "tests", "conftest.py"))

CHECK_S = 30
CHECK_BUDGETS = {
    "test_a_check_mode_run_with_changed_services_changes_nothing": 120,
    "test_a_refused_run_says_why_in_one_line_and_changes_nothing": 60,
    "test_a_removal_leaves_nothing_of_ours": 240,  # the removal run, then converge.yml again
}
CHECKS_REPORT = os.path.join(PROJECT, "build", "reports", "container-checks.txt")
_TOOK = {}


def _lab_budget_code():
    """molecule/default/tests/conftest.py's check_name and budget_rows (its module imports labvm, no guest needed)."""
    lab = importlib.util.module_from_spec(_lab_spec)
    _lab_spec.loader.exec_module(lab)
    return lab


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::")[-1].split("[")[0]
    _TOOK[name] = _TOOK.get(name, 0.0) + report.duration


def pytest_sessionfinish(session):
    if not _TOOK:
        return
    lab = _lab_budget_code()
    lab.CHECK_BUDGETS, lab.CHECK_S = CHECK_BUDGETS, CHECK_S
    rows = lab.budget_rows(_TOOK, 1.0)
    lines = ["%5.2f  %7.1f s of %6.1f s  %s%s" % (ratio, took, allowed, name, "  OVER" if ratio > 1 else "")
             for ratio, took, allowed, name in rows]
    total, allowed = sum(row[1] for row in rows), sum(row[2] for row in rows)
    header = "container checks: %.0f s of %.0f s budgeted (%.2f); %d over budget" % (
        total, allowed, total / allowed, sum(1 for row in rows if row[0] > 1))
    os.makedirs(os.path.dirname(CHECKS_REPORT), exist_ok=True)
    with open(CHECKS_REPORT, "w") as handle:
        handle.write("\n".join([header, "ratio     took     budget   check"] + lines) + "\n")


# ------------------------------------------------------------------------------------------- snapshots ---

def snapshot() -> dict:
    return container.snapshot(NAME)


def fresh_snapshot() -> dict:
    assert os.path.isfile(FRESH), "%s missing: create.yml takes it (molecule test -s container)" % FRESH
    with open(FRESH) as handle:
        return json.load(handle)


def differences(before: dict, after: dict, ignore=()) -> list:
    return container.differences(before, after, list(ignore))


# --------------------------------------------------------------------------------------- site.yml again ---

def site(*extra: str) -> subprocess.CompletedProcess:
    """The checkout's site.yml against the container as converge.yml ran it (molecule's inventory and configuration,
    the scenario's variables), with ``extra`` arguments after them; its output (stdout and stderr) in .stdout."""
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    argv = [playbook, "-i", os.environ["MOLECULE_INVENTORY_FILE"], os.path.join(PROJECT, "site.yml")]
    for path in VARS_FILES:
        argv += ["-e", "@" + path]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(argv + list(extra), cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=PLAYBOOK_S, check=False)


def converge() -> None:
    """converge.yml again: the deployment as molecule made it."""
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    subprocess.run([playbook, "-i", os.environ["MOLECULE_INVENTORY_FILE"], os.path.join(SCENARIO_DIR, "converge.yml")],
                   cwd=PROJECT, check=True, timeout=PLAYBOOK_S, stdout=subprocess.DEVNULL)


def recap_changed(output: str) -> int:
    """The changed= count of the play recap's line for the container."""
    for line in output.splitlines():
        if line.startswith("numa-container") and "changed=" in line:
            return int(line.split("changed=")[1].split()[0])
    pytest.fail("no play recap in the output:\n%s" % output[-3000:])


def ports() -> list:
    """The ports of the scenario's services: create.yml chose them free."""
    import yaml
    with open(PORTS_FILE) as handle:
        return yaml.safe_load(handle)["container_ports"]


@pytest.fixture
def plan(host) -> dict:
    """The stand-in instance's plan record, as the role wrote it."""
    record = host.file("/etc/inferops-numa/standin@0.plan.json")
    assert record.is_file, "no plan record /etc/inferops-numa/standin@0.plan.json"
    return json.loads(record.content_string)
