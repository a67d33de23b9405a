"""The fake systemd (tests/helpers/fake_systemd/) against real processes: units, drop-ins, specifiers and quoting,
CPUAffinity=, restarts and the start limit, the journal, daemon-reload, failures on cue, and Ansible's
systemd_service module driving it, so that the role and numa_rollout can be run end to end on a host without
systemd."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import rollout, unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.base import tokens
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import Service
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import systemctl as systemctl_reader

from tests.helpers.fake_systemd import HERE, FakeSystemd, fake_systemd_fixture
from tests.tools import REPO, ansible_command

fake = pytest.fixture(name="fake")(fake_systemd_fixture)

PYTHON = sys.executable
SYSTEM_PYTHON = "/usr/bin/python3"
# A process that reports how it was started (argv, environment, CPUs, directory) on its stdout, then stays or exits.
REPORT = ("import json, os, sys, time; print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ), "
          "'cpus': sorted(os.sched_getaffinity(0)), 'cwd': os.getcwd()}), flush=True); "
          "time.sleep(float(os.environ.get('STAY', '0')))")


def unit(exec_start, *settings, kind="exec", description="Test %i", install=True, unit_settings=()):
    """A unit file: ``settings`` go to [Service], ``unit_settings`` to [Unit]."""
    lines = ["[Unit]", "Description=" + description] + list(unit_settings)
    lines += ["", "[Service]", "Type=" + kind, "ExecStart=" + exec_start]
    lines += list(settings)
    if install:
        lines += ["", "[Install]", "WantedBy=multi-user.target"]
    return "\n".join(lines) + "\n"


def python(code, *args):
    """An ExecStart= value running ``python -c code args`` as the project writes one (unit_text.exec_line)."""
    return unit_text.exec_line([PYTHON, "-c", code] + list(args))


def report_of(fake, name):
    """What a REPORT process printed: the first JSON line of its journal."""
    for line in fake.journal(name):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError("%s printed no report; journal:\n%s" % (name, "\n".join(fake.journal(name))))


def cmdline(pid):
    with open("/proc/%s/cmdline" % pid, "rb") as handle:
        return handle.read().split(b"\0")[:-1]


def gone(pid):
    try:
        with open("/proc/%s/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def cpus_allowed(pid):
    with open("/proc/%s/status" % pid) as handle:
        return [line.split(":", 1)[1].strip() for line in handle if line.startswith("Cpus_allowed_list")][0]


def active(props):
    return props["ActiveState"] == "active"


def ended(props):
    return props["ActiveState"] in ("inactive", "failed")


# ------------------------------------------------------------------------------------- start, stop, show ---

def test_start_show_restart_stop_a_real_process(fake):
    fake.write_unit("sleeper@.service", unit("/bin/sleep 600"))
    assert fake.systemctl("daemon-reload").returncode == 0
    assert fake.show("sleeper@1.service", "LoadState", "ActiveState", "SubState", "MainPID") == {
        "LoadState": "loaded", "ActiveState": "inactive", "SubState": "dead", "MainPID": "0"}
    started = fake.systemctl("start", "--", "sleeper@1.service")
    assert started.returncode == 0, started.stderr
    props = fake.show("sleeper@1.service")
    assert (props["ActiveState"], props["SubState"], props["Result"], props["UnitFileState"]) == (
        "active", "running", "success", "disabled")
    first = props["MainPID"]
    assert cmdline(first) == [b"/bin/sleep", b"600"] and len(props["InvocationID"]) == 32
    assert props["Description"] == "Test 1" and props["FragmentPath"].endswith("/units/sleeper@.service")
    # start again: already running, nothing happens
    assert fake.systemctl("start", "sleeper@1").returncode == 0
    assert fake.show("sleeper@1.service", "MainPID")["MainPID"] == first
    assert fake.systemctl("restart", "sleeper@1.service").returncode == 0
    again = fake.show("sleeper@1.service")
    assert again["ActiveState"] == "active" and again["MainPID"] != first and gone(first)
    assert again["InvocationID"] != props["InvocationID"]
    assert fake.systemctl("is-active", "sleeper@1.service").stdout == "active\n"
    assert fake.systemctl("stop", "sleeper@1.service").returncode == 0
    stopped = fake.show("sleeper@1.service", "ActiveState", "SubState", "MainPID", "Result", "ExecMainCode",
                        "ExecMainStatus")
    assert stopped == {"ActiveState": "inactive", "SubState": "dead", "MainPID": "0", "Result": "success",
                       "ExecMainCode": "2", "ExecMainStatus": "15"}  # killed by SIGTERM: a clean stop
    assert gone(again["MainPID"])
    inactive = fake.systemctl("is-active", "sleeper@1.service")
    assert (inactive.returncode, inactive.stdout) == (3, "inactive\n")
    assert fake.journal("sleeper@1.service")[-5:] == [
        "Starting sleeper@1.service - Test 1...", "Started sleeper@1.service - Test 1.",
        "Stopping sleeper@1.service - Test 1...", "sleeper@1.service: Deactivated successfully.",
        "Stopped sleeper@1.service - Test 1."]


def test_show_prints_one_block_per_unit_as_the_package_reads_them(fake):
    fake.write_unit("sleeper@.service", unit("/bin/sleep 600"))
    fake.systemctl("start", "sleeper@0.service", "sleeper@1.service", check=True)
    with fake.environment():
        shown = systemctl_reader.show_units(["sleeper@0.service", "nothere@0.service", "sleeper@1.service"],
                                            systemctl_reader.run_command)
    assert shown["sleeper@0.service"]["ActiveState"] == shown["sleeper@1.service"]["ActiveState"] == "active"
    assert shown["nothere@0.service"]["LoadState"] == "not-found"
    assert shown["sleeper@0.service"]["MainPID"] != shown["sleeper@1.service"]["MainPID"]
    assert shown["sleeper@0.service"]["ControlGroup"] == ""
    values = fake.systemctl("show", "-p", "ActiveState", "--value", "sleeper@0.service", "sleeper@1.service").stdout
    assert values == "active\n\nactive\n"
    version = fake.systemctl("--version").stdout
    assert unit_text.parse_systemd_version(version) == 252


def test_a_missing_or_broken_unit_is_refused_as_systemd_refuses_it(fake):
    missing = fake.systemctl("start", "nothere.service")
    assert (missing.returncode, missing.stderr) == (5, "Failed to start nothere.service: Unit nothere.service not "
                                                       "found.\n")
    fake.write_unit("bare@.service", "[Service]\nType=exec\nRestart=no\n")  # no ExecStart= (pin_mode systemd's
    refused = fake.systemctl("start", "bare@0.service")                      # template without its drop-in)
    assert refused.returncode == 1 and "bare@0.service has a bad unit file setting" in refused.stderr
    props = fake.show("bare@0.service", "LoadState", "ActiveState")
    assert props == {"LoadState": "bad-setting", "ActiveState": "inactive"}
    assert "bare@0.service: Service has no ExecStart=, ExecStop=, or SuccessAction=. Refusing." in fake.journal(
        "bare@0.service")
    fake.write_unit("two.service", unit("/bin/sleep 1") + "[Service]\nExecStart=/bin/sleep 2\n")
    assert fake.systemctl("start", "two.service").returncode == 1
    assert fake.show("two.service", "LoadState")["LoadState"] == "bad-setting"


# ----------------------------------------------------------------------------- drop-ins, specifiers, quoting ---

def test_drop_ins_apply_in_lexical_order_later_wins_and_an_empty_assignment_resets(fake):
    fake.write_unit("srv@.service", unit(python(REPORT, "from-template"), "Environment=A=template B=template",
                                         "CPUAffinity=0"))
    fake.write_dropin("srv@.service", "10-all.conf", "[Service]\nEnvironment=B=all-instances C=all\n")
    fake.write_dropin("srv@1.service", "20-one.conf", "[Service]\nExecStart=\nExecStart=%s\nCPUAffinity=\n"
                      "CPUAffinity=1\nEnvironment=C=one\n" % (python(REPORT, "from-drop-in") + " %i"))
    fake.write_dropin("srv@1.service", "05-early.conf", "[Service]\nEnvironment=C=early D=early\n")
    fake.write_dropin("srv@1.service", "notes.txt", "[Service]\nEnvironment=IGNORED=yes\n")
    fake.systemctl("start", "srv@0.service", "srv@1.service", check=True)
    fake.wait("srv@0.service", ended)
    fake.wait("srv@1.service", ended)
    zero, one = report_of(fake, "srv@0.service"), report_of(fake, "srv@1.service")
    assert zero["argv"] == ["from-template"] and zero["cpus"] == [0]
    assert [zero["env"].get(name) for name in "ABCD"] == ["template", "all-instances", "all", None]
    assert one["argv"] == ["from-drop-in", "1"] and one["cpus"] == [1]
    # 05-early, then 10-all (the template's), then 20-one: lexical order across both directories
    assert [one["env"].get(name) for name in "ABCD"] == ["template", "all-instances", "one", "early"]
    assert "IGNORED" not in one["env"]
    assert one["env"]["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"  # systemd's, not the test's
    assert "FAKE_SYSTEMD_STATE" not in one["env"] and one["cwd"] == "/"
    assert one["env"]["INVOCATION_ID"] == fake.show("srv@1.service", "InvocationID")["InvocationID"]
    dropins = fake.show("srv@1.service", "DropInPaths")["DropInPaths"].split()
    assert [os.path.basename(path) for path in dropins] == ["05-early.conf", "10-all.conf", "20-one.conf"]


def test_the_runtime_drop_in_under_the_root_applies_too(fake):
    fake.write_unit("srv@.service", unit(python(REPORT), "CPUAffinity=1", "Environment=MODE=bound"))
    folder = os.path.join(fake.runtime_dir, "srv@0.service.d")
    os.makedirs(folder)
    with open(os.path.join(folder, unit_text.BASELINE_DROP_IN), "w") as handle:
        handle.write(unit_text.BASELINE_DROP_IN_TEXT)
    fake.systemctl("start", "srv@0.service", check=True)
    fake.wait("srv@0.service", ended)
    seen = report_of(fake, "srv@0.service")
    assert seen["cpus"] == [0, 1]  # CPUAffinity= reset: every online CPU, as PID 1 has
    assert seen["env"][tokens.BASELINE_ENV] == "unbound" and seen["env"]["MODE"] == "bound"
    assert fake.show("srv@0.service", "NUMAPolicy", "NUMAMask") == {"NUMAPolicy": "default", "NUMAMask": ""}


HOSTILE = ["plain", "two words", "%i %n %%", "$HOME and ${HOME}", "$$", 'quote " and \\ backslash', "tab\there",
           "semi;colon", "'single'", "-dash", "", "\u00e9t\u00e9"]


def test_arguments_and_environment_written_by_unit_text_reach_the_process_exactly(fake):
    env = {"SPACES": "two  spaces", "QUOTES": 'say "hi" \\ bye', "PERCENT": "50% %i", "DOLLAR": "$HOME ${X}",
           "TAB": "a\tb", "EMPTY": ""}
    fake.write_unit("q@.service", unit(python(REPORT, *HOSTILE), "Environment=HOME=/should/not/expand",
                                       *["Environment=" + line for line in unit_text.environment_lines(env)]))
    fake.systemctl("start", "q@7.service", check=True)
    fake.wait("q@7.service", ended)
    seen = report_of(fake, "q@7.service")
    assert seen["argv"] == HOSTILE
    assert {name: seen["env"].get(name) for name in env} == env


def test_specifiers_quotes_escapes_and_environment_expansion_as_systemd_reads_them(fake):
    line = ('%s -c "import json,sys; print(json.dumps(sys.argv[1:]), flush=True)" %%i %%n %%p %%N %%%% "a b" '
            'x"y z"w \\x41\\t\\101 $$WORD ${WORD} $WORD ${UNSET} $UNSET ${UNSET:-fallback} ${WORD:+set} '
            'pre${WORD}post "$WORD" \\;' % PYTHON)
    fake.write_unit("spec@.service", unit(line, 'Environment="WORD=one two" "SPACED=a  b"'))
    fake.systemctl("start", "spec@i-7.service", check=True)
    fake.wait("spec@i-7.service", ended)
    printed = [entry for entry in fake.journal("spec@i-7.service") if entry.startswith("[")][0]
    assert json.loads(printed) == [
        "i-7", "spec@i-7.service", "spec", "spec@i-7", "%", "a b", "xy zw", "A\tA", "$WORD", "one two",
        "one", "two",  # $WORD alone is split at whitespace; ${WORD} is one word
        "", "fallback", "set", "preone twopost", "one", "two", ";"]


def test_at_prefix_names_argv0_and_dash_prefix_ignores_a_failure(fake):
    fake.write_unit("at.service", unit("@/bin/sleep custom-name 600"))
    fake.systemctl("start", "at.service", check=True)
    assert cmdline(fake.show("at.service", "MainPID")["MainPID"]) == [b"custom-name", b"600"]
    fake.write_unit("dash.service", unit("-%s -c \"import sys; sys.exit(3)\"" % PYTHON))
    fake.systemctl("start", "dash.service", check=True)
    props = fake.wait("dash.service", ended)
    assert (props["ActiveState"], props["Result"], props["ExecMainStatus"]) == ("inactive", "success", "3")


def test_unit_file_verbs_enable_disable_mask_list_and_cat(fake):
    fake.write_unit("web@.service", unit("/bin/sleep 600"))
    fake.write_unit("plain.service", unit("/bin/sleep 600", install=False))
    state = fake.systemctl("is-enabled", "web@0.service")
    assert (state.returncode, state.stdout) == (1, "disabled\n")
    assert fake.systemctl("is-enabled", "plain.service").stdout == "static\n"
    missing = fake.systemctl("is-enabled", "nothere.service")
    assert missing.returncode == 1 and "Failed to get unit file state for nothere.service" in missing.stderr
    enabled = fake.systemctl("enable", "--now", "web@0.service")
    assert enabled.returncode == 0 and enabled.stderr.startswith("Created symlink ")
    assert fake.show("web@0.service", "UnitFileState", "ActiveState") == {"UnitFileState": "enabled",
                                                                          "ActiveState": "active"}
    assert fake.systemctl("enable", "web@0.service").stderr == ""  # already: nothing to say
    listed = fake.systemctl("list-unit-files", "web@*").stdout.splitlines()
    assert listed[0].split() == ["UNIT", "FILE", "STATE", "VENDOR", "PRESET"]
    assert listed[1].split() == ["web@.service", "indirect", "enabled"] and listed[-1] == "1 unit files listed."
    assert fake.systemctl("list-unit-files", "nothere*").returncode == 1
    assert fake.systemctl("disable", "--now", "web@0.service").returncode == 0
    assert fake.show("web@0.service", "UnitFileState", "ActiveState") == {"UnitFileState": "disabled",
                                                                          "ActiveState": "inactive"}
    fake.systemctl("mask", "web@1.service", check=True)
    masked = fake.systemctl("start", "web@1.service")
    assert (masked.returncode, masked.stderr) == (1, "Failed to start web@1.service: Unit web@1.service is "
                                                     "masked.\n")
    fake.systemctl("unmask", "web@1.service", check=True)
    assert fake.systemctl("start", "web@1.service").returncode == 0
    status = fake.systemctl("status", "web@1.service")
    assert status.returncode == 0 and "Active: active (running)" in status.stdout
    assert fake.systemctl("status", "web@0.service").returncode == 3
    assert fake.systemctl("status", "nothere.service").returncode == 4
    cat = fake.systemctl("cat", "web@1.service").stdout
    assert cat.startswith("# %s/web@.service\n[Unit]" % fake.unit_dir)


# ---------------------------------------------------------------------------------------- placement -------

@pytest.mark.parametrize("settings, expected", [
    (["CPUAffinity=0"], "0"),
    (["CPUAffinity=1"], "1"),
    (["CPUAffinity=0-1"], "0-1"),
    (["CPUAffinity=0", "CPUAffinity=1"], "0-1"),  # assignments merge
    (["CPUAffinity=0", "CPUAffinity=", "CPUAffinity=1"], "1"),  # the empty one resets
])
def test_cpu_affinity_is_applied_to_the_main_process(fake, settings, expected):
    fake.write_unit("pin@.service", unit("/bin/sleep 600", *settings))
    fake.systemctl("start", "pin@0.service", check=True)
    props = fake.show("pin@0.service", "MainPID", "CPUAffinity")
    assert cpus_allowed(props["MainPID"]) == expected
    assert props["CPUAffinity"] == expected.replace("0-1", "0-1")


def test_numa_policy_is_applied_and_a_mask_the_kernel_refuses_fails_the_start(fake):
    fake.write_unit("mem@.service", unit(python("import time; x = bytearray(1 << 22); time.sleep(600)"),
                                         "NUMAPolicy=bind", "NUMAMask=0"))
    fake.systemctl("start", "mem@0.service", check=True)
    pid = fake.show("mem@0.service", "MainPID")["MainPID"]
    with open("/proc/%s/numa_maps" % pid) as handle:
        assert "bind:0" in handle.read()
    fake.write_unit("bad@.service", unit("/bin/sleep 600", "NUMAPolicy=bind", "NUMAMask=63"))
    refused = fake.systemctl("start", "bad@0.service")
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        "Job for bad@0.service failed because the control process exited with error code.")
    props = fake.show("bad@0.service", "ActiveState", "Result", "ExecMainStatus")
    assert props == {"ActiveState": "failed", "Result": "exit-code", "ExecMainStatus": "242"}
    assert "bad@0.service: Main process exited, code=exited, status=242/NUMA_POLICY" in fake.journal("bad@0.service")


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="no %s for user nobody" % SYSTEM_PYTHON)
def test_user_group_and_the_service_directories(fake):
    settings = ["User=nobody", "Group=nogroup", "StateDirectory=%p-%i", "RuntimeDirectory=%p/run",
                "Environment=STAY=600"]
    # this venv's interpreter may sit where nobody cannot reach it: as under systemd, that start would fail (203)
    fake.write_unit("acct@.service", unit(unit_text.exec_line([SYSTEM_PYTHON, "-c", REPORT]), *settings))
    fake.systemctl("start", "acct@3.service", check=True)
    pid = fake.show("acct@3.service", "MainPID")["MainPID"]
    # Its report, not just the "Started" line, which the fake writes before the process has printed anything.
    fake.wait("acct@3.service", lambda props: any(line.startswith("{") for line in fake.journal("acct@3.service")))
    seen = report_of(fake, "acct@3.service")
    state_dir, runtime_dir = fake.root + "/var/lib/acct-3", fake.root + "/run/acct/run"
    assert seen["env"]["STATE_DIRECTORY"] == state_dir and seen["env"]["RUNTIME_DIRECTORY"] == runtime_dir
    if os.geteuid() == 0:  # the fake applies User= only as root, where the user exists
        with open("/proc/%s/status" % pid) as handle:
            ids = {line.split(":")[0]: line.split()[1] for line in handle if line.startswith(("Uid", "Gid"))}
        assert ids == {"Uid": "65534", "Gid": "65534"} and seen["env"]["USER"] == "nobody"
        assert os.stat(state_dir).st_uid == 65534
    fake.systemctl("stop", "acct@3.service", check=True)
    assert os.path.isdir(state_dir) and not os.path.exists(runtime_dir)  # RuntimeDirectory= goes at the stop
    fake.write_unit("nouser.service", unit(python(REPORT), "User=no-such-user-here"))
    fake.systemctl("start", "nouser.service", check=True)
    fake.wait("nouser.service", ended)
    assert "nouser.service: fake systemd: User=no-such-user-here is not applied (%s); the service runs as uid %d" % (
        "no such user here" if os.geteuid() == 0 else "the fake does not run as root", os.geteuid()) in fake.journal(
        "nouser.service")


def test_a_setting_the_fake_does_not_emulate_is_said_in_the_journal(fake):
    fake.write_unit("pre.service", unit("/bin/sleep 600", "ExecStartPre=/bin/false", "ProtectSystem=strict"))
    fake.systemctl("start", "pre.service", check=True)
    journal = fake.journal("pre.service")
    assert any(line.endswith(":7: fake systemd does not emulate ExecStartPre=, ignoring.") for line in journal)
    assert not any("ProtectSystem" in line for line in journal)  # sandboxing: ignored, changes nothing here


NOTIFY = ("import os, socket, sys, time; address = os.environ['NOTIFY_SOCKET']; time.sleep(float(sys.argv[1])); "
          "sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
          "sock.sendto(sys.argv[2].replace('|', chr(10)).encode(), chr(0) + address[1:] if address[0] == '@' "
          "else address); "
          "time.sleep(float(sys.argv[3]))")


def test_type_notify_waits_for_ready_and_fails_on_a_timeout_or_an_early_exit(fake):
    fake.write_unit("ready.service", unit(python(NOTIFY, "0.3", "STATUS=model loaded|READY=1", "600"),
                                          kind="notify"))
    began = time.monotonic()
    assert fake.systemctl("start", "ready.service").returncode == 0
    assert time.monotonic() - began >= 0.3
    props = fake.show("ready.service", "ActiveState", "StatusText", "NotifyAccess")
    assert props == {"ActiveState": "active", "StatusText": "model loaded", "NotifyAccess": "main"}
    fake.write_unit("late.service", unit(python(NOTIFY, "600", "READY=1", "0"), "TimeoutStartSec=400ms",
                                         kind="notify"))
    late = fake.systemctl("start", "late.service")
    assert late.returncode == 1 and "Job for late.service failed because a timeout was exceeded." in late.stderr
    assert fake.show("late.service", "ActiveState", "Result") == {"ActiveState": "failed", "Result": "timeout"}
    assert "late.service: start operation timed out. Terminating." in fake.journal("late.service")
    fake.write_unit("quits.service", unit(python("pass"), kind="notify"))
    quits = fake.systemctl("start", "quits.service")
    assert quits.returncode == 1 and "did not take the steps required by its unit configuration" in quits.stderr
    assert fake.show("quits.service", "Result")["Result"] == "protocol"


# --------------------------------------------------------------------------------- failures and restarts ---

def test_an_executable_that_cannot_run_fails_the_start_with_type_exec_only(fake):
    fake.write_unit("gone@.service", unit("/nonexistent/llama-server --port 8080"))
    refused = fake.systemctl("start", "gone@0.service")
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        "Job for gone@0.service failed because the control process exited with error code.",
        "See \"systemctl status gone@0.service\" and \"journalctl -xeu gone@0.service\" for details."]
    props = fake.show("gone@0.service", "ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus")
    assert props == {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "ExecMainCode": "1",
                     "ExecMainStatus": "203"}
    journal = fake.journal("gone@0.service")
    assert ("gone@0.service: Failed to locate executable /nonexistent/llama-server: No such file or directory"
            in journal)
    assert ("gone@0.service: Failed at step EXEC spawning /nonexistent/llama-server: No such file or directory"
            in journal)
    fake.write_unit("simple@.service", unit("/nonexistent/llama-server", kind="simple"))
    assert fake.systemctl("start", "simple@0.service").returncode == 0  # Type=simple: started once forked
    props = fake.wait("simple@0.service", ended)
    assert (props["ActiveState"], props["ExecMainStatus"]) == ("failed", "203")


def test_a_crash_loop_restarts_then_hits_the_start_limit(fake):
    crash = python("import sys; sys.stderr.write('boom: cannot load model\\n'); sys.exit(3)")
    fake.write_unit("crash@.service", unit(crash, "Restart=on-failure", "RestartSec=200ms"))
    began = time.monotonic()
    assert fake.systemctl("start", "crash@0.service").returncode == 0  # it did start
    seen = []
    while True:
        props = fake.show("crash@0.service", "ActiveState", "SubState", "NRestarts", "Result")
        seen.append((props["ActiveState"], props["SubState"], int(props["NRestarts"])))
        if props["ActiveState"] == "failed" or time.monotonic() - began > 15:
            break
        time.sleep(0.03)
    # systemd keeps the first failure as the Result: the crash's, not the start limit's
    assert props == {"ActiveState": "failed", "SubState": "failed", "NRestarts": "5", "Result": "exit-code"}
    assert ("activating", "auto-restart") in [(state, sub) for state, sub, _n in seen]
    counts = [count for _state, _sub, count in seen]
    assert counts == sorted(counts) and len(set(counts)) >= 3  # NRestarts grew while we watched
    journal = fake.journal("crash@0.service")
    assert journal.count("boom: cannot load model") == 5
    assert "crash@0.service: Main process exited, code=exited, status=3/NOTIMPLEMENTED" in journal
    assert journal[-6:] == ["crash@0.service: Failed with result 'exit-code'.",
                            "crash@0.service: Scheduled restart job, restart counter is at 5.",
                            "Stopped crash@0.service - Test 0.",
                            "crash@0.service: Start request repeated too quickly.",
                            "crash@0.service: Failed with result 'exit-code'.",
                            "Failed to start crash@0.service - Test 0."]
    assert time.monotonic() - began < 10
    # the limit holds a manual start too, until reset-failed; systemctl says why by the Result
    refused = fake.systemctl("start", "crash@0.service")
    assert refused.returncode == 1
    assert refused.stderr.startswith("Job for crash@0.service failed because the control process exited with "
                                     "error code.")
    assert fake.journal("crash@0.service")[-3] == "crash@0.service: Start request repeated too quickly."
    assert fake.systemctl("reset-failed", "crash@0.service").returncode == 0
    assert fake.show("crash@0.service", "ActiveState", "NRestarts", "Result") == {
        "ActiveState": "inactive", "NRestarts": "0", "Result": "success"}


def test_the_start_limit_counts_clean_exits_and_manual_starts_too(fake):
    fake.write_unit("quick.service", unit(python("pass"), unit_settings=["StartLimitBurst=3",
                                                                         "StartLimitIntervalSec=1min"]))
    for _ in range(3):
        fake.systemctl("start", "quick.service", check=True)
        fake.wait("quick.service", ended)
    refused = fake.systemctl("start", "quick.service")
    assert refused.returncode == 1 and refused.stderr.splitlines()[0] == (
        "Job for quick.service failed because start of the service was attempted too often.")
    assert "To force a start use \"systemctl reset-failed quick.service\"" in refused.stderr
    assert fake.show("quick.service", "ActiveState", "Result") == {
        "ActiveState": "failed", "Result": "start-limit-hit"}


def test_a_start_during_the_restart_delay_waits_for_the_restart(fake):
    fake.write_unit("flaky.service", unit(python("import sys, time; time.sleep(0.2); sys.exit(1)"),
                                          "Restart=on-failure", "RestartSec=3s"))
    fake.systemctl("start", "flaky.service", check=True)
    fake.wait("flaky.service", lambda props: props["SubState"] == "auto-restart")
    began = time.monotonic()
    assert fake.systemctl("start", "flaky.service").returncode == 0
    # It waited for RestartSec=, as the start job does. A loaded CI machine can take a second or two to see the
    # auto-restart state and run systemctl: the delay is long enough that the rest of it still shows.
    assert time.monotonic() - began > 0.3
    assert fake.show("flaky.service", "NRestarts")["NRestarts"] == "1"


def test_restart_always_and_a_stop_during_the_restart_delay(fake):
    fake.write_unit("again.service", unit(python("print('once')"), "Restart=always", "RestartSec=1"))
    fake.systemctl("start", "again.service", check=True)
    fake.wait("again.service", lambda props: props["SubState"] == "auto-restart")
    assert fake.systemctl("stop", "again.service").returncode == 0
    props = fake.show("again.service", "ActiveState", "SubState", "Result")
    assert props == {"ActiveState": "inactive", "SubState": "dead", "Result": "success"}
    time.sleep(1.2)
    assert fake.show("again.service", "ActiveState", "NRestarts") == {"ActiveState": "inactive", "NRestarts": "0"}


def test_stop_kills_the_whole_unit_and_escalates_to_sigkill(fake):
    stubborn = ("import os, signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "subprocess.Popen(['/bin/sleep', '600']); "
                "subprocess.Popen(['/bin/sleep', '601'], start_new_session=True); time.sleep(600)")
    fake.write_unit("stubborn.service", unit(python(stubborn), "TimeoutStopSec=300ms"))
    fake.systemctl("start", "stubborn.service", check=True)
    main = fake.show("stubborn.service", "MainPID")["MainPID"]
    time.sleep(0.3)
    children = [pid for pid in os.listdir("/proc") if pid.isdigit() and _ppid(pid) == int(main)]
    assert len(children) == 2
    began = time.monotonic()
    assert fake.systemctl("stop", "stubborn.service").returncode == 0
    assert 0.25 < time.monotonic() - began < 5
    props = fake.show("stubborn.service", "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    assert props == {"ActiveState": "failed", "Result": "timeout", "ExecMainCode": "2", "ExecMainStatus": "9"}
    assert all(gone(pid) for pid in [main] + children)
    assert "stubborn.service: State 'stop-sigterm' timed out. Killing." in fake.journal("stubborn.service")


def test_leftover_processes_die_with_the_main_process(fake):
    fake.write_unit("fork.service", unit(python(
        "import subprocess; p = subprocess.Popen(['/bin/sleep', '600'], start_new_session=True); print(p.pid)")))
    fake.systemctl("start", "fork.service", check=True)
    fake.wait("fork.service", ended)
    child = [line for line in fake.journal("fork.service") if line.isdigit()][0]
    assert gone(child)


def test_kill_sends_a_signal_and_restart_on_failure_restarts(fake):
    fake.write_unit("k.service", unit("/bin/sleep 600", "Restart=on-failure", "RestartSec=100ms"))
    fake.systemctl("start", "k.service", check=True)
    first = fake.show("k.service", "MainPID")["MainPID"]
    assert fake.systemctl("kill", "-s", "SIGKILL", "k.service").returncode == 0
    props = fake.wait("k.service", lambda props: props["NRestarts"] == "1" and active(props))
    assert props["MainPID"] != first
    assert "k.service: Main process exited, code=killed, status=9/KILL" in fake.journal("k.service")
    assert fake.systemctl("kill", "k.service").returncode == 0  # SIGTERM is a clean end: no restart
    props = fake.wait("k.service", ended)
    assert (props["ActiveState"], props["Result"], props["NRestarts"]) == ("inactive", "success", "1")


def _ppid(pid):
    try:
        with open("/proc/%s/stat" % pid) as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


# ----------------------------------------------------------------------------------------- journal --------

def test_journalctl_lines_since_and_formats(fake):
    fake.write_unit("talk.service", unit(python("[print('line', n, flush=True) for n in range(5)]")))
    fake.systemctl("start", "talk.service", check=True)
    fake.wait("talk.service", ended)
    assert fake.journalctl("-u", "talk", "-n", "2", "-o", "cat", "--no-pager") == (
        "line 4\ntalk.service: Deactivated successfully.\n")
    lines = fake.journal("talk.service")
    assert [line for line in lines if line.startswith("line")] == ["line %d" % n for n in range(5)]
    short = fake.journalctl("-u", "talk.service", "-n", "1")
    assert "systemd[1]: talk.service: Deactivated successfully." in short
    process_line = [line for line in fake.journalctl("-u", "talk.service").splitlines() if "line 0" in line][0]
    assert "%s[" % os.path.basename(PYTHON) in process_line
    later = time.time() + 1
    assert fake.journalctl("-u", "talk.service", "--since", "@%f" % later) == "-- No entries --\n"
    assert fake.journalctl("-u", "talk.service", "--since", "@%f" % later, "-q") == ""
    records = [json.loads(line) for line in fake.journalctl("-u", "talk.service", "-o", "json").splitlines()]
    assert {record.get("_SYSTEMD_UNIT") or record.get("UNIT") for record in records} == {"talk.service"}


# ------------------------------------------------------------------------------------- daemon-reload ------

def test_a_changed_unit_needs_a_daemon_reload_to_be_seen(fake):
    path = fake.write_unit("v.service", unit(python(REPORT, "v1"), "Environment=STAY=600"))
    fake.systemctl("start", "v.service", check=True)
    assert fake.show("v.service", "NeedDaemonReload")["NeedDaemonReload"] == "no"
    time.sleep(0.01)
    fake.write_unit("v.service", unit(python(REPORT, "v2"), "Environment=STAY=600"))
    assert fake.show("v.service", "NeedDaemonReload")["NeedDaemonReload"] == "yes"
    restarted = fake.systemctl("restart", "v.service")
    assert restarted.returncode == 0
    assert "changed on disk. Run 'systemctl daemon-reload' to reload units." in restarted.stderr
    assert cmdline(fake.show("v.service", "MainPID")["MainPID"])[-1] == b"v1"  # still the loaded definition
    # a new drop-in is a change too
    fake.write_dropin("v.service", "50-x.conf", "[Service]\nEnvironment=X=1\n")
    assert fake.systemctl("daemon-reload").returncode == 0
    assert fake.show("v.service", "NeedDaemonReload")["NeedDaemonReload"] == "no"
    fake.systemctl("restart", "v.service", check=True)
    assert cmdline(fake.show("v.service", "MainPID")["MainPID"])[-1] == b"v2"
    os.unlink(path)
    fake.systemctl("daemon-reload", check=True)
    assert fake.show("v.service", "LoadState", "ActiveState") == {"LoadState": "not-found", "ActiveState": "active"}
    assert fake.systemctl("restart", "v.service").returncode == 5
    fake.systemctl("stop", "v.service", check=True)


# ------------------------------------------------------------------------------------ failures on cue -----

def test_failures_on_cue_do_nothing_and_the_call_log_keeps_the_order(fake):
    fake.write_unit("llama@.service", unit("/bin/sleep 600"))
    fake.fail_on({"verb": "daemon-reload", "times": 1},
                 {"verb": "restart", "unit": "llama@1.service", "nth": 2, "rc": 1,
                  "stderr": "Job for llama@1.service canceled."})
    failed = fake.systemctl("daemon-reload")
    assert failed.returncode == 1 and "failure on cue" in failed.stderr
    assert fake.systemctl("daemon-reload").returncode == 0
    fake.systemctl("start", "llama@0.service", "llama@1.service", check=True)
    assert fake.systemctl("restart", "llama@1.service").returncode == 0
    pid = fake.show("llama@1.service", "MainPID")["MainPID"]
    refused = fake.systemctl("restart", "llama@1.service")
    assert (refused.returncode, refused.stderr) == (1, "Job for llama@1.service canceled.\n")
    assert fake.show("llama@1.service", "MainPID")["MainPID"] == pid  # nothing was done
    assert fake.systemctl("restart", "llama@0.service").returncode == 0  # another unit: not this rule's
    assert fake.systemctl("restart", "llama@1.service").returncode == 0
    assert fake.show("llama@1.service", "MainPID")["MainPID"] != pid
    assert [call[1:] for call in fake.calls() if call[1] != "show"] == [
        ["daemon-reload"], ["daemon-reload"], ["start", "llama@0.service", "llama@1.service"],
        ["restart", "llama@1.service"], ["restart", "llama@1.service"], ["restart", "llama@0.service"],
        ["restart", "llama@1.service"]]


def test_a_failure_on_cue_can_carry_the_call_out_and_delay_it(fake):
    fake.write_unit("slow.service", unit("/bin/sleep 600"))
    fake.fail_on({"verb": "start", "do": True, "delay": 0.3, "rc": 1, "stderr": "Job timed out."})
    began = time.monotonic()
    slow = fake.systemctl("start", "slow.service")
    assert slow.returncode == 1 and slow.stderr == "Job timed out.\n" and time.monotonic() - began >= 0.3
    assert fake.show("slow.service", "ActiveState")["ActiveState"] == "active"


# ----------------------------------------------------------------------------------- robustness -----------

def test_concurrent_calls_start_each_unit_once(fake):
    fake.write_unit("c@.service", unit("/bin/sleep 600"))
    results = []

    def start(name):
        results.append(fake.systemctl("start", name).returncode)

    threads = [threading.Thread(target=start, args=("c@%d.service" % (index % 3),)) for index in range(9)]
    threads += [threading.Thread(target=lambda: fake.show("c@0.service")) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [0] * 9
    pids = {fake.show("c@%d.service" % index, "MainPID")["MainPID"] for index in range(3)}
    assert len(pids) == 3 and "0" not in pids
    supervisors = {pid for pid, _session, _start in fake.registered()}
    sleepers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_sleep_600(pid)
                and _ppid(pid) in supervisors]  # this test's: other tests may run sleeps beside it
    assert sorted(sleepers) == sorted(pids)


def _is_sleep_600(pid):
    try:
        return cmdline(pid) == [b"/bin/sleep", b"600"] and not gone(pid)
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_stop_all_leaves_no_process_and_no_zombie(tmp_path):
    with FakeSystemd(tmp_path / "state", [tmp_path / "units"]) as fake:
        fake.write_unit("z@.service", unit("/bin/sleep 600", "Restart=always", "RestartSec=100ms"))
        fake.systemctl("start", "z@0.service", "z@1.service", check=True)
        fake.write_unit("crash.service", unit(python("import sys; sys.exit(1)"), "Restart=always",
                                              "RestartSec=50ms"))
        fake.systemctl("start", "crash.service", check=True)
        running = fake.survivors()
        assert len(running) >= 4  # two supervisors, two sleeps, and the crash loop's supervisor
    assert fake.survivors() == []
    zombies = [pid for pid in os.listdir("/proc") if pid.isdigit() and _ppid(pid) == os.getpid() and gone(pid)]
    assert zombies == []


# ------------------------------------------------------------------------------------------ Ansible -------

PLAY = """
- hosts: box
  gather_facts: false
  tasks:
    - name: Reload
      ansible.builtin.systemd_service:
        daemon_reload: true
    - name: Enable and start
      ansible.builtin.systemd_service:
        name: web@0.service
        enabled: true
        state: started
      register: first
    - name: Again
      ansible.builtin.systemd_service:
        name: web@0.service
        enabled: true
        state: started
      register: again
    - name: Restart
      ansible.builtin.systemd_service:
        name: web@0.service
        state: restarted
    - name: Stop and disable
      ansible.builtin.systemd_service:
        name: web@0.service
        state: stopped
        enabled: false
      register: stopped
    - name: Keep what the module said
      ansible.builtin.copy:
        content: "{{ {'first': first, 'again': again, 'stopped': stopped} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


def playbook(fake, tmp_path, text, **extra):
    path = tmp_path / "play.yml"
    path.write_text(text)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"box": dict(
        extra, ansible_connection="local", ansible_python_interpreter=PYTHON)}}}))
    env = fake.env()
    env.update(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", str(inventory), str(path)], cwd=REPO,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=600, check=False)
    return done.returncode, done.stdout


def test_ansible_systemd_service_reloads_enables_starts_restarts_stops_and_disables(fake, tmp_path):
    fake.write_unit("web@.service", unit("/bin/sleep 600"))
    out = tmp_path / "out.json"
    code, output = playbook(fake, tmp_path, PLAY, out=str(out))
    assert code == 0, output
    said = json.loads(out.read_text())
    assert said["first"]["changed"] and said["first"]["enabled"] and said["first"]["state"] == "started"
    assert said["first"]["status"]["LoadState"] == "loaded"
    assert not said["again"]["changed"]
    assert said["stopped"]["changed"] and not said["stopped"]["enabled"]
    assert fake.show("web@0.service", "ActiveState", "UnitFileState") == {"ActiveState": "inactive",
                                                                          "UnitFileState": "disabled"}
    actions = [call[1] for call in fake.calls() if call[1] in ("daemon-reload", "enable", "disable", "start",
                                                               "restart", "stop")]
    # enable's own reload is systemctl's, not a call; the module: reload, enable, start, restart, stop, disable
    assert actions == ["daemon-reload", "enable", "start", "restart", "disable", "stop"]
    journal = fake.journal("web@0.service")
    assert journal.count("Started web@0.service - Test 0.") == 2


def test_ansible_systemd_service_fails_on_a_failed_reload(fake, tmp_path):
    fake.fail_on({"verb": "daemon-reload", "stderr": "Failed to reload daemon: Connection timed out"})
    code, output = playbook(fake, tmp_path, PLAY, out=str(tmp_path / "out.json"))
    assert code != 0 and "failure 1 during daemon-reload: Failed to reload daemon: Connection timed out" in output


# --------------------------------------------------------------------------------------- numa_rollout -----

@pytest.fixture
def deploying(tmp_path, trusted_dir):
    """A fake systemd whose units are in a directory root may trust, as numa_rollout writes only there."""
    yield from fake_systemd_fixture(tmp_path, os.path.join(trusted_dir, "units"))


def _gated(fake, directory, crash_unit_settings, restart_sec="100ms"):
    """gate@0 serving HTTP on a free port from its unit; the deployment that changes that unit to one that crashes
    at once (ready when its port answers)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve = unit(unit_text.exec_line([PYTHON, "-m", "http.server", "--bind", "127.0.0.1", str(port)]),
                 "Restart=on-failure", "RestartSec=100ms")
    template = fake.write_unit("gate@.service", serve)
    os.chmod(template, 0o644)
    record = os.path.join(directory, "gate@0.plan.json")
    with open(record, "w") as handle:
        handle.write("{}\n")
    fake.systemctl("start", "gate@0.service", check=True)
    crash = unit(python("import sys; sys.exit(2)"), "Restart=on-failure", "RestartSec=%s" % restart_sec,
                 unit_settings=crash_unit_settings)
    wanted = Service("gate", {template: crash, record: "{}\n"}, {"gate@0.service": (template, record)},
                     {"gate@0.service": record}, False, frozenset([template]))
    return rollout.Deployment(wanted, (rollout.Instance("gate@0.service", None, port, None),)), template, serve


def _deploy(fake, deployment, directory, tmp_path, ready_seconds):
    with fake.environment():
        host = rollout.Host(systemctl_reader.run_command, sleep=lambda seconds: time.sleep(0.1))
        return rollout.deploy([deployment], rollout.Options(directory, ready_seconds=ready_seconds,
                                                            root=str(tmp_path / "root")), host)


def test_rollout_rolls_back_a_unit_that_crash_loops(deploying, trusted_dir, tmp_path):
    """numa_rollout's core against the fake: a unit crash-looping without end (no start limit) is failed at the
    next look, its unit file goes back, and it restarts on it and answers again."""
    deployment, template, serve = _gated(deploying, trusted_dir, ["StartLimitIntervalSec=0"])
    began = time.monotonic()
    result = _deploy(deploying, deployment, trusted_dir, tmp_path, 30)
    assert time.monotonic() - began < 15, result
    assert result["failed"] and "gate@0.service: it is crash-looping" in result["msg"], result
    assert result["instances"][0]["rolled_back"] == "back on its previous unit and plan, ready", result
    with open(template) as handle:
        assert handle.read() == serve
    props = deploying.show("gate@0.service", "ActiveState", "ExecStart")
    assert props["ActiveState"] == "active" and "http.server" in props["ExecStart"]
    assert [call[1] for call in deploying.calls() if call[1] not in ("show", "reset-failed")] == [
        "start", "daemon-reload", "restart", "daemon-reload", "restart"]


def test_rollout_rolls_back_a_unit_that_hit_its_start_limit(deploying, trusted_dir, tmp_path):
    """A unit at its start limit refuses starts until reset-failed; the rollback's restart resets it first. The limit
    counts the setup's start and the rollout's restart, so the first automatic restart after the crash hits it however
    slowly a loaded machine runs them (systemd's default of 5 in 10 s was missed when the starts took seconds)."""
    deployment, _template, _serve = _gated(deploying, trusted_dir, ["StartLimitBurst=2", "StartLimitIntervalSec=300"],
                                           restart_sec="0")
    result = _deploy(deploying, deployment, trusted_dir, tmp_path, 20)
    assert "gate@0.service: Start request repeated too quickly." in deploying.journal("gate@0.service")
    assert result["failed"] and "gate@0.service: " in result["msg"], result
    assert result["instances"][0]["rolled_back"] == "back on its previous unit and plan, ready", result
    assert deploying.show("gate@0.service", "ActiveState")["ActiveState"] == "active"


def test_the_helper_directory_holds_exactly_two_commands():
    commands = sorted(name for name in os.listdir(HERE) if os.access(os.path.join(HERE, name), os.X_OK)
                      and os.path.isfile(os.path.join(HERE, name)))
    assert commands == ["journalctl", "systemctl"]
    for name in commands:
        with open(os.path.join(HERE, name)) as handle:
            assert handle.readline() == "#!/usr/bin/env python3\n"
