"""A deployment fails safe, proven with real processes: numa_rollout's core (act/rollout.deploy) against the fake
systemd (tests/helpers/fake_systemd), whose units run the stand-in engine (tests/helpers/standin_engine.py) and whose
steps fail on cue. Every case ends with the host on a judged placement (the change applied and measured, or taken
back completely) or recorded for the next run to take back, within its deadline, never with a traceback."""

import json
import os
import socket
import sys
import time

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import change_files, rollout, unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import ab_gate
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import PLACEMENT_DROP_IN, Service
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import systemctl as systemctl_reader
from tests.helpers import standin_engine
from tests.helpers.fake_systemd import fake_systemd_fixture

ENGINE = standin_engine.__file__.replace(".pyc", ".py")
READY_SECONDS = 4
# The longest a case may take: readiness and the rates before and after, each bounded by READY_SECONDS, then a
# rollback's restart and readiness; a generous margin for a loaded machine.
CASE_SECONDS = 8 * READY_SECONDS
GATE = {"rounds": 2, "max_rounds": 2, "prompt": "Hi", "max_tokens": 4}


@pytest.fixture
def host(tmp_path, trusted_dir):
    """The fake systemd with its units in a directory root may trust; the plan directory beside them."""
    records = os.path.join(trusted_dir, "plans")
    os.makedirs(records)
    for fake in fake_systemd_fixture(tmp_path, os.path.join(trusted_dir, "units")):
        yield Host(fake, records, str(tmp_path / "root"))


class Host:
    """One service ``llm`` of one instance, its unit running the stand-in engine in a given mode."""

    def __init__(self, fake, records, root):
        self.fake = fake
        self.records = records
        self.root = root
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.template = os.path.join(fake.unit_dir, "llm@.service")
        self.record = os.path.join(records, "llm@0.plan.json")
        self.drop_in = os.path.join(fake.unit_dir, "llm@0.service.d", PLACEMENT_DROP_IN)

    def unit(self, mode, rate=10.0):
        return ("[Unit]\nDescription=llm %%i\n\n[Service]\nType=exec\nExecStart=%s\nRestart=on-failure\n"
                "RestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n"
                % unit_text.exec_line([sys.executable, ENGINE, "--port", str(self.port), "--mode", mode,
                                       "--rate", str(rate)]))

    def running(self, mode, cpus="0-1"):
        """What an earlier deployment left: the unit in ``mode`` on ``cpus``, started (and answering /health, but
        for a mode that spoils every exchange)."""
        files = {self.template: self.unit(mode), self.record: json.dumps({"port": self.port}) + "\n",
                 self.drop_in: "[Service]\nCPUAffinity=%s\n" % cpus}
        assert change_files.write_files(files) == []
        self.fake.systemctl("daemon-reload", check=True)
        self.fake.systemctl("start", "llm@0.service", check=True)
        answering = self.instance(None)
        if mode in standin_engine.EXCHANGE_MODES:
            answering = answering._replace(url=None)  # its port accepts connections
        with self.fake.environment():
            assert rollout.wait_ready(answering, 20, self.host()) is None

    def instance(self, gate):
        return rollout.Instance("llm@0.service", "http://127.0.0.1:%d/health" % self.port, self.port, None,
                                gate and ab_gate.gate_from(gate, self.port, "generic", READY_SECONDS))

    def deployment(self, mode, gate=GATE, cpus="0-1", rate=10.0):
        files = {self.template: self.unit(mode, rate), self.record: json.dumps({"port": self.port}) + "\n",
                 self.drop_in: "[Service]\nCPUAffinity=%s\n" % cpus}
        wanted = Service("llm", files, {"llm@0.service": (self.template, self.record, self.drop_in)},
                         {"llm@0.service": self.record}, gate is not None, frozenset([self.template, self.drop_in]))
        return rollout.Deployment(wanted, (self.instance(gate),))

    def host(self):
        return rollout.Host(systemctl_reader.run_command, sleep=lambda seconds: time.sleep(min(seconds, 0.2)))

    def deploy(self, *args, **kwargs):
        """deploy(deployment(...)) as numa_rollout runs it; (its result, the seconds it took)."""
        began = time.monotonic()
        with self.fake.environment():
            result = rollout.deploy([self.deployment(*args, **kwargs)],
                                    rollout.Options(self.records, ready_seconds=READY_SECONDS, root=self.root),
                                    self.host())
        return result, time.monotonic() - began

    def serving(self):
        """The mode and CPUs of the engine that runs now."""
        argv, cpus = self.fake.main_process("llm@0.service")
        return argv[argv.index("--mode") + 1], cpus

    def judged(self):
        """The host is on a judged placement: nothing recorded as pending, the engine in mode ok on CPUs 0-1."""
        with open(self.template) as handle:
            assert "--mode ok --rate 10.0" in handle.read()
        assert change_files.read_pending(self.records) is None
        assert self.serving() == ("ok", "0-1")


def _one_line(result):
    return "\n" not in result["msg"] and "Traceback" not in result["msg"]


# Every wrong answer, asked of llama-server's API (the OpenAI API for the answer only it has, and a few others);
# tests/unit/test_ab_gate.py reads every body on both APIs, here a whole deployment goes through each.
WRONG = ([(mode, "openai" if mode == "models-dict" else "llama.cpp") for mode in sorted(standin_engine.BODY_MODES)]
         + [(mode, "openai") for mode in ("wrong-type", "huge-number", "missing")]
         + [(mode, "llama.cpp") for mode in sorted(standin_engine.EXCHANGE_MODES)])


@pytest.mark.parametrize("mode, api", WRONG)
def test_an_engine_that_answers_wrong_after_the_change_is_taken_back_within_the_deadline(host, mode, api):
    host.running("ok")
    result, seconds = host.deploy(mode, gate=dict(GATE, api=api))
    assert result["failed"] and _one_line(result), result["msg"]
    assert "not measured after its restart" in result["msg"] or "not ready after" in result["msg"], result["msg"]
    assert result["instances"][0]["rolled_back"] == "back on its previous unit and plan, ready", result
    assert seconds < CASE_SECONDS, seconds
    host.judged()
    # Not measured is no verdict: the change is not held, the next run measures it again.
    assert not os.path.exists(os.path.join(host.records, "llm.rejected.json"))


@pytest.mark.parametrize("mode", ["wrong-type", "nan", "trickle", "deep"])
def test_an_engine_that_answers_wrong_before_the_change_is_left_as_it_runs(host, mode):
    host.running(mode)
    started = host.fake.show("llm@0.service", "InvocationID")["InvocationID"]
    result, seconds = host.deploy("ok")
    assert result["failed"] and "not restarted: not measured before its restart" in result["msg"], result["msg"]
    assert _one_line(result) and seconds < CASE_SECONDS
    assert host.fake.show("llm@0.service", "InvocationID")["InvocationID"] == started
    assert change_files.read_pending(host.records) is None
    with open(host.template) as handle:
        assert handle.read() == host.unit(mode)


def test_a_crash_at_start_fails_in_seconds_with_the_servers_own_line_and_goes_back(host):
    host.running("ok")
    result, seconds = host.deploy("crash", gate=None)
    first = result["instances"][0]
    assert "it is crash-looping" in first["msg"] or "its server exited" in first["msg"], first
    assert "standin-engine: error: failed to load model '/models/standin.gguf'" in first["msg"], first
    assert first["seconds"] < 5 and seconds < CASE_SECONDS
    host.judged()


def test_a_slower_change_is_taken_back_and_held_and_a_faster_one_kept(host):
    host.running("ok")
    slower, _seconds = host.deploy("ok", rate=4.0)
    (verdict,) = slower["instances"]
    assert not slower["failed"] and verdict["ab_gate"]["kept"] is False, slower["msg"]
    host.judged()
    held, _seconds = host.deploy("ok", rate=4.0)
    assert held["services"]["llm"]["held"] and held["instances"] == [] and not held["failed"]
    faster, _seconds = host.deploy("ok", rate=20.0)
    assert faster["instances"][0]["ab_gate"]["kept"] and faster["instances"][0]["ab_gate"]["gain_percent"] > 50
    with open(os.path.join(host.records, "ab-gates.json")) as handle:
        assert json.load(handle)["llm@0.service"]["kept"] is True


@pytest.mark.parametrize("step, rule", [
    ("the change's reload", {"verb": "daemon-reload", "nth": 1}),
    ("the change's restart", {"verb": "restart", "nth": 1}),
])
def test_a_step_of_the_change_that_fails_is_taken_back_completely(host, step, rule):
    host.running("ok")
    host.fake.fail_on(rule)
    result, _seconds = host.deploy("ok", cpus="0")
    assert result["failed"] and _one_line(result), (step, result["msg"])
    assert "INCOMPLETE" not in result["msg"] and change_files.read_pending(host.records) is None
    assert host.serving() == ("ok", "0-1")  # the previous placement, read from /proc/<pid>/status


@pytest.mark.parametrize("step, rule", [
    ("the rollback's reload", {"verb": "daemon-reload", "nth": 2}),
    ("the rollback's restart", {"verb": "restart", "nth": 2}),
])
def test_a_rollback_step_that_fails_marks_the_host_and_the_next_run_finishes_it_first(host, step, rule):
    host.running("ok")
    host.fake.fail_on(rule)
    result, _seconds = host.deploy("nan", cpus="0")
    assert result["failed"] and "the rollback is INCOMPLETE" in result["msg"], (step, result["msg"])
    assert "marked for retry" in result["msg"] and _one_line(result)
    assert change_files.read_pending(host.records) is not None
    host.fake.fail_on()
    # The next run, with the change fixed: it takes the unjudged change back first, then deploys and measures
    # (twice as fast: a gain no timing noise of a loaded machine turns into a rollback).
    again, _seconds = host.deploy("ok", cpus="0", rate=20.0)
    assert not again["failed"], again["msg"]
    assert again["msg"].startswith("an earlier change nobody judged was taken back first"), again["msg"]
    assert change_files.read_pending(host.records) is None and host.serving() == ("ok", "0")
