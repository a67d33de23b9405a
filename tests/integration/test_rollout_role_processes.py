"""The inference_service role run end to end by ansible-playbook against the fake systemd and the stand-in engine:
a change an engine cannot be measured after is taken back and tried again by the next run (never ``changed=0``
over it), a rollback whose reload fails marks the host and the next run finishes it, and a ``pin_mode: systemd``
change rolled back puts the instance back on its previous CPUs (read from /proc/<pid>/status).

The preflight's host checks read a captured host (tests/unit/test_preflight.py's): this machine's PID 1 is not
systemd. Everything else is this machine, as the role reads it."""

import json
import os
import re
import socket
import subprocess
import sys

import pytest
import yaml

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import change_files
from tests.helpers import standin_engine
from tests.helpers.fake_systemd import fake_systemd_fixture
from tests.tools import REPO, ansible_command
from tests.unit.test_preflight import _host

ENGINE = standin_engine.__file__.replace(".pyc", ".py")
PLAY = """\
- name: Deploy the stand-in engine with the inference_service role
  hosts: all
  gather_facts: false
  module_defaults:
    inferops.numa.numa_preflight:
      root: "{{ captured_root }}"
  tasks:
    - name: Deploy
      ansible.builtin.include_role:
        name: inferops.numa.inference_service
"""


@pytest.fixture
def box(tmp_path, trusted_dir):
    """The fake systemd, its units and the plan records in directories root may trust, and a captured host with
    systemd as PID 1 and this interpreter, for the preflight."""
    captured = _host(tmp_path / "captured")
    interpreter = os.path.join(captured, sys.executable.lstrip("/"))
    os.makedirs(os.path.dirname(interpreter), exist_ok=True)
    os.symlink(sys.executable, interpreter)
    for fake in fake_systemd_fixture(tmp_path, os.path.join(trusted_dir, "units")):
        yield Box(fake, tmp_path, os.path.join(trusted_dir, "plans"), captured)


class Box:
    def __init__(self, fake, tmp_path, plans, captured):
        self.fake = fake
        self.tmp_path = tmp_path
        self.plans = plans
        self.captured = captured
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]

    def entry(self, mode="ok", rate=10.0, **changes):
        return dict({"name": "llm", "layout": "single", "engine": "llama.cpp", "pin_mode": "systemd",
                     "command": [sys.executable, ENGINE, "--port", "{port}", "--mode", mode, "--rate", str(rate)],
                     "port_base": self.port, "model_size": "16M", "memory_headroom": "0", "create_user": False,
                     "user": "root", "restart_sec": 1, "pages": "anon"}, **changes)

    def run(self, entry, **variables):
        """ansible-playbook of PLAY with ``entry`` as the host's one service: (exit code, output, numa_rollout's
        result as printed for its task when it failed, else None)."""
        inventory = self.tmp_path / "inventory.yml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": {"box": dict({
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "captured_root": self.captured, "inference_service_list": [entry],
            "inference_service_unit_dir": self.fake.unit_dir, "inference_service_plan_dir": self.plans,
            "inference_service_ready_seconds": 10, "inference_service_audit_settle_seconds": 1,
            "inference_service_audit_wait_seconds": 20}, **variables)}}}))
        play = self.tmp_path / "play.yml"
        play.write_text(PLAY)
        env = self.fake.env()
        env.update(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        done = subprocess.run([ansible_command("ansible-playbook"), "-v", "-i", str(inventory), str(play)], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                              timeout=600, check=False)
        assert "Traceback" not in done.stdout, done.stdout
        return done.returncode, done.stdout, _rollout_failure(done.stdout)

    def serving(self):
        """The mode and CPUs of the engine that runs now."""
        argv, cpus = self.fake.main_process("llm@0.service")
        return argv[argv.index("--mode") + 1], cpus


def _rollout_failure(output):
    found = re.search(r"TASK \[[^\]]*Deploy the services' files[^\]]*\].*?FAILED! => ", output, re.S)
    return json.JSONDecoder().raw_decode(output[found.end():])[0] if found else None


def _recap(output):
    return re.search(r"box\s+: ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", output).groups()


GATE = {"rounds": 2, "max_rounds": 2, "max_tokens": 4}


def test_an_unmeasurable_change_is_taken_back_and_tried_again_by_the_next_run(box):
    code, output, _failure = box.run(box.entry(ab_gate=GATE))
    assert code == 0, output
    assert box.serving() == ("ok", "0-1")
    for attempt in range(2):
        code, output, failure = box.run(box.entry(mode="wrong-type", ab_gate=GATE))
        assert code != 0 and failure, output
        first = failure["instances"][0]
        assert "not measured after its restart" in first["msg"], first
        assert first["rolled_back"] == "back on its previous unit and plan, ready", first
        assert box.serving() == ("ok", "0-1"), attempt
        assert change_files.read_pending(box.plans) is None
        assert _recap(output)[1] == "1"
    code, output, _failure = box.run(box.entry(ab_gate=GATE))
    assert code == 0 and _recap(output)[0] == "0", output  # the judged placement was running all along


def test_a_rollback_whose_reload_fails_marks_the_host_and_the_next_run_finishes_it(box):
    code, output, _failure = box.run(box.entry())
    assert code == 0, output
    box.fake.fail_on({"verb": "daemon-reload", "nth": 2})  # the change's reload works, the rollback's fails
    code, output, failure = box.run(box.entry(mode="crash"))
    assert code != 0 and "the rollback is INCOMPLETE" in failure["msg"], output
    assert "marked for retry" in failure["msg"] and change_files.read_pending(box.plans) is not None
    box.fake.fail_on()
    code, output, _failure = box.run(box.entry())
    assert code == 0, output
    assert "an earlier change nobody judged was taken back first" in output
    assert change_files.read_pending(box.plans) is None and box.serving() == ("ok", "0-1")


def test_a_pin_mode_systemd_change_rolled_back_restores_the_previous_affinity(box):
    code, output, _failure = box.run(box.entry())
    assert code == 0 and box.serving() == ("ok", "0-1"), output
    drop_in = os.path.join(box.fake.unit_dir, "llm@0.service.d", "50-inferops-numa.conf")
    with open(drop_in) as handle:
        kept = handle.read()
    # CPU 1 reserved (the instance on CPU 0 alone) and a server that cannot start: taken back whole.
    code, output, failure = box.run(box.entry(mode="crash", reserve_cpus="1"))
    assert code != 0 and failure["instances"][0]["rolled_back"].startswith("back on its previous unit"), output
    with open(drop_in) as handle:
        assert handle.read() == kept
    assert box.serving() == ("ok", "0-1")


RECORDS_PLAY = """\
- name: A plan record as the role wrote it and as numa_rollout_service writes it
  hosts: localhost
  gather_facts: false
  vars:
    record: {policy: bind, mem_nodes: [1], cpulist: "2-3", threads: 2, port: 8081, env: {OMP_NUM_THREADS: "2"}}
    entry: {pin_mode: wrapper, engine: null, health_url: null, ab_gate: null, audit: true, min_local_percent: 99,
            pages: all, on_drift: none}
    service: "{{ entry | inferops.numa.numa_rollout_service('llama', '', [record], [], '/u', '/p') }}"
  tasks:
    - name: Compare them byte for byte
      ansible.builtin.assert:
        that: (service.files | selectattr('path', 'equalto', '/p/llama@0.plan.json') | first).content
              == (record | to_nice_json) ~ '\\n'
"""


def test_a_plan_record_is_written_byte_for_byte_as_the_role_wrote_it_so_an_upgrade_restarts_nothing(tmp_path):
    play = tmp_path / "records.yml"
    play.write_text(RECORDS_PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", str(play)], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert done.returncode == 0, done.stdout
