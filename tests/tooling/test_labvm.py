"""lab/labvm.py: QEMU command lines, image keys and pidfile safety (no VM booted)."""
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "labvm.py"
_spec = importlib.util.spec_from_file_location("labvm", str(SCRIPT))
labvm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(labvm)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFEROPS_NUMA_CACHE", str(tmp_path))
    return tmp_path


def _option_values(argv, flag):
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_two_node_machine_has_slit_and_display_on_node1_expander(tmp_path):
    argv = labvm.qemu_argv(tmp_path / "img", tmp_path / "run", numa=2, port=2222)
    assert argv[0] == "qemu-system-x86_64"
    assert "q35,accel=tcg" in argv and "4,sockets=2,cores=2,threads=1" in argv
    assert _option_values(argv, "-numa") == [
        "node,nodeid=0,cpus=0-1,memdev=m0", "node,nodeid=1,cpus=2-3,memdev=m1",
        "dist,src=0,dst=1,val=21"]
    devices = _option_values(argv, "-device")
    assert "pxb-pcie,id=pxb1,bus_nr=128,numa_node=1,bus=pcie.0" in devices
    assert "bochs-display,bus=rp1" in devices
    assert _option_values(argv, "-vga") == ["none"]
    assert "user,id=n0,hostfwd=tcp:127.0.0.1:2222-:22" in _option_values(argv, "-netdev")


def test_one_node_machine_has_no_numa_and_display_on_root_complex(tmp_path):
    argv = labvm.qemu_argv(tmp_path / "img", tmp_path / "run", numa=1, port=2222)
    assert "-numa" not in argv
    assert not any(d.startswith("pxb-pcie") for d in _option_values(argv, "-device"))
    assert "bochs-display,bus=pcie.0" in _option_values(argv, "-device")
    assert _option_values(argv, "-m") == ["2G"]


def test_other_node_counts_are_refused(tmp_path):
    with pytest.raises(labvm.LabError, match="1 or 2"):
        labvm.qemu_argv(tmp_path, tmp_path, numa=4, port=2222)


def test_image_key_follows_the_recipe(monkeypatch):
    before = labvm.recipe_hash()
    assert before == labvm.recipe_hash()
    monkeypatch.setattr(labvm, "PACKAGES", labvm.PACKAGES + ["numactl"])
    assert labvm.recipe_hash() != before


def test_vm_names_cannot_escape_the_run_dir(cache):
    assert labvm.state_dir("molecule-default") == cache / "run" / "molecule-default"
    for bad in ("../etc", "a/b", "", "-x"):
        with pytest.raises(labvm.LabError, match="invalid VM name"):
            labvm.state_dir(bad)


def test_each_checkout_boots_its_own_molecule_guest(cache, tmp_path):
    (tmp_path / "ci").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "work")
    ci, work = (labvm.molecule_vm_name("default", str(tmp_path / name)) for name in ("ci", "work"))
    assert ci != work and ci.startswith("molecule-default-")
    assert labvm.molecule_vm_name("default", str(tmp_path / "link")) == work  # the checkout, however reached
    assert labvm.state_dir(ci).parent == cache / "run"


def _fake_qemu(state: Path) -> subprocess.Popen:
    """A process whose argv looks like our QEMU: argv[0] qemu-system-*, a state path."""
    code = "import time; time.sleep(60)"
    return subprocess.Popen(["bash", "-c", 'exec -a qemu-system-x86_64 "$0" -c "$1" "$2"',
                             sys.executable, code, str(state / "overlay.qcow2")])


def _write_state(state: Path, pid: int) -> None:
    state.mkdir(parents=True)
    (state / "qemu.pid").write_text("%d\n" % pid)
    (state / "instance.json").write_text(json.dumps({"port": 1, "numa": 2}))


def _wait_for_argv0(proc: subprocess.Popen) -> None:
    # Until bash has exec'd, the cmdline is bash's own (its -c script mentions qemu too).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        argv0 = Path("/proc/%d/cmdline" % proc.pid).read_bytes().split(b"\0")[0]
        if argv0 == b"qemu-system-x86_64":
            return
        time.sleep(0.05)
    raise AssertionError("the fake QEMU never exec'd")


def test_down_stops_the_pidfile_qemu_and_removes_state(cache):
    state = labvm.state_dir("vm1")
    proc = _fake_qemu(state)
    try:
        _wait_for_argv0(proc)
        _write_state(state, proc.pid)
        assert labvm.running_pid("vm1") == proc.pid
        assert labvm.status()[0]["running"] is True
        assert labvm.down("vm1", timeout=10) is True
        assert proc.wait(timeout=10) == -15
        assert not state.exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_down_never_kills_a_pid_that_is_not_this_vms_qemu(cache):
    other = labvm.state_dir("vm10")
    proc = _fake_qemu(other)
    try:
        _wait_for_argv0(proc)
        # vm1's stale pidfile names vm10's QEMU: a prefix of the path must not match.
        _write_state(labvm.state_dir("vm1"), proc.pid)
        assert labvm.running_pid("vm1") is None
        assert labvm.down("vm1") is False
        assert proc.poll() is None
        assert not labvm.state_dir("vm1").exists()
    finally:
        proc.kill()
        proc.wait()


def test_instance_of_a_stopped_vm_names_the_fix(cache):
    with pytest.raises(labvm.LabError, match="labvm.py up --name gone"):
        labvm.instance("gone")


class _Proc:
    def __init__(self, stdout):
        self.stdout, self.returncode = stdout, 0


def test_calibration_scales_budgets_by_the_slower_of_its_two_timings(monkeypatch):
    reference = labvm.REFERENCE_CALIBRATION
    slow_start = "%.4f %.4f" % (3 * reference["python_start_s"], reference["cpu_loop_s"])
    monkeypatch.setattr(labvm, "run_ssh", lambda ref, command, timeout, check=True: _Proc(slow_start))
    calibration = labvm.calibrate({"instance": "vm1"})
    assert calibration["factor"] == 3.0
    info = {"instance": "vm1", "calibration": calibration}
    assert labvm.budget(info, 20) == labvm.BUDGET_MARGIN * 20 * 3.0


def test_a_fast_guest_keeps_the_reference_budget(monkeypatch):
    fast = "0.0100 0.0100"
    monkeypatch.setattr(labvm, "run_ssh", lambda ref, command, timeout, check=True: _Proc(fast))
    info = {"instance": "vm1", "calibration": labvm.calibrate({"instance": "vm1"})}
    assert labvm.budget(info, 20) == labvm.BUDGET_MARGIN * 20


def test_a_calibration_that_prints_garbage_names_the_fix(monkeypatch):
    monkeypatch.setattr(labvm, "run_ssh", lambda ref, command, timeout, check=True: _Proc("Traceback ..."))
    with pytest.raises(labvm.LabError, match="not two durations"):
        labvm.calibrate({"instance": "vm1"})


def test_the_calibration_workload_runs_and_prints_two_durations():
    out = subprocess.run([sys.executable, "-I", "-c", labvm.CALIBRATION_SCRIPT], capture_output=True,
                         text=True, check=True, timeout=120).stdout.split()
    assert len(out) == 2 and all(float(word) > 0 for word in out)


def test_relayout_to_the_same_topology_keeps_the_running_guest(cache, monkeypatch):
    info = {"instance": "vm1", "numa": 2}
    monkeypatch.setattr(labvm, "instance", lambda name: info)
    monkeypatch.setattr(labvm, "_power_off", lambda *args: pytest.fail("must not power off"))
    assert labvm.relayout("vm1", 2) is info


def test_a_long_step_says_every_period_what_it_does_and_what_the_console_shows():
    import io
    log = io.StringIO()
    with labvm.progress("booting vm1 (TCG), waiting for SSH on port 2222", log,
                        lambda: "console: [  3.1] systemd[1]: Reached target basic.target", every=0.05):
        time.sleep(0.28)
    lines = log.getvalue().splitlines()
    assert len(lines) >= 3
    assert all(line.startswith("labvm: booting vm1 (TCG), waiting for SSH on port 2222: ") and
               line.endswith(" s so far; console: [  3.1] systemd[1]: Reached target basic.target") for line in lines)
    time.sleep(0.1)
    assert log.getvalue().splitlines() == lines  # silent once the step is over


def test_the_console_line_is_the_serial_logs_last_one_cut_short(cache):
    state = labvm.state_dir("vm1")
    state.mkdir(parents=True)
    assert labvm.serial_last_line("vm1") == ""
    (state / "serial.log").write_text("[    1.0] Linux version 6.1\n[    9.9] %s\n\n" % ("x" * 200))
    line = labvm.serial_last_line("vm1")
    assert line.startswith("console: [    9.9] xxx") and len(line) == labvm.PROGRESS_DETAIL and line.endswith("...")


def test_an_image_build_step_says_what_it_runs(monkeypatch):
    import io
    log = io.StringIO()
    monkeypatch.setattr(labvm, "PROGRESS_SECONDS", 0.05)
    labvm._run([sys.executable, "-c", "import time; time.sleep(0.2)"], "mmdebstrap (Debian bookworm)", log)
    assert "labvm: building the lab image: mmdebstrap (Debian bookworm): " in log.getvalue()


def test_the_guest_has_a_monitor_socket_in_its_state_dir(tmp_path):
    argv = labvm.qemu_argv(tmp_path / "img", tmp_path / "run", numa=2, port=2222)
    assert _option_values(argv, "-monitor") == ["unix:%s,server=on,wait=off" % (tmp_path / "run" / "monitor.sock")]


def test_console_watch_counts_silence_from_the_last_growth(tmp_path):
    log = tmp_path / "serial.log"
    log.write_text("boot\n")
    now = [100.0]
    watch = labvm.ConsoleWatch(log, clock=lambda: now[0])
    now[0] = 130.0
    assert watch.silent_for() == 30.0
    log.write_text("boot\nmore\n")
    assert watch.silent_for() == 0.0
    now[0] = 400.0
    assert watch.silent_for() == 270.0


def _monitor(path, received):
    import socket
    import threading
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"QEMU 7.2.0 monitor - type 'help' for more information\n(qemu) ")
            received.append(conn.recv(100))
        server.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_hung_boot_is_reset_through_the_monitor_and_the_wait_goes_on(cache, monkeypatch):
    state = labvm.state_dir("vm1")
    state.mkdir(parents=True)
    (state / "serial.log").write_text("[   28.5] sched_clock: Marking stable\n")
    received = []
    thread = _monitor(state / "monitor.sock", received)
    answers = iter([1, 0])

    def ssh(argv, **kwargs):
        code = next(answers)
        return subprocess.CompletedProcess(argv, code, "new-boot\n" if code == 0 else "", "")
    monkeypatch.setattr(labvm, "running_pid", lambda name: 4242)
    monkeypatch.setattr(labvm.subprocess, "run", ssh)
    monkeypatch.setattr(labvm.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(labvm, "CONSOLE_STALL_SECONDS", -1.0)
    said = []
    log = type("Log", (), {"write": lambda self, text: said.append(text), "flush": lambda self: None})()
    info = {"instance": "vm1", "address": "127.0.0.1", "port": 2222, "user": "root", "identity_file": "k"}
    assert labvm.wait_for_ssh(info, timeout=60, not_boot_id="old", log=log) == "new-boot"
    thread.join(5)
    assert received == [b"system_reset\n"]
    text = "".join(said)
    assert "the boot hung (console: [   28.5] sched_clock: Marking stable); resetting the guest (1 of 2)" in text


def test_without_a_monitor_the_reset_names_the_fix(cache):
    labvm.state_dir("vm2").mkdir(parents=True)
    with pytest.raises(labvm.LabError, match="started without one: run `lab/labvm.py down --name vm2`"):
        labvm.monitor_command("vm2", "system_reset")
