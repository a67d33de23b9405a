"""Traffic hooks with real processes: numa_rollout's core (act/rollout.deploy) against the fake systemd
(tests/helpers/fake_systemd), two instances of a service running the stand-in engine (tests/helpers/standin_engine.py),
and drain and undrain commands that append a line to a log - the hook, its unit and what the instance's /health
answered then - as the engine's wrapper appends one at each start. The log is the order things happened on the host.
The hooks' argv goes through the role's own rule (decide/rollout.hook_argv) and act/hooks.run_hook runs them."""

import json
import os
import socket
import sys
import time

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import change_files, hooks, rollout, unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import Service, hook_argv
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import systemctl as systemctl_reader
from tests.helpers import standin_engine
from tests.helpers.fake_systemd import fake_systemd_fixture

ENGINE = standin_engine.__file__.replace(".pyc", ".py")
READY_SECONDS = 4
UNITS = ("llm@0.service", "llm@1.service")
# The engine's wrapper: a line per start, then the stand-in engine on port base + instance (its other arguments
# passed on).
WRAPPER = """import os, sys
log, instance, base, mode = sys.argv[1:5]
with open(log, "a") as handle:
    handle.write("start %s\\n" % instance)
os.execv(sys.executable, [sys.executable, ENGINE, "--port", str(int(base) + int(instance)), "--mode", mode]
         + sys.argv[5:])
"""
# A hook: a line with what the instance's /health answered, then exit 1 where a file says it must fail.
HOOK = """import os, sys, urllib.request
log, kind, unit, port = sys.argv[1:5]
try:
    status = urllib.request.urlopen("http://127.0.0.1:%s/health" % port, timeout=2).status
except Exception:
    status = "down"
with open(log, "a") as handle:
    handle.write("%s %s %s\\n" % (kind, unit, status))
if os.path.exists(os.path.join(os.path.dirname(log), "fail-%s-%s" % (kind, unit))):
    sys.stderr.write("lb: no such server %s\\n" % unit)
    sys.exit(1)
"""


def _free_ports():
    """Two consecutive ports nothing listens on."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            base = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
                return base
    pytest.skip("no two consecutive free ports")


@pytest.fixture
def host(tmp_path, trusted_dir):
    records = os.path.join(trusted_dir, "plans")
    os.makedirs(records)
    for fake in fake_systemd_fixture(tmp_path, os.path.join(trusted_dir, "units")):
        yield Host(fake, records, tmp_path)


class Host:
    def __init__(self, fake, records, tmp_path):
        self.fake = fake
        self.records = records
        self.root = str(tmp_path / "root")
        self.base = _free_ports()
        self.log = str(tmp_path / "hooks" / "log")
        os.makedirs(os.path.dirname(self.log))
        self.wrapper = str(tmp_path / "wrapper.py")
        with open(self.wrapper, "w") as handle:
            handle.write("ENGINE = %r\n" % ENGINE + WRAPPER)
        self.hook = str(tmp_path / "hook.py")
        with open(self.hook, "w") as handle:
            handle.write(HOOK)
        self.template = os.path.join(fake.unit_dir, "llm@.service")

    def record(self, index):
        return os.path.join(self.records, "llm@%d.plan.json" % index)

    def unit(self, mode):
        return ("[Service]\nType=exec\nExecStart=%s %%i %d %s\nRestart=on-failure\nRestartSec=1\n"
                % (unit_text.exec_line([sys.executable, self.wrapper, self.log]), self.base, mode))

    def files(self, mode):
        return dict({self.template: self.unit(mode)},
                    **{self.record(i): json.dumps({"port": self.base + i}) + "\n" for i in range(2)})

    def running(self):
        """An earlier deployment, both instances answering; the log emptied."""
        assert change_files.write_files(self.files("ok")) == []
        self.fake.systemctl("daemon-reload", check=True)
        for index, unit in enumerate(UNITS):
            self.fake.systemctl("start", unit, check=True)
            with self.fake.environment():
                assert rollout.wait_ready(self.instance(index), 20, self.rollout_host()) is None
        os.remove(self.log)

    def instance(self, index):
        """Instance ``index`` with the role's hooks: its unit and port filled in by decide/rollout.hook_argv."""
        command = [sys.executable, self.hook, self.log]
        port = self.base + index
        return rollout.Instance(UNITS[index], "http://127.0.0.1:%d/health" % port, port, None, None,
                                hooks.hooks_from(hook_argv(command + ["drain", "{unit}", "{port}"], "llm", index, port),
                                                 hook_argv(command + ["undrain", "{unit}", "{port}"], "llm", index,
                                                           port), 20, 0.2))

    def rollout_host(self):
        return rollout.Host(systemctl_reader.run_command, sleep=lambda seconds: time.sleep(min(seconds, 0.2)))

    def deploy(self, mode, batch=1):
        files = self.files(mode)
        wanted = Service("llm", files, {unit: (self.template, self.record(i)) for i, unit in enumerate(UNITS)},
                         {unit: self.record(i) for i, unit in enumerate(UNITS)}, False, frozenset([self.template]))
        with self.fake.environment():
            return rollout.deploy([rollout.Deployment(wanted, (self.instance(0), self.instance(1)))],
                                  rollout.Options(self.records, batch=batch, ready_seconds=READY_SECONDS,
                                                  root=self.root), self.rollout_host())

    def lines(self):
        with open(self.log) as handle:
            return handle.read().splitlines()

    def fail(self, kind, unit, on=True):
        path = os.path.join(os.path.dirname(self.log), "fail-%s-%s" % (kind, unit))
        if on:
            open(path, "w").close()
        else:
            os.remove(path)

    def invocation(self, unit):
        return self.fake.show(unit, "InvocationID")["InvocationID"]


def test_each_instance_is_drained_restarted_judged_and_undrained_before_the_next(host):
    host.running()
    result = host.deploy("ok --rate 12")
    assert result["failed"] is False, result["msg"]
    # Drained while its old server answered; undrained once its new one did.
    assert host.lines() == ["drain llm@0.service 200", "start 0", "undrain llm@0.service 200",
                            "drain llm@1.service 200", "start 1", "undrain llm@1.service 200"]


def test_a_failed_drain_leaves_its_instance_untouched_and_the_rollback_is_wrapped_too(host):
    host.running()
    untouched = host.invocation("llm@1.service")
    host.fail("drain", "llm@1.service")
    result = host.deploy("ok --rate 12")
    assert result["failed"] is True and "\n" not in result["msg"]
    assert ("llm@1.service: not restarted: its drain command `%s %s %s drain llm@1.service %d` exited 1: lb: no such "
            "server llm@1.service; the instance was not touched" % (sys.executable, host.hook, host.log, host.base + 1)
            in result["msg"]), result["msg"]
    assert host.lines() == ["drain llm@0.service 200", "start 0", "undrain llm@0.service 200",
                            "drain llm@1.service 200",
                            # the change taken back: llm@0 restarted on its previous unit inside its hooks
                            "drain llm@0.service 200", "start 0", "undrain llm@0.service 200"]
    assert host.invocation("llm@1.service") == untouched
    assert change_files.read_pending(host.records) is None


def test_an_instance_that_fails_its_gate_is_taken_back_and_undrained_once_ready_again(host):
    host.running()
    result = host.deploy("error")
    assert result["failed"] is True and "llm@0.service: not ready after 4 s" in result["msg"], result["msg"]
    assert host.lines() == ["drain llm@0.service 200", "start 0", "start 0", "undrain llm@0.service 200"]
    assert result["instances"][0]["rolled_back"] == "back on its previous unit and plan, ready; undrained"


def test_a_failed_undrain_marks_the_host_and_the_next_run_undrains_it_first(host):
    host.running()
    host.fail("undrain", "llm@0.service")
    result = host.deploy("ok --rate 12")
    assert result["failed"] is True and "\n" not in result["msg"]
    assert "llm@0.service: ready and judged, but its undrain command" in result["msg"], result["msg"]
    assert result["msg"].endswith("llm@0.service run without traffic: their undrain failed; the host stays marked "
                                  "for retry (%s/rollout.undrain.json): the next run undrains them before it "
                                  "deploys; fix the undrain command or the load balancer and run again"
                                  % host.records), result["msg"]
    assert host.lines() == ["drain llm@0.service 200", "start 0", "undrain llm@0.service 200",
                            "start 0", "undrain llm@0.service 200"]
    assert change_files.read_undrain(host.records) == ["llm@0.service"]

    host.fail("undrain", "llm@0.service", on=False)
    os.remove(host.log)
    again = host.deploy("ok --rate 12")
    assert again["failed"] is False, again["msg"]
    assert host.lines() == ["undrain llm@0.service 200",
                            "drain llm@0.service 200", "start 0", "undrain llm@0.service 200",
                            "drain llm@1.service 200", "start 1", "undrain llm@1.service 200"]
    assert change_files.read_undrain(host.records) == []


# --- one hook, run for real -----------------------------------------------------------------------------------

def test_a_hook_past_its_deadline_is_killed_with_what_it_started(tmp_path):
    marker = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
              "time.sleep(60)']); open(%r, 'w').write(str(child.pid)); time.sleep(60)" % str(marker))
    began = time.monotonic()
    problem = hooks.hook_problem("undrain", [sys.executable, "-c", script], 1.5, hooks.run_hook)
    assert time.monotonic() - began < 10
    assert problem.endswith("still running after 1.5 s (hook_seconds), killed"), problem
    child = int(marker.read_text())
    for _ in range(50):  # its child got the same SIGKILL (one session); a zombie until someone reaps it
        try:
            with open("/proc/%d/stat" % child) as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the hook's child outlived its deadline")


def test_a_hook_says_its_exit_code_and_last_stderr_line_and_one_that_cannot_start_why():
    argv = [sys.executable, "-c", "import sys; print('out'); sys.stderr.write('first\\nNo such server.\\n'); "
                                  "sys.exit(3)"]
    assert hooks.hook_problem("drain", argv, 10, hooks.run_hook).endswith("exited 3: No such server.")
    assert hooks.hook_problem("drain", [sys.executable, "-c", "print('fine')"], 10, hooks.run_hook) is None
    assert hooks.hook_problem("drain", ["/nonexistent/lb"], 5, hooks.run_hook) == (
        "its drain command `/nonexistent/lb` could not run: No such file or directory")
