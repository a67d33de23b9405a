"""Drift actions fail closed and stay in their lane: nothing is restarted or migrated unless the state
directory recorded it first, the plan directory is trusted all the way up from /, record names are
canonical and unambiguous, and bad text in a record is a warning, never a traceback."""

import argparse
import errno
import io
import json
import os
import shutil
import tempfile
import types

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import metrics_command
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import drift, exposition, metrics
from ansible_collections.inferops.numa.plugins.module_utils.numa.system import trusted_files

from tests.unit.test_audit import PAGE
from tests.unit.test_metrics import (BIND1, host, machine_root, snapshot_of,  # noqa: F401 (fixtures)
                                     write_json)

TRAPPED = "llama@1.service"  # the host fixture's drifting instance, on_drift restart
REAL_COLLECT = metrics.collect


def restarts(run):
    return [call for call in run.calls if call[:2] == ["systemctl", "restart"]]


@pytest.fixture
def dirs(tmp_path):
    """The textfile and state directories: only their own owner and mode matter, made 0755 when missing."""
    os.chmod(str(tmp_path), 0o755)
    return str(tmp_path / "textfile"), str(tmp_path / "state")


def timer_run(host, dirs, monkeypatch, interval=3600.0, now=None):  # noqa: F811
    """cli_metrics.run as the timer runs it, on the fake machine and its fake systemctl."""
    root, plans, run = host
    monkeypatch.setattr(metrics, "collect", lambda _root, plan_dir, runner: REAL_COLLECT(root, plan_dir, runner,
                                                                                          page_size=PAGE))
    monkeypatch.setattr(metrics_command, "run_command", run)
    if now is not None:
        monkeypatch.setattr(metrics_command, "time", types.SimpleNamespace(time=lambda: now))
    err = io.StringIO()
    args = argparse.Namespace(textfile_dir=dirs[0], stdout=False, json=False, plan_dir=plans, state_dir=dirs[1],
                              drift_interval=interval)
    assert metrics_command.run(args, io.StringIO(), err) == 0
    return err.getvalue()


def textfile(dirs):
    with open(os.path.join(dirs[0], exposition.TEXTFILE_NAME)) as handle:
        return handle.read()


# --- the decision is recorded before the action ---------------------------------------------------


def test_a_state_directory_that_is_a_file_means_no_restart_and_still_a_textfile(host, dirs, monkeypatch):  # noqa: F811
    with open(dirs[1], "w") as handle:  # the state "directory" is a file: every write of the state fails
        handle.write("")
    journal = timer_run(host, dirs, monkeypatch)
    assert restarts(host[2]) == []
    refused = [line for line in journal.splitlines() if "no on_drift action is taken" in line]
    assert len(refused) == 1 and "refusing the state directory %s" % dirs[1] in refused[0]
    assert "inferops_numa_instance_drift{" in textfile(dirs)


def test_a_state_that_cannot_be_recorded_means_no_action_in_one_line(host, tmp_path):  # noqa: F811
    def record(marked):
        raise drift.NumaError("cannot write drift-actions.json in the state directory /x: No space left on device;"
                                " check the disk and that root may write there")

    actions = {}
    lines, changed = drift.drift_actions(snapshot_of(host)["instances"], actions, 0, 1.0, host[2], record=record)
    assert not changed and actions == {} and restarts(host[2]) == []
    assert lines[-1] == ("drift: on_drift restart of %s not taken: it could not be recorded first: cannot write "
                         "drift-actions.json in the state directory /x: No space left on device; check the disk and "
                         "that root may write there" % TRAPPED)


def real_write_failing_for_the_state(monkeypatch):
    """os.write refuses the state file's JSON with ENOSPC, as a full /var would; the textfile still goes."""
    real_write = os.write

    def write(fd, data):
        if bytes(data[:1]) == b"{":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return real_write


def test_a_full_disk_means_no_restart_until_the_state_is_written(host, dirs, monkeypatch):  # noqa: F811
    real_write = real_write_failing_for_the_state(monkeypatch)
    journal = timer_run(host, dirs, monkeypatch, now=10000.0)
    assert restarts(host[2]) == [] and "No space left on device" in journal
    assert "inferops_numa_instance_up{" in textfile(dirs)
    assert not os.path.exists(os.path.join(dirs[1], drift.STATE_NAME))
    assert [name for name in os.listdir(dirs[1]) if name.endswith(".tmp")] == []
    monkeypatch.setattr(os, "write", real_write)  # space again: acted on once, then the interval holds
    timer_run(host, dirs, monkeypatch, now=10001.0)
    timer_run(host, dirs, monkeypatch, now=10002.0)
    assert restarts(host[2]) == [["systemctl", "restart", "--", TRAPPED]]


def test_two_runs_within_the_interval_restart_once_and_count_it(host, dirs, monkeypatch):  # noqa: F811
    timer_run(host, dirs, monkeypatch, now=5000.0)
    journal = timer_run(host, dirs, monkeypatch, now=5000.0 + 3599)
    assert restarts(host[2]) == [["systemctl", "restart", "--", TRAPPED]]
    assert "on_drift restart not taken: the last action was 3599 s ago" in journal
    assert 'inferops_numa_instance_drift_actions_total{action="restart"' in textfile(dirs)
    with open(os.path.join(dirs[1], drift.STATE_NAME)) as handle:
        assert json.load(handle) == {TRAPPED: {"last_seconds": 5000.0, "counts": {"restart": 1}}}
    timer_run(host, dirs, monkeypatch, now=5000.0 + 3601)
    assert len(restarts(host[2])) == 2


def test_the_state_is_written_before_the_restart(host, dirs):  # noqa: F811
    seen = []

    def run(argv):
        if argv[:2] == ["systemctl", "restart"]:
            seen.append(drift.read_actions(dirs[1]))
        return host[2](argv)

    lines, actions = drift.act_on_drift(snapshot_of(host), dirs[1], 3600, 7000.0, run)
    assert seen == [{TRAPPED: {"last_seconds": 7000.0, "counts": {"restart": 1}}}]
    assert actions == seen[0] and lines[-1] == "drift: %s: restarted (on_drift restart)" % TRAPPED


def test_without_a_recorder_nothing_is_taken(host):  # noqa: F811
    lines, changed = drift.drift_actions(snapshot_of(host)["instances"], {}, 0, 1.0, host[2])
    assert not changed and restarts(host[2]) == [] and "could not be recorded first" in lines[-1]


@pytest.mark.parametrize("state", [
    "[1, 2",  # cut short
    json.dumps({TRAPPED: {"last_seconds": "yesterday", "counts": {"restart": 1}}}),
    '{"%s": {"last_seconds": NaN, "counts": {}}}' % TRAPPED,
    json.dumps({TRAPPED: {"last_seconds": 10 ** 400, "counts": {}}}),
    json.dumps({TRAPPED: {"last_seconds": 1.0, "counts": {"restart": -1}}}),
    json.dumps({TRAPPED: {"last_seconds": 1.0, "counts": {"reboot": 1}}}),
    json.dumps({TRAPPED: {"last_seconds": 1.0}}),
    json.dumps({TRAPPED: [1.0]}),
    b'{"\xff": 1}',
])
def test_a_corrupt_state_means_no_action_and_a_warning(host, dirs, monkeypatch, state):  # noqa: F811
    os.makedirs(dirs[1], 0o755)
    with open(os.path.join(dirs[1], drift.STATE_NAME), "wb") as handle:
        handle.write(state if isinstance(state, bytes) else state.encode())
    journal = timer_run(host, dirs, monkeypatch, interval=0)
    assert restarts(host[2]) == []
    warned = [line for line in journal.splitlines() if "no on_drift action is taken" in line]
    assert len(warned) == 1 and drift.STATE_NAME in warned[0] and "remove it" in warned[0]
    assert "drift: %s: PID(s)" % TRAPPED in journal  # the drift is still logged
    assert "inferops_numa_metrics_warnings 1" in textfile(dirs)


@pytest.mark.parametrize("spoil", ["file-group-writable", "file-foreign", "directory-world-writable"])
def test_a_state_root_did_not_write_alone_means_no_action(host, dirs, monkeypatch, spoil):  # noqa: F811
    os.makedirs(dirs[1], 0o755)
    path = os.path.join(dirs[1], drift.STATE_NAME)
    write_json(path, {}, mode=0o600)
    if spoil == "file-group-writable":
        os.chmod(path, 0o620)
    elif spoil == "file-foreign":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(path, 1000, 1000)
    else:
        os.chmod(dirs[1], 0o777)
    journal = timer_run(host, dirs, monkeypatch, interval=0)
    assert restarts(host[2]) == [] and "no on_drift action is taken" in journal


def test_a_look_reads_no_state_and_acts_on_nothing(host, dirs, monkeypatch):  # noqa: F811
    root, plans, run = host
    monkeypatch.setattr(metrics, "collect", lambda _root, plan_dir, runner: REAL_COLLECT(root, plan_dir, runner,
                                                                                          page_size=PAGE))
    monkeypatch.setattr(metrics_command, "run_command", run)
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(textfile_dir=dirs[0], stdout=True, json=False, plan_dir=plans, state_dir=dirs[1],
                              drift_interval=0.0)
    assert metrics_command.run(args, out, err) == 0
    assert restarts(run) == [] and not os.path.exists(dirs[1]) and "inferops_numa_instance_drift{" in out.getvalue()


# --- the plan directory is trusted all the way up --------------------------------------------------


def units(snapshot):
    return [entry["unit"] for entry in snapshot["instances"]]


def test_the_fixtures_plan_directory_is_trusted(host):  # noqa: F811
    assert units(snapshot_of(host)) == ["down@0.service", "llama@0.service", "llama@1.service"]


def test_a_plan_directory_others_may_write_gives_no_records(host):  # noqa: F811
    os.chmod(host[1], 0o777)
    snap = snapshot_of(host)
    assert units(snap) == []
    assert len(snap["warnings"]) == 1 and "refusing the plan directory %s" % host[1] in snap["warnings"][0]
    assert "(mode 0777)" in snap["warnings"][0] and "chmod go-w" in snap["warnings"][0]


@pytest.mark.parametrize("spoil", ["owner", "group-writable", "sticky-world-writable"])
def test_a_directory_above_it_that_others_control_gives_no_records(host, spoil):  # noqa: F811
    above = os.path.dirname(host[1])
    if spoil == "owner":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(above, 1000, 1000)  # the user could rename the plan directory and put theirs in its place
    elif spoil == "group-writable":
        os.chmod(above, 0o775)
    else:
        os.chmod(above, 0o1777)
    snap = snapshot_of(host)
    assert units(snap) == [] and len(snap["warnings"]) == 1
    warning = snap["warnings"][0]
    assert "refusing the plan directory %s: %s above it" % (host[1], above) in warning
    assert ("chown root %s" % above if spoil == "owner" else "chmod go-w %s" % above) in warning
    assert "\n" not in warning


def test_a_plan_directory_under_tmp_is_refused(host):  # noqa: F811
    # Under /tmp itself: tmp_path may be elsewhere (tests/conftest.py puts it in RAM when it can).
    scratch = tempfile.mkdtemp(prefix="inferops-numa-test-", dir="/tmp")
    try:
        plans = os.path.join(scratch, "plans")
        os.mkdir(plans, 0o755)
        os.chmod(scratch, 0o755)
        write_json(os.path.join(plans, "llama@1.plan.json"), BIND1)
        snap = metrics.collect(host[0], plans, host[2], page_size=PAGE)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert units(snap) == [] and "refusing the plan directory" in snap["warnings"][0]
    assert "/tmp above it (mode 1777)" in snap["warnings"][0]


def test_a_missing_plan_directory_is_no_records_and_no_warning_wherever_it_is(host, tmp_path):  # noqa: F811
    for missing in (str(tmp_path / "none" / "plans"), os.path.join(host[1], "none")):
        snap = metrics.collect(host[0], missing, host[2], page_size=PAGE)
        assert units(snap) == [] and [w for w in snap["warnings"] if "plan" in w] == []


def test_a_linked_plan_directory_is_refused(host):  # noqa: F811
    link = host[1] + "-link"
    os.symlink(host[1], link)
    snap = metrics.collect(host[0], link, host[2], page_size=PAGE)
    assert units(snap) == [] and "symbolic link" in snap["warnings"][0]


def test_records_are_read_through_the_directory_checked(host, monkeypatch):  # noqa: F811
    """Once the plan directory is checked, its name is not used again: swapping it then changes nothing."""
    real_open = trusted_files.open_plan_directory

    def open_then_swap(path):
        fd = real_open(path)
        os.rename(host[1], host[1] + "-checked")  # someone swaps the path between the check and the use
        os.mkdir(host[1], 0o755)
        write_json(os.path.join(host[1], "other@0.plan.json"), BIND1)
        write_json(os.path.join(host[1], "llama@1.plan.json"), dict(BIND1, mem_nodes=[0]))
        return fd

    monkeypatch.setattr(trusted_files, "open_plan_directory", open_then_swap)
    snap = snapshot_of(host)
    assert units(snap) == ["down@0.service", "llama@0.service", "llama@1.service"], snap["warnings"]
    assert snap["instances"][2]["mem_nodes"] == [1]


# --- record names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["other@01.plan.json", "other@00.plan.json", "-llama@0.plan.json",
                                  "ll:ama@0.plan.json", "llama@100000.plan.json", "ll ama@0.plan.json",
                                  "llama.plan.json", b"ll\xffama@0.plan.json",
                                  "%s@0.plan.json" % ("x" * 201)])
def test_a_record_not_named_as_the_role_names_it_is_refused(host, name):  # noqa: F811
    target = os.path.join(os.fsencode(host[1]), name if isinstance(name, bytes) else os.fsencode(name))
    write_json(target, BIND1)
    snap = snapshot_of(host)
    assert units(snap) == ["down@0.service", "llama@0.service", "llama@1.service"]
    assert len(snap["warnings"]) == 1 and "ignoring the plan record" in snap["warnings"][0]
    assert "without leading zeros" in snap["warnings"][0] and snap["warnings"][0].isascii()
    assert "\n" not in snap["warnings"][0]


def test_a_name_only_like_a_record_is_not_read(host):  # noqa: F811
    write_json(os.path.join(host[1], "llama@2.plan.json\n"), BIND1)  # the old pattern's "$" took it as llama@2
    snap = snapshot_of(host)
    assert units(snap) == ["down@0.service", "llama@0.service", "llama@1.service"] and snap["warnings"] == []


def test_two_records_for_one_unit_are_both_refused_and_nothing_restarts(host, dirs, monkeypatch):  # noqa: F811
    write_json(os.path.join(host[1], "llama@01.plan.json"), dict(BIND1, mem_nodes=[0]))
    journal = timer_run(host, dirs, monkeypatch, interval=0)
    assert restarts(host[2]) == []
    assert "they all name unit 'llama@1.service'" in journal
    assert "'llama@01.plan.json', 'llama@1.plan.json'" in journal
    assert TRAPPED not in textfile(dirs)


# --- bad text is a warning ------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("mem_nodes", 1), ("mem_nodes", "1"), ("mem_nodes", [True]), ("mem_nodes", ["1"]), ("mem_nodes", [10 ** 30]),
    ("mem_nodes", [-1]), ("mem_nodes", {"1": 1}), ("cpulist", 7), ("cpulist", ["0-3"]), ("cpulist", "0-99999999"),
    ("cpulist", "0," * 40000), ("cpus", "0-3"), ("cpus", [0.5]), ("policy", ["bind"]), ("policy", 1),
    ("policy", "bind\ninferops_numa_fake 1"), ("policy", "\udcff"), ("policy", "b" * 100),
])
def test_a_record_field_of_the_wrong_type_is_a_warning(host, dirs, monkeypatch, field, value):  # noqa: F811
    write_json(os.path.join(host[1], "llama@1.plan.json"), dict(BIND1, **{field: value}))
    journal = timer_run(host, dirs, monkeypatch, interval=0)
    assert restarts(host[2]) == []
    warned = [line for line in journal.splitlines() if "llama@1.plan.json" in line]
    assert len(warned) == 1 and "deploy the service again" in warned[0]
    text = textfile(dirs)
    assert TRAPPED not in text and "inferops_numa_fake" not in text
    assert 'unit="llama@0.service"' in text


@pytest.mark.parametrize("content", [b'{"policy": "bi\xffnd", "mem_nodes": [1]}', b"\xff\xfe{}",
                                     b'{"policy": "\\udcff", "mem_nodes": [1]}'])
def test_a_record_that_is_not_utf8_is_a_warning(host, dirs, monkeypatch, content):  # noqa: F811
    with open(os.path.join(host[1], "llama@1.plan.json"), "wb") as handle:
        handle.write(content)
    journal = timer_run(host, dirs, monkeypatch, interval=0)
    assert restarts(host[2]) == [] and "llama@1.plan.json" in journal
    assert 'unit="llama@0.service"' in textfile(dirs)


@pytest.mark.parametrize("settings", [{"min_local_percent": "99"}, {"min_local_percent": 10 ** 400},
                                      {"on_drift": ["restart"]}, {"pages": {"all": 1}}, {"audit": "yes"}])
def test_audit_settings_of_the_wrong_type_are_a_warning(host, dirs, monkeypatch, settings):  # noqa: F811
    write_json(os.path.join(host[1], "llama.audit.json"), dict({"on_drift": "restart"}, **settings))
    journal = timer_run(host, dirs, monkeypatch, interval=0)
    assert restarts(host[2]) == [] and "llama.audit.json" in journal
    assert TRAPPED not in textfile(dirs) and "llama@0.service" not in textfile(dirs)
