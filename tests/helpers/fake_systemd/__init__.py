"""A fake systemd for tests on a host whose PID 1 is not systemd: ``systemctl`` and ``journalctl`` executables
that start, supervise, restart and stop real processes from real unit files, and fail on cue.

A test puts this directory first on PATH (Ansible's ``get_bin_path`` and ``run_command``, and the package's
``read/systemctl.run_command``, find ``systemctl`` there) with three variables in the environment::

    FAKE_SYSTEMD_STATE      the fake's state: units' runtime state, journals, calls.log, fail.json (required)
    FAKE_SYSTEMD_UNIT_PATH  where unit files are read, colon-separated, highest priority first
                            (the role's ``inference_service_unit_dir``; /etc/systemd/system on a host)
    FAKE_SYSTEMD_ROOT       the root the runtime drop-ins are read under: <root>/run/systemd/system (default /)

and, to be sure no process outlives the test, stops everything at teardown: ``FakeSystemd`` below does it all
(``with FakeSystemd(...) as fake`` or the ``fake_systemd`` fixture). Inside, the test process is made a child
subreaper, so the supervisors the fake detaches come back to it rather than to PID 1 (which does not reap here),
and a thread reaps exactly those: the fake's processes, by the PIDs and sessions it registered, never another
child of the test.

fakesd.py tells what is emulated and how; README.md beside it, what is knowingly not.
"""

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEMCTL = os.path.join(HERE, "systemctl")
JOURNALCTL = os.path.join(HERE, "journalctl")
STATE_ENV, UNIT_PATH_ENV, ROOT_ENV = "FAKE_SYSTEMD_STATE", "FAKE_SYSTEMD_UNIT_PATH", "FAKE_SYSTEMD_ROOT"
TIMEOUT_STOP_ENV = "FAKE_SYSTEMD_TIMEOUT_STOP_SEC"
PR_SET_CHILD_SUBREAPER = 36

_reaping = {"users": 0, "lock": threading.Lock()}


class FakeSystemd:
    """One fake systemd: its state directory, unit directories and runtime root, and the calls tests make."""

    def __init__(self, state, unit_dirs, root=None, timeout_stop=None):
        self.state = os.path.abspath(str(state))
        self.unit_dirs = [os.path.abspath(str(directory)) for directory in unit_dirs]
        self.root = os.path.abspath(str(root)) if root else None
        self.timeout_stop = timeout_stop
        os.makedirs(self.state, exist_ok=True)
        for directory in self.unit_dirs:
            os.makedirs(directory, exist_ok=True)
        self._reaper = None
        self._stop = threading.Event()
        self.reaped = []

    # --- the environment a command runs the fake in ---
    @property
    def unit_dir(self):
        return self.unit_dirs[0]

    @property
    def runtime_dir(self):
        return os.path.join(self.root or "/", "run/systemd/system")

    def env(self, base=None):
        """``base`` (the test's environment by default) with the fake first on PATH, then this interpreter's
        directory (so ``#!/usr/bin/env python3`` finds a Python without a shim's detour), and the fake's
        variables."""
        env = dict(os.environ if base is None else base)
        rest = [part for part in env.get("PATH", os.defpath).split(os.pathsep) if part and part != HERE]
        env["PATH"] = os.pathsep.join([HERE, os.path.dirname(sys.executable)] + rest)
        env[STATE_ENV] = self.state
        env[UNIT_PATH_ENV] = os.pathsep.join(self.unit_dirs)
        if self.root:
            env[ROOT_ENV] = self.root
        if self.timeout_stop is not None:
            env[TIMEOUT_STOP_ENV] = str(self.timeout_stop)
        return env

    @contextlib.contextmanager
    def environment(self):
        """This process's own environment set for the fake (for code that runs ``systemctl`` in-process, such
        as read/systemctl.run_command), put back afterwards."""
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env(saved))
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)

    # --- commands ---
    def systemctl(self, *args, timeout=120, check=False):
        """``systemctl ARGS``: the CompletedProcess (text)."""
        return self._run([SYSTEMCTL] + [str(arg) for arg in args], timeout, check)

    def journalctl(self, *args, timeout=60):
        return self._run([JOURNALCTL] + [str(arg) for arg in args], timeout, True).stdout

    def _run(self, argv, timeout, check):
        done = subprocess.run(argv, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError("%s exited %d:\n%s%s" % (" ".join(argv), done.returncode, done.stdout, done.stderr))
        return done

    def show(self, unit, *properties):
        """``systemctl show`` of one unit as a dict (only ``properties`` when given)."""
        args = ["show"] + (["--property=" + ",".join(properties)] if properties else []) + ["--", unit]
        out = self.systemctl(*args, check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def main_process(self, unit):
        """(argv, Cpus_allowed_list) of the unit's main process, read from /proc."""
        pid = self.show(unit, "MainPID")["MainPID"]
        with open("/proc/%s/cmdline" % pid, "rb") as handle:
            argv = [arg.decode() for arg in handle.read().split(b"\0")[:-1]]
        with open("/proc/%s/status" % pid) as handle:
            cpus = [line.split(":", 1)[1].strip() for line in handle if line.startswith("Cpus_allowed_list:")]
        return argv, cpus[0]

    def wait(self, unit, predicate, timeout=10.0, interval=0.05):
        """Poll ``show`` until ``predicate(props)`` holds; the props then (AssertionError with the last ones and
        the journal when time runs out)."""
        deadline = time.monotonic() + timeout
        while True:
            props = self.show(unit)
            if predicate(props):
                return props
            if time.monotonic() >= deadline:
                raise AssertionError("%s: still %s after %.1f s; its journal:\n%s" % (
                    unit, {key: props.get(key) for key in ("ActiveState", "SubState", "Result", "NRestarts",
                                                           "MainPID")}, timeout, self.journalctl("-u", unit)))
            time.sleep(interval)

    def journal(self, unit, *args):
        """The unit's journal as its messages (``journalctl -u UNIT -o cat``), one string a line."""
        return self.journalctl("-u", unit, "-o", "cat", "-q", *args).splitlines()

    # --- files ---
    def write_unit(self, name, text, directory=None):
        path = os.path.join(directory or self.unit_dir, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def write_dropin(self, unit, name, text, directory=None):
        folder = os.path.join(directory or self.unit_dir, unit + ".d")
        os.makedirs(folder, exist_ok=True)
        return self.write_unit(name, text, folder)

    def fail_on(self, *rules):
        """Failures on cue (fakesd.Context.failure_on_cue documents a rule); none clears them."""
        with open(os.path.join(self.state, "fail.json"), "w", encoding="utf-8") as handle:
            json.dump(list(rules), handle)

    def calls(self, tool="systemctl"):
        """Every call of ``tool`` so far, as argv lists (argv[0] the tool's name), oldest first."""
        try:
            with open(os.path.join(self.state, "calls.log"), encoding="utf-8") as handle:
                calls = [json.loads(line) for line in handle if line.strip()]
        except FileNotFoundError:
            return []
        return [call for call in calls if tool is None or call[0] == tool]

    # --- the processes ---
    def registered(self):
        """[(pid, session, start time)] of every process the fake started."""
        found = []
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(self.state, "spawned"), encoding="utf-8") as handle:
                for line in handle:
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        found.append((record["pid"], record["session"], record["start"]))
        return found

    def survivors(self):
        """The registered processes still running (their PID reused by another process excluded)."""
        alive = []
        for pid, _session, start in self.registered():
            info = _stat(pid)
            if info and info["start"] == start and info["state"] not in "ZXx":
                alive.append(pid)
        return alive

    def stop_all(self):
        """Stop every unit and kill every process the fake started, then reap them: ``systemctl _stop-all``.
        Returns the PIDs it had to signal."""
        done = self._run([SYSTEMCTL, "_stop-all"], 120, True)
        killed = json.loads(done.stdout or "[]")
        self._reap(extra=set(killed), wait=5.0)
        return killed

    def __enter__(self):
        with _reaping["lock"]:
            if _reaping["users"] == 0:
                _subreaper(True)
            _reaping["users"] += 1
        self._stop.clear()
        self._reaper = threading.Thread(target=self._reap_loop, name="fake-systemd-reaper", daemon=True)
        self._reaper.start()
        return self

    def __exit__(self, *exc):
        try:
            self.stop_all()
        finally:
            self._stop.set()
            if self._reaper:
                self._reaper.join(5)
            with _reaping["lock"]:
                _reaping["users"] -= 1
                if _reaping["users"] == 0:
                    _subreaper(False)
        return False

    def _reap_loop(self):
        while not self._stop.wait(0.1):
            self._reap()

    def _reap(self, extra=(), wait=0.0):
        """Reap the zombie children of this process that are the fake's (registered PIDs, their sessions, or
        ``extra``); with ``wait``, until none of them is left to die or the time is up."""
        deadline = time.monotonic() + wait
        while True:
            registered = self.registered()
            pids = {pid for pid, _session, _start in registered} | set(extra)
            sessions = {session for _pid, session, _start in registered if session > 1}
            me = os.getpid()
            pending = False
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                info = _stat(int(name))
                if not info or info["ppid"] != me:
                    continue
                if int(name) in pids or info["session"] in sessions:
                    if info["state"] == "Z":
                        with contextlib.suppress(ChildProcessError):
                            if os.waitpid(int(name), os.WNOHANG)[0]:
                                self.reaped.append(int(name))
                    else:
                        pending = True
            if not pending or time.monotonic() >= deadline:
                return
            time.sleep(0.02)


def _stat(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            data = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return {"state": fields[0], "ppid": int(fields[1]), "session": int(fields[3]), "start": int(fields[19])}


def _subreaper(on):
    """Make this process the reaper of its orphaned descendants (prctl PR_SET_CHILD_SUBREAPER), or stop."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)


def fake_systemd_fixture(tmp_path, unit_dir=None):
    """The body of a ``fake_systemd`` fixture: a FakeSystemd in tmp_path (units/, root/, state/; its units in
    ``unit_dir`` when given), stopped and reaped at teardown, failing the test if any of its processes survived."""
    fake = FakeSystemd(tmp_path / "systemd-state", [unit_dir or tmp_path / "units"], root=tmp_path / "root")
    with fake:
        yield fake
    left = fake.survivors()
    assert not left, "processes of the fake systemd outlived the test: %s" % left
