"""One unit's supervisor in the fake systemd: what PID 1 does for a started service.

``systemctl start`` starts it detached (double fork, its own session) as::

    python3 supervisor.py UNIT GENERATION REPORT_FD

It runs the unit's ExecStart= in a child that becomes a session leader, applies CPUAffinity=, NUMAPolicy=/
NUMAMask=, User=/Group=, UMask= and WorkingDirectory= there and then execs; sends the child's stdout and stderr
to the unit's journal line by line; records MainPID, ExecMainCode/ExecMainStatus and the Result when the main
process exits; kills what is left of the unit's processes (every descendant: the supervisor is a child
subreaper, so a daemonizing grandchild stays below it, as it would stay in the unit's cgroup); and restarts per
Restart=/RestartSec= within StartLimitBurst=/StartLimitIntervalSec=.

It answers ``systemctl start`` once, on REPORT_FD, with one JSON line: {"ok": true, "pid": N} once the process
runs (Type=exec: once execve succeeded; Type=simple: once forked), or {"ok": false, ...} when it could not.
``systemctl stop`` sends it SIGTERM: it sends KillSignal= (and SIGCONT) to the unit's processes, SIGKILL after
TimeoutStopSec=, records the unit inactive (or failed), and exits. GENERATION ties it to the start that made it:
a supervisor whose unit was started or stopped again since exits without touching it.
"""

import json
import os
import select
import signal
import sys
import time

# fakesd.py compiled once per state directory, never into the checkout.
sys.pycache_prefix = os.path.join(os.environ.get("FAKE_SYSTEMD_STATE") or "/nonexistent", "pycache")
sys.dont_write_bytecode = not os.environ.get("FAKE_SYSTEMD_STATE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fakesd  # noqa: E402  (beside this file)

PR_SET_CHILD_SUBREAPER = 36
STEP_MESSAGES = {"CPUAFFINITY": "Failed to set up CPU affinity", "NUMA_POLICY": "Failed to set NUMA memory policy",
                 "GROUP": "Failed to determine group credentials", "USER": "Failed to change UID",
                 "CHDIR": "Changing to the requested working directory failed"}
STEP_MESSAGES.update((step, "Failed to set up special execution directory") for step in
                     ("RUNTIME_DIRECTORY", "STATE_DIRECTORY", "CACHE_DIRECTORY", "LOGS_DIRECTORY",
                      "CONFIGURATION_DIRECTORY"))


def become_subreaper():
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def decode(wait_status):
    """A wait status -> (ExecMainCode, ExecMainStatus): (1, exit code), (2, signal), (3, signal with core)."""
    if os.WIFEXITED(wait_status):
        return fakesd.CLD_EXITED, os.WEXITSTATUS(wait_status)
    signum = os.WTERMSIG(wait_status)
    return (fakesd.CLD_DUMPED if os.WCOREDUMP(wait_status) else fakesd.CLD_KILLED), signum


def result_of(definition, code, status, ignore):
    """The unit's Result for a main process exit (systemd.service(5): clean exits and SuccessExitStatus=)."""
    if ignore:
        return "success"
    if code == fakesd.CLD_EXITED:
        return "success" if status == 0 or status in definition["success_exit_status"] else "exit-code"
    if status in fakesd.CLEAN_SIGNALS or status in definition["success_exit_signals"]:
        return "success"
    return "core-dump" if code == fakesd.CLD_DUMPED else "signal"


def shall_restart(policy, result):
    """Restart= (systemd.service(5), table "Exit causes and the effect of the Restart= settings")."""
    if policy == "always":
        return True
    if policy == "on-success":
        return result == "success"
    if policy == "on-failure":
        return result != "success"
    if policy == "on-abnormal":
        return result not in ("success", "exit-code")
    if policy == "on-abort":
        return result in ("signal", "core-dump")
    if policy == "on-watchdog":
        return result == "watchdog"
    return False


def resolve(path):
    """The file systemd would execute for an ExecStart= path (absolute, or searched in its fixed PATH)."""
    candidates = [path] if path.startswith("/") else [os.path.join(folder, path)
                                                      for folder in fakesd.MANAGER_PATH.split(":")]
    error = None
    for candidate in candidates:
        if os.path.isdir(candidate):
            error = OSError(13, os.strerror(13))
        elif os.path.exists(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            error = OSError(13, os.strerror(13))
    raise error or OSError(2, os.strerror(2))


def child(plan, out_w, status_w):
    """The service's process between fork and exec: never returns."""
    step, message = "EXEC", None
    try:
        try:
            for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                           signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
                signal.signal(signum, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGPIPE, signal.SIG_IGN if plan["ignore_sigpipe"] else signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.umask(plan["umask"])
            step = "CPUAFFINITY"
            if plan["cpus"] is not None:
                os.sched_setaffinity(0, plan["cpus"])
            else:  # PID 1's own affinity: every online CPU, whatever the caller of systemctl was pinned to
                try:
                    os.sched_setaffinity(0, fakesd.online_cpus())
                except OSError:
                    pass
            step = "NUMA_POLICY"
            if plan["numa_policy"]:
                fakesd.set_mempolicy(plan["numa_policy"], plan["numa_mask"])
            step = "GROUP"
            if plan["gid"] is not None:
                if plan["user"]:
                    os.initgroups(plan["user"], plan["gid"])
                os.setgid(plan["gid"])
            for key, path in plan["directories"]:
                step = key.upper().replace("DIRECTORY", "_DIRECTORY")
                os.makedirs(path, mode=0o755, exist_ok=True)
                if plan["uid"] is not None:
                    os.chown(path, plan["uid"], plan["gid"] if plan["gid"] is not None else -1)
            step = "USER"
            if plan["uid"] is not None:
                os.setuid(plan["uid"])
            step = "CHDIR"
            try:
                os.chdir(plan["cwd"])
            except OSError:
                if not plan["cwd_optional"]:
                    raise
            step = "EXEC"
            message = "Failed to locate executable %s" % plan["path"]
            try:
                executable = resolve(plan["path"])
            except OSError as exc:
                if plan["ignore"]:
                    os.write(status_w, json.dumps({"step": "SKIP", "error": exc.strerror, "message":
                                                   "Executable %s missing, skipping" % plan["path"]}).encode())
                    os._exit(0)
                raise
            message = "Failed to execute %s" % executable
            os.execve(executable, plan["argv"], plan["env"])
        except OSError as exc:
            report = {"step": step, "errno": exc.errno, "error": exc.strerror or str(exc),
                      "message": message or STEP_MESSAGES.get(step, "Failed at step " + step)}
            os.write(status_w, json.dumps(report).encode())
            os._exit(fakesd.EXIT_STEPS.get(step, 1))
        except BaseException as exc:  # noqa: B902 (the child must never return into the supervisor's code)
            report = {"step": step, "errno": 0, "error": repr(exc),
                      "message": message or STEP_MESSAGES.get(step, "Failed at step " + step)}
            os.write(status_w, json.dumps(report).encode())
            os._exit(fakesd.EXIT_STEPS.get(step, 1))
    finally:
        os._exit(1)


class Supervisor:
    """The supervisor of one started unit (see the module's docstring)."""

    def __init__(self, context, unit, generation, report_fd):
        self.context, self.unit, self.generation = context, unit, generation
        self.report_fd = report_fd
        self.stop = False
        self.main_pid = 0
        self.started_ok = self.start_timed_out = False  # of the current run: active yet, TimeoutStartSec= hit
        self.pid = os.getpid()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    # --- signals and answers ---
    def on_term(self, _signum, _frame):
        self.stop = True

    def answer(self, report):
        """systemctl start's answer, once."""
        if self.report_fd is None:
            return
        try:
            os.write(self.report_fd, (json.dumps(report) + "\n").encode("utf-8"))
        except OSError:
            pass
        try:
            os.close(self.report_fd)
        except OSError:
            pass
        self.report_fd = None

    def journal(self, message, pid=1, ident="systemd", invocation=""):
        self.context.journal(self.unit, message, pid=pid, ident=ident, invocation=invocation)

    def current(self, state):
        """Whether the unit is still this supervisor's: not started or stopped again since, nor stopping."""
        return state["generation"] == self.generation and not state["stop_requested"] and not self.stop

    # --- the run ---
    def run(self):
        self.context.register(self.pid, "supervisor", self.unit)
        become_subreaper()
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        signal.set_wakeup_fd(self.wake_w)
        me = fakesd.proc_stat(self.pid)
        with self.context.lock():
            state = self.context.read_state(self.unit)
            if not self.current(state):
                self.answer({"ok": False, "error": "the unit was started or stopped again meanwhile"})
                return
            state["supervisor"] = {"pid": self.pid, "start": me["start"] if me else 0}
            self.context.write_state(self.unit, state)
        while True:
            outcome = self.run_once()
            if outcome != "restart" or not self.wait_restart():
                break
        self.reap_all(2.0)
        self.remove_runtime_directories()

    def remove_runtime_directories(self):
        """RuntimeDirectory= goes when the unit stops (RuntimeDirectoryPreserve=no, systemd's default)."""
        import shutil
        with self.context.lock():
            definition = self.context.loaded(self.unit)
            state = self.context.read_state(self.unit)
        if state["generation"] != self.generation or state["active"] in fakesd.ACTIVE_STATES:
            return
        for name in definition.get("directories", {}).get("RuntimeDirectory", []):
            shutil.rmtree(os.path.join(self.context.root, "run", name), ignore_errors=True)

    def run_once(self):
        """Start the main process once and supervise it until it and the unit's other processes are gone:
        "restart" when Restart= says so, else "done"."""
        with self.context.lock():
            state = self.context.read_state(self.unit)
            if not self.current(state):
                self.answer({"ok": False, "canceled": True})
                return "done"
            definition = self.context.loaded(self.unit)
            invocation = state["invocation_id"]
            try:
                plan = fakesd.exec_plan(definition, invocation, self.context)
            except (IndexError, KeyError) as exc:
                state["result"] = "resources"
                state["supervisor"] = None
                fakesd.set_state(state, "failed", "failed")
                self.context.write_state(self.unit, state)
                self.journal("%s: fake systemd cannot run it: %r" % (self.unit, exc))
                self.answer({"ok": False, "error": "cannot run %s: %r" % (self.unit, exc)})
                return "done"
        name = fakesd.unit_status_name(definition)
        kind = definition["type"]
        for note in plan["notes"]:
            self.journal("%s: %s" % (self.unit, note), invocation=invocation)
        notify = self.notify_socket(plan) if kind in fakesd.NOTIFY_TYPES else None
        self.started_ok, self.start_timed_out = False, False
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGCHLD})
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            os.close(status_r)
            child(plan, out_w, status_w)
        self.main_pid = pid
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(out_w)
        os.close(status_w)
        self.context.register(pid, "main", self.unit)
        started = time.time()
        if kind in ("simple", "idle"):  # started once forked
            self.record_start(pid, started, name)
        failure = self.read_status(status_r)
        if failure and failure.get("step") == "SKIP":
            self.journal("%s: %s: %s" % (self.unit, failure["message"], failure["error"]), pid=pid,
                         invocation=invocation)
            failure = None
        elif failure:
            self.journal("%s: %s: %s" % (self.unit, failure["message"], failure["error"]), pid=pid,
                         invocation=invocation)
            self.journal("%s: Failed at step %s spawning %s: %s" % (
                self.unit, failure["step"], plan["path"], failure["error"]), pid=pid, invocation=invocation)
        elif kind == "exec":  # started once execve succeeded
            self.record_start(pid, started, name)
        start_by = None
        if notify is not None and failure is None:  # started once it says READY=1
            timeout = definition["timeout_start_sec"]
            start_by = time.monotonic() + (self.context.timeout_start if timeout is None else timeout)
        wait_status, hard_main, hard_any = self.supervise(pid, out_r, definition, plan, invocation, notify,
                                                          start_by, name)
        if notify is not None:
            notify.close()
        outcome, result = self.record_exit(definition, plan, pid, wait_status, (hard_main, hard_any), name)
        self.answer({"ok": False, "result": result} if result != "success" else {"ok": False, "canceled": True})
        return outcome

    def notify_socket(self, plan):
        """The unit's $NOTIFY_SOCKET (sd_notify(3)): a datagram socket in the abstract namespace, which passes
        the sender's credentials (NotifyAccess= is checked against them)."""
        import socket
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        address = "fakesd/%d/%s" % (self.pid, os.urandom(6).hex())
        sock.bind("\0" + address)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        plan["env"]["NOTIFY_SOCKET"] = "@" + address
        return sock

    def notified(self, notify, definition, pid, name, invocation):
        """Read what the unit's processes sent to $NOTIFY_SOCKET: READY=1, STATUS=, STOPPING=1, MAINPID= (kept
        only from the processes NotifyAccess= allows: the main one by default)."""
        import socket
        import struct
        access = definition["notify_access"] or "main"
        while True:
            try:
                data, ancillary, _flags, _address = notify.recvmsg(65536, socket.CMSG_SPACE(12))
            except (BlockingIOError, InterruptedError):
                return
            sender = None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= 12:
                    sender = struct.unpack("iii", payload[:12])[0]
            if access == "none" or (access in ("main", "exec") and sender != pid):
                self.journal("%s: Got notification message from PID %s, but reception only permitted for main PID "
                             "%d" % (self.unit, sender, pid), invocation=invocation)
                continue
            fields = dict(line.split("=", 1) for line in data.decode("utf-8", "replace").split("\n") if "=" in line)
            if "STATUS" in fields:
                with self.context.lock():
                    state = self.context.read_state(self.unit)
                    state["status_text"] = fields["STATUS"]
                    self.context.write_state(self.unit, state)
            if fields.get("READY") == "1" and not self.started_ok:
                self.record_start(pid, time.time(), name, exec_start=False)
            if fields.get("STOPPING") == "1":
                with self.context.lock():
                    state = self.context.read_state(self.unit)
                    if state["generation"] == self.generation and state["active"] == "active":
                        fakesd.set_state(state, "deactivating", "stop-sigterm")
                        self.context.write_state(self.unit, state)

    def read_status(self, status_r):
        chunks = []
        while True:
            data = os.read(status_r, 65536)
            if not data:
                break
            chunks.append(data)
        os.close(status_r)
        if not chunks:
            return None
        try:
            return json.loads(b"".join(chunks).decode("utf-8", "replace"))
        except ValueError:
            return {"step": "EXEC", "error": "unreadable", "message": "Failed to execute"}

    def record_start(self, pid, started, name, exec_start=True):
        """The unit is active: record it, say so in the journal, answer systemctl start."""
        self.started_ok = True
        with self.context.lock():
            state = self.context.read_state(self.unit)
            state["main_pid"] = state["exec_main_pid"] = pid
            if exec_start:
                state["exec_main_start"], state["exec_main_exit"] = started, 0
                state["exec_main_code"] = state["exec_main_status"] = 0
            if state["generation"] == self.generation and not state["stop_requested"]:
                fakesd.set_state(state, "active", "running")
            self.context.write_state(self.unit, state)
        self.journal("Started %s." % name, invocation=state["invocation_id"])
        self.answer({"ok": True, "pid": pid})

    # --- while it runs ---
    def unit_processes(self):
        """The unit's live processes: every descendant of the supervisor that is not a zombie."""
        table = fakesd.all_processes()
        return [pid for pid in fakesd.descendants(self.pid, table) if table[pid]["state"] not in ("Z", "X", "x")]

    def kill_unit(self, signum):
        pids = self.unit_processes()
        fakesd.signal_processes(pids, signum)
        if signum not in (signal.SIGKILL, signal.SIGCONT):
            fakesd.signal_processes(pids, signal.SIGCONT)
        return pids

    def supervise(self, pid, out_r, definition, plan, invocation, notify=None, start_by=None, name=""):
        """Pump the output to the journal until the main process and every other process of the unit are gone;
        on a stop request send KillSignal=, SIGKILL after TimeoutStopSec=; a Type=notify unit not READY by
        ``start_by`` (TimeoutStartSec=) is stopped the same way. Returns (wait status, whether the main process
        was still there to be killed when the time ran out, whether anything was)."""
        timeout = definition["timeout_stop_sec"]
        timeout = self.context.timeout_stop if timeout is None else timeout
        pending, main_status, deadline, killing, hard = b"", None, None, False, False
        hard_main = hard_any = False
        out_open, grace = True, None
        while True:
            now = time.monotonic()
            if start_by is not None and not self.started_ok and not killing and now >= start_by:
                self.start_timed_out = True
                self.journal("%s: start operation timed out. Terminating." % self.unit, invocation=invocation)
            if not killing and (self.stop or main_status is not None or self.start_timed_out):
                killing = True
                if self.kill_unit(definition["kill_signal"]):
                    deadline = now + timeout
            if deadline is not None and now >= deadline and not hard:
                hard = True
                left = self.unit_processes()
                if left:
                    hard_any, hard_main = True, main_status is None
                    self.journal("%s: State 'stop-sigterm' timed out. Killing." % self.unit)
                    for victim in left:
                        self.journal("%s: Killing process %d (%s) with signal SIGKILL." % (
                            self.unit, victim, _comm(victim)))
                    fakesd.signal_processes(left, signal.SIGKILL)
            while True:
                try:
                    reaped, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if reaped == 0:
                    break
                if reaped == pid:
                    main_status = status
            if main_status is not None and not self.unit_processes():
                if not out_open:
                    break
                if grace is None:
                    grace = now + 1.0
                elif now >= grace:
                    break
            wait = 0.5 if deadline is None or hard else max(0.0, min(0.5, deadline - now))
            if start_by is not None and not self.started_ok:
                wait = max(0.0, min(wait, start_by - now))
            readers = [self.wake_r] + ([out_r] if out_open else []) + ([notify] if notify is not None else [])
            try:
                ready, _w, _x = select.select(readers, [], [], 0.05 if grace is not None else wait)
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            if notify is not None and notify in ready:
                self.notified(notify, definition, pid, name, invocation)
            if out_open and out_r in ready:
                data = os.read(out_r, 65536)
                if not data:
                    out_open = False
                else:
                    pending = self.lines(pending + data, pid, plan["ident"], invocation)
        if pending:
            self.lines(pending + b"\n", pid, plan["ident"], invocation)
        os.close(out_r)
        self.main_pid = 0
        return main_status, hard_main, hard_any

    def lines(self, data, pid, ident, invocation):
        """Journal each complete line of the output (journald splits lines longer than LineMax=); the rest
        is kept for the next read."""
        *complete, rest = data.split(b"\n")
        for line in complete:
            while True:
                chunk, line = line[:fakesd.LINE_MAX], line[fakesd.LINE_MAX:]
                self.journal(chunk.decode("utf-8", "replace"), pid=pid, ident=ident, invocation=invocation)
                if not line:
                    break
        return rest

    # --- when it ended ---
    def record_exit(self, definition, plan, pid, wait_status, timed_out, name):
        """Record the main process's end: ("restart" when Restart= restarts it, else "done", the Result). A stop
        or start that timed out is the Result when it came first (the main process was still running then), as
        systemd keeps the first failure; a Type=notify process that ends well before READY=1 is a "protocol"
        failure."""
        code, status = decode(wait_status)
        result = result_of(definition, code, status, plan["ignore"])
        if self.start_timed_out or timed_out[0] or (timed_out[1] and result == "success"):
            result = "timeout"
        elif result == "success" and definition["type"] in fakesd.NOTIFY_TYPES and not self.started_ok \
                and not self.stop:
            result = "protocol"
        with self.context.lock():
            state = self.context.read_state(self.unit)
            invocation = state["invocation_id"]
            mine = state["generation"] == self.generation
            stopping = self.stop or state["stop_requested"] or not mine
            state["exec_main_code"], state["exec_main_status"] = code, status
            state["exec_main_pid"] = pid
            state["exec_main_exit"] = time.time()
            state["main_pid"] = 0
            if result == "success":
                self.journal("%s: Deactivated successfully." % self.unit, invocation=invocation)
            else:
                if code != fakesd.CLD_EXITED or status != 0:
                    self.journal("%s: Main process exited, code=%s, status=%s" % (
                        self.unit, fakesd.CODE_NAMES[code], fakesd.exit_status_text(code, status)),
                        invocation=invocation)
                self.journal("%s: Failed with result '%s'." % (self.unit, result), invocation=invocation)
            if not mine:  # started again meanwhile: leave the unit to its new supervisor
                self.context.write_state(self.unit, state)
                return "done", result
            if state["result"] == "success":
                state["result"] = result
            failed = state["result"] != "success"
            if stopping:
                state["supervisor"] = None
                fakesd.set_state(state, "failed" if failed else "inactive", "failed" if failed else "dead")
                self.context.write_state(self.unit, state)
                self.journal("Stopped %s." % name, invocation=invocation)
                return "done", result
            if not self.started_ok and definition["type"] not in ("simple", "idle"):
                self.journal("Failed to start %s." % name, invocation=invocation)
            if shall_restart(definition["restart"], result):
                fakesd.set_state(state, "activating", "auto-restart")
                self.context.write_state(self.unit, state)
                return "restart", result
            state["supervisor"] = None
            fakesd.set_state(state, "failed" if failed else "inactive", "failed" if failed else "dead")
            self.context.write_state(self.unit, state)
            return "done", result

    def wait_restart(self):
        """RestartSec=, then the restart job: True to start again, False when stopped or the start limit hit."""
        with self.context.lock():
            definition = self.context.loaded(self.unit)
        deadline = time.monotonic() + definition["restart_sec"]
        while not self.stop:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                select.select([self.wake_r], [], [], min(left, 0.5))
            except InterruptedError:
                pass
            try:
                while os.read(self.wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        with self.context.lock():
            state = self.context.read_state(self.unit)
            if not self.current(state):
                if state["generation"] == self.generation and state["sub"] == "auto-restart":
                    state["supervisor"] = None
                    fakesd.set_state(state, "inactive", "dead")
                    self.context.write_state(self.unit, state)
                    self.journal("Stopped %s." % fakesd.unit_status_name(definition), invocation=state["invocation_id"])
                return False
            definition = self.context.loaded(self.unit)
            name = fakesd.unit_status_name(definition)
            state["n_restarts"] += 1
            self.journal("%s: Scheduled restart job, restart counter is at %d." % (self.unit, state["n_restarts"]),
                         invocation=state["invocation_id"])
            self.journal("Stopped %s." % name, invocation=state["invocation_id"])
            if not fakesd.start_limit_ok(state, definition):
                fakesd.start_limit_hit(self.context, self.unit, state, name)
                state["supervisor"] = None
                self.context.write_state(self.unit, state)
                return False
            state["invocation_id"] = fakesd.new_invocation_id()
            state["result"] = "success"
            fakesd.set_state(state, "activating", "start")
            self.context.write_state(self.unit, state)
            if definition["type"] not in ("simple", "idle"):
                self.journal("Starting %s..." % name, invocation=state["invocation_id"])
        return True

    def reap_all(self, seconds):
        """Kill and reap whatever is left below the supervisor before it exits."""
        deadline = time.monotonic() + seconds
        while True:
            left = self.unit_processes()
            if left and time.monotonic() >= deadline:
                fakesd.signal_processes(left, signal.SIGKILL)
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                return
            time.sleep(0.02)


def _comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def main(argv):
    unit, generation, report_fd = argv[1], int(argv[2]), int(argv[3])
    os.set_inheritable(report_fd, False)
    context = fakesd.Context()
    supervisor = Supervisor(context, unit, generation, report_fd)
    try:
        supervisor.run()
    except BaseException:
        import traceback
        sys.stderr.write("fake systemd supervisor of %s (pid %d) crashed:\n%s" % (
            unit, os.getpid(), traceback.format_exc()))
        supervisor.answer({"ok": False, "error": "the supervisor crashed: see %s" % context.path("supervisor.log")})
        with context.lock():
            state = context.read_state(unit)
            if state["generation"] == generation:
                state["supervisor"], state["main_pid"], state["result"] = None, 0, "resources"
                fakesd.set_state(state, "failed", "failed")
                context.write_state(unit, state)
        supervisor.kill_unit(signal.SIGKILL)
        supervisor.reap_all(1.0)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
