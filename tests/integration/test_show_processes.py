"""What a run shows without -v, by ansible-playbook: the inference_service role ends with the placement table `make
demo` prints; a dry run where PID 1 is not systemd plans and renders every unit and says in one line what needs
systemd, where a real run refuses with that line before any change.

The preflight reads a captured host whose PID 1 is bash (tests/unit/test_preflight.py's), as a container's or
this machine's is, so the test means the same on a host booted with systemd; everything else is this machine.
The deployment's table is read through the fake systemd and the stand-in engine, whose rate an A/B gate measures."""

import os
import re
import socket
import subprocess
import sys

import pytest
import yaml

from tests.helpers import standin_engine
from tests.helpers.fake_systemd import fake_systemd_fixture
from tests.tools import REPO, ansible_command, warnings_in
from tests.unit.test_preflight import _host

ENGINE = standin_engine.__file__.replace(".pyc", ".py")
PLAY = """\
- name: Deploy with the inference_service role
  hosts: all
  gather_facts: false
  module_defaults:
    inferops.numa.numa_preflight:
      root: "{{ captured_root }}"
  tasks:
    - name: Deploy
      ansible.builtin.include_role:
        name: inferops.numa.inference_service
        tasks_from: %s
"""
WITHOUT_SYSTEMD = ("systemd: PID 1 here is bash, not systemd; starting, restarting, enabling and auditing the "
                   "instances, and the metrics timer, need it: run the roles on a host booted with systemd (--check "
                   "plans here without it)")
HEADER = "instance node(s) cpus policy threads local pages model pages local port tokens/s"


def _port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _entry(port, **changes):
    return dict({"name": "llm", "layout": "single", "engine": "llama.cpp", "pin_mode": "wrapper",
                 "command": [sys.executable, ENGINE, "--port", "{port}", "--mode", "ok", "--rate", "10.0"],
                 "port_base": port, "model_size": "16M", "memory_headroom": "0", "create_user": False,
                 "user": "root", "restart_sec": 1, "pages": "anon"}, **changes)


def _run(tmp_path, captured, variables, *extra, env=None, tasks="main"):
    """ansible-playbook of PLAY (the role's ``tasks`` file: main, or audit as site.yml --tags audit runs it) at
    default verbosity: (exit code, output)."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"box": dict({
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "captured_root": captured}, **variables)}}}))
    play = tmp_path / "play.yml"
    play.write_text(PLAY % tasks)
    env = dict(env or os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", str(inventory), str(play)] + list(extra),
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600, check=False)
    assert "Traceback" not in done.stdout, done.stdout
    return done.returncode, done.stdout


def _rows(output):
    """The rows of the last placement table the run printed (the debug task's msg list), each {column: cell} cut at
    the header's column starts."""
    start = output.rindex('"instance  ')
    lines = re.findall(r'^\s*"(.*)",?$', output[start:].split("]", 1)[0], re.M)
    header = lines[0]
    assert header.split() == HEADER.split(), lines  # the columns in their order, padded to their widest cell
    names = ["instance", "node(s)", "cpus", "policy", "threads", "local pages", "model pages local", "port",
             "tokens/s"]
    starts = [header.index(name) for name in names] + [None]
    return [{name: line[starts[i]:starts[i + 1]].strip() for i, name in enumerate(names)} for line in lines[1:]]


@pytest.fixture
def no_systemd(tmp_path, trusted_dir):
    """A captured host whose PID 1 is bash, and unit and plan directories a dry run must leave unmade."""
    captured = _host(tmp_path / "captured", pid1="bash")
    interpreter = os.path.join(captured, sys.executable.lstrip("/"))
    os.makedirs(os.path.dirname(interpreter), exist_ok=True)
    os.symlink(sys.executable, interpreter)
    return captured, {"inference_service_list": [_entry(_port())],
                      "inference_service_unit_dir": os.path.join(trusted_dir, "units"),
                      "inference_service_plan_dir": os.path.join(trusted_dir, "plans")}


def test_a_dry_run_without_systemd_plans_renders_the_unit_and_says_once_what_needs_systemd(tmp_path, no_systemd):
    captured, variables = no_systemd
    code, output = _run(tmp_path, captured, variables, "--check", "--diff")
    assert code == 0, output
    # Said once, as a warning (which an older core wraps at 79 columns).
    said = [line for line in warnings_in(output) if WITHOUT_SYSTEMD in line]
    assert said == ["[WARNING]: box: planning only: " + WITHOUT_SYSTEMD], output
    assert re.sub(r"\s+", "", output).count(re.sub(r"\s+", "", WITHOUT_SYSTEMD)) == 1, output
    # The unit's text, headed by its path, and the plan record, shown by --diff.
    assert "+++ after: %s/llm@.service" % variables["inference_service_unit_dir"] in output, output
    assert re.search(r"^\+ExecStart=\S*numa-pin exec --instance %i .* -- " + re.escape(sys.executable), output,
                     re.M), output
    assert "+++ after: %s/llm@0.plan.json" % variables["inference_service_plan_dir"] in output, output
    assert "Planned on box (check mode: nothing started, no pages audited):" in output, output
    (row,) = _rows(output)
    # The plan's columns, and none of what needs a running instance: no pages audited, no gate measured.
    assert row["instance"] == "llm@0" and row["policy"] == "bind" and int(row["threads"]) > 0, row
    assert row["node(s)"] and row["cpus"], row
    assert (row["local pages"], row["model pages local"], row["tokens/s"]) == ("-", "-", "-"), row
    assert row["port"] == str(variables["inference_service_list"][0]["port_base"]), row
    assert not os.path.exists(variables["inference_service_unit_dir"]), "a dry run wrote the unit directory"
    assert not os.path.exists(variables["inference_service_plan_dir"]), "a dry run wrote the plan directory"


def test_a_real_run_without_systemd_refuses_with_that_line_before_any_change(tmp_path, no_systemd):
    captured, variables = no_systemd
    code, output = _run(tmp_path, captured, variables)
    assert code != 0, output
    assert "preflight: box: " + WITHOUT_SYSTEMD in output, output
    assert "planning only" not in output and '"instance  ' not in output, output
    assert not os.path.exists(variables["inference_service_unit_dir"]), "a refused run wrote the unit directory"
    assert not os.path.exists(variables["inference_service_plan_dir"]), "a refused run wrote the plan directory"


@pytest.fixture
def deployed(tmp_path, trusted_dir):
    """The fake systemd, with its units and the plan records in directories root may trust, and a captured host with
    systemd as PID 1 for the preflight."""
    captured = _host(tmp_path / "captured")
    interpreter = os.path.join(captured, sys.executable.lstrip("/"))
    os.makedirs(os.path.dirname(interpreter), exist_ok=True)
    os.symlink(sys.executable, interpreter)
    for fake in fake_systemd_fixture(tmp_path, os.path.join(trusted_dir, "units")):
        yield fake, captured, os.path.join(trusted_dir, "plans")


def test_a_deployment_and_its_later_audit_end_with_the_table_filled_in(tmp_path, deployed):
    fake, captured, plans = deployed
    port = _port()
    # pin_mode systemd: the fake systemd places the instance itself, no numa-pin installed here is needed.
    entry = _entry(port, pin_mode="systemd", ab_gate={"rounds": 2, "max_rounds": 2, "max_tokens": 4})
    variables = {"inference_service_list": [entry],
                 "inference_service_unit_dir": fake.unit_dir, "inference_service_plan_dir": plans,
                 "inference_service_ready_seconds": 10, "inference_service_audit_settle_seconds": 1,
                 "inference_service_audit_wait_seconds": 20}
    code, output = _run(tmp_path, captured, variables, env=fake.env())
    assert code == 0, output
    assert "Placement on box:" in output, output
    (row,) = _rows(output)
    assert row["instance"] == "llm@0" and row["port"] == str(port) and row["policy"] == "bind", row
    # The audit's local share of the pages and the gate's rate (the stand-in engine's, --rate 10.0).
    assert re.fullmatch(r"\d+\.\d\d %", row["local pages"]), row
    assert float(row["tokens/s"]) == pytest.approx(10.0, rel=0.5), row
    # site.yml --tags audit: the same table, from the records the deployment left and its gate's verdict.
    code, output = _run(tmp_path, captured, variables, env=fake.env(), tasks="audit")
    assert code == 0 and "Audited on box:" in output, output
    (again,) = _rows(output)
    assert {key: again[key] for key in ("instance", "node(s)", "cpus", "policy", "threads", "port", "tokens/s")} == {
        key: row[key] for key in ("instance", "node(s)", "cpus", "policy", "threads", "port", "tokens/s")}, output
    assert re.fullmatch(r"\d+\.\d\d %", again["local pages"]), again
