"""A host's deployment as one change that ends in a known state: applied and judged, taken back completely, or
recorded so that the next run takes it back before it deploys again.

The order of a deployment (``deploy``):

1. An earlier change nobody judged (act/change_files's pending record: a run that stopped, crashed or could not
   finish a rollback) is taken back first; if that cannot be done completely the run stops here, saying what is
   left, and the record stays.
2. What changes is decided from what the services want and what the host holds (decide/rollout): the files to
   write, the instances they restart, the changes held as ones an A/B gate rolled back before.
3. The record of the change is written, then the files, then systemd reloads.
4. Instances start or restart ``batch`` at a time behind their gates, and the next batch waits for this one:

   - readiness: HTTP 200 from the instance's health URL (the engine's, or the entry's), or a TCP connection to
     its port, or for neither systemd's "active"; each probe has a deadline of its own, and the whole wait
     ``ready_seconds``. A unit that fails, exits, or is restarted by systemd while we wait (``Restart=`` turns
     a crash into ``activating (auto-restart)``, never ``failed``) is failed at once, quoting the last lines
     of its journal;
   - the audit, where asked (read/audit);
   - the A/B gate, where asked (measure/ab_gate): tokens per second before the restart and after it. A rate that
     cannot be measured before the restart leaves the instance as it is and takes the change back; after it,
     the change is taken back too. A first deployment's baseline is the same server started once without a
     placement (the Linux default, through a runtime drop-in), so the gate measures what binding gains here;
     its binding is kept either way: there is nothing of ours to go back to.

5. Every gate passed: the record is removed, the verdicts merged into ab-gates.json. Otherwise the whole change is
   taken back (``take_back``): instances deployed for the first time (or not running before) are stopped, every
   written file gets its previous text back, systemd reloads, and every instance already restarted restarts on
   its previous files; each step is tried whatever the one before did. Only when all of it worked is the record
   removed, and a slower verdict kept as the service's rejected change, which the next runs do not try again (it
   would be rolled back at every run); else the record stays and the message says what could not be done.

A failed gate fails the host; a change the A/B gate found slower, taken back completely, is a verdict, not a
failure.
"""

import json
import os
import socket
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

from ..measure import engine_http
from ..measure.ab_gate import Gate, judge, measure
from .change_files import (Pending, merge_verdicts, missing_directories, read_found, read_pending, read_rejected,
                           read_undrain, remove_made_directories, remove_pending, write_files, write_pending,
                           write_rejected, write_undrain)
from .hooks import HookRun, Hooks, hook_problem, run_hook
from .unit_text import BASELINE_DROP_IN, BASELINE_DROP_IN_TEXT
from ..base.errors import NumaError
from ..decide.records import PENDING, UNDRAIN, rejected_record_name
from ..decide.rollout import Change, Found, Service, decide, previous_texts, rejected_record
from ..read.audit import UnitAudit, audit_units
from ..read.kernel_files import printable
from ..read.systemctl import CommandRunner, show_units
from ..system import root_files, safe_fs

POLL_SECONDS = 2.0
# A readiness probe's whole budget (connect, request, answer), within what is left of ready_seconds.
PROBE_SECONDS = 5.0
RUNTIME_UNIT_DIR = "run/systemd/system"
# The journal lines a failed start quotes, and how much of each.
JOURNAL_LINES = 3
JOURNAL_LINE_CHARS = 240
JOURNAL_SCAN = 50  # the unit's last entries looked through for those lines
DONE = {"start": "started", "restart": "restarted"}


class Instance(NamedTuple):
    """One instance, how to tell it is ready, how to audit it and whether to measure it."""
    unit: str
    url: Optional[str]
    port: Optional[int]
    audit: Optional[UnitAudit]
    gate: Optional[Gate] = None
    hooks: Hooks = Hooks()  # its load balancer's drain and undrain (act/hooks); none: nothing run


class Deployment(NamedTuple):
    """One service: the files it wants (decide/rollout.Service) and its instances, in the order to go through."""
    wanted: Service
    instances: Tuple[Instance, ...]


class Options(NamedTuple):
    record_dir: str  # the plan directory: the pending record, the rejected records, ab-gates.json
    batch: int = 1
    ready_seconds: float = 600.0
    settle_seconds: float = 3.0
    root: str = "/"


Probe = Callable[[Instance, float], Optional[str]]  # (instance, seconds) -> None when ready, else what it saw
Measure = Callable[[Gate], List[float]]  # tokens/s of the gate's rounds; NumaError when not measured


def probe(instance: Instance, seconds: float) -> Optional[str]:
    """None when the instance answers within ``seconds`` (HTTP 200 from its URL, or a TCP connection to its
    port), else why not."""
    if instance.url:
        return engine_http.status_problem(instance.url, seconds)
    if instance.port:
        try:
            socket.create_connection(("127.0.0.1", instance.port), timeout=seconds).close()
            return None
        except OSError as exc:
            return "port %d: %s" % (instance.port, exc.strerror or exc)
    return None


class Host:
    """systemd and the servers of the host, as a deployment talks to them; tests hand in fakes of each part."""

    def __init__(self, run: CommandRunner, answers: Probe = probe, rates: Measure = measure,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time, hook: HookRun = run_hook) -> None:
        self.run = run
        self.hook = hook
        self.answers = answers
        self.rates = rates
        self.clock = clock
        self.sleep = sleep
        self.wall = wall
        self.started = {}  # type: Dict[str, float]  # unit -> when we last started it (epoch): its journal since
        # Units out of their load balancer's traffic: drained, or started by us and not undrained yet. A stop or
        # restart drains only a unit not among them.
        self.out = set()  # type: Set[str]
        # Units running without traffic because their undrain failed: the next run's to undrain (rollout.undrain.json).
        self.owed = set()  # type: Set[str]

    def systemctl(self, action: str, unit: Optional[str] = None) -> Optional[str]:
        """None when ``systemctl ACTION [UNIT]`` succeeded, else one line saying how it failed."""
        argv = ["systemctl", action] + (["--", unit] if unit else [])
        try:
            rc, out, err = self.run(argv)
        except (OSError, NumaError) as exc:
            return "%s could not run: %s" % (" ".join(argv), exc)
        if rc == 0:
            return None
        return "%s failed (rc %d): %s" % (" ".join(argv), rc, _one_line((err or out).strip()))

    def start(self, action: str, unit: str) -> Optional[str]:
        """``systemctl start|restart`` the unit, after ``reset-failed``: a unit that hit its start limit in a
        crash loop refuses every start until then ("start request repeated too quickly"). A refused start says the
        last lines of the unit's journal: systemd's own answer only points there."""
        self.started[unit] = self.wall()
        if action == "start":  # it was not running, so no load balancer sends it anything until its undrain
            self.out.add(unit)
        self.systemctl("reset-failed", unit)  # its own failure (a unit not loaded yet) is the start's to say
        refused = self.systemctl(action, unit)
        said = self.journal(unit) if refused else ""
        return "%s; its journal: %s" % (refused, said) if said else refused

    def drain(self, instance: Instance) -> Optional[str]:
        """Take a serving instance out of traffic before it is stopped or restarted: its drain command, then the
        grace for requests in flight (drain_seconds). None, or the failed drain's one line."""
        if instance.unit in self.out or not instance.hooks.drain:
            return None
        problem = hook_problem("drain", instance.hooks.drain, instance.hooks.seconds, self.hook)
        if problem:
            return problem
        self.out.add(instance.unit)
        if instance.hooks.drain_seconds:
            self.sleep(instance.hooks.drain_seconds)
        return None

    def undrain(self, instance: Instance) -> Optional[str]:
        """Put an instance that passed its gates back into traffic. None, or the failed undrain's one line (the
        instance is then owed its undrain)."""
        problem = (hook_problem("undrain", instance.hooks.undrain, instance.hooks.seconds, self.hook)
                   if instance.hooks.undrain else None)
        if problem:
            self.owed.add(instance.unit)
            return problem
        self.out.discard(instance.unit)
        self.owed.discard(instance.unit)
        return None

    def stopped(self, unit: str) -> None:
        """``unit`` was stopped: nothing to undrain any more."""
        self.out.add(unit)
        self.owed.discard(unit)

    def states(self, units: Sequence[str]) -> Dict[str, Dict[str, str]]:
        return show_units(list(units), self.run)

    def journal(self, unit: str) -> str:
        """The last lines the unit logged since we started it, as one line of plain text; empty when there are
        none to read. The server's own lines when it said anything: systemd's about it ("Main process exited",
        "Scheduled restart job") fill the last lines of a crash loop and hide the cause."""
        argv = ["journalctl", "--no-pager", "-q", "-o", "json", "-n", str(JOURNAL_SCAN), "-u", unit]
        if unit in self.started:  # local time to the second: the form every journalctl reads
            argv += ["--since", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started[unit] - 1))]
        try:
            rc, out, _err = self.run(argv)
        except (OSError, NumaError):
            return ""
        entries = [entry for entry in map(_journal_entry, (out if rc == 0 else "").splitlines()) if entry]
        own = [message for origin, message in entries if origin == unit]
        lines = own or [message for _origin, message in entries]
        return " | ".join(_one_line(line)[:JOURNAL_LINE_CHARS] for line in lines[-JOURNAL_LINES:])


def _journal_entry(line: str) -> Optional[Tuple[str, str]]:
    """(the unit whose process logged it, or "" for systemd's own lines; the message) of one ``-o json`` line,
    None when it has no text. A message that is not UTF-8 comes as a list of bytes."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    message = entry.get("MESSAGE") if isinstance(entry, dict) else None
    if isinstance(message, list) and all(isinstance(byte, int) and 0 <= byte < 256 for byte in message):
        message = bytes(message).decode("utf-8", "replace")
    if not isinstance(message, str) or not message.strip():
        return None
    origin = entry.get("_SYSTEMD_UNIT")
    return (origin if isinstance(origin, str) else ""), message.strip()


def _one_line(text: str) -> str:
    return printable(" ".join(text.split()))


# --- the deployment ---------------------------------------------------------------------------------


def deploy(deployments: Sequence[Deployment], options: Options, host: Host, check: bool = False) -> Dict[str, Any]:
    """Undrain the instances an earlier run left without traffic, then deploy (``_deploy``); the instances this
    run leaves without traffic (an undrain failed) are recorded in UNDRAIN for the next run, and fail the host.
    A check runs no hook: it says which undrains it would retry."""
    owed = read_undrain(options.record_dir)
    if check:
        result = _deploy(deployments, options, host, check)
        if owed:
            result.update(changed=True, msg="would undrain first: %s; %s" % (", ".join(owed), result["msg"]))
        return result
    host.out.update(owed)
    host.owed.update(owed)
    by_unit = {instance.unit: instance for deployment in deployments for instance in deployment.instances}
    warnings = []  # type: List[str]
    problems = _undrain_owed(owed, by_unit, options, host, warnings)
    if problems:
        result = _unfinished(problems, options, "instances an earlier run left without traffic are not undrained",
                             _owed_said(options))
    else:
        result = _deploy(deployments, options, host, check)
        if owed:
            result.update(changed=True, msg="undrained first: %s; %s" % (", ".join(owed), result["msg"]))
    result["warnings"] = warnings + result["warnings"]
    if set(owed) != host.owed:
        try:
            write_undrain(options.record_dir, sorted(host.owed))
        except NumaError as exc:
            result.update(failed=True, msg="%s; %s" % (result["msg"], exc))
    if host.owed and not problems:
        result.update(failed=True, msg="%s; %s run without traffic: their undrain failed; %s" % (
            result["msg"], ", ".join(sorted(host.owed)), _owed_said(options)))
    return result


def _undrain_owed(owed: Sequence[str], instances: Mapping[str, Instance], options: Options, host: Host,
                  warnings: List[str]) -> List[str]:
    """Each unit an earlier run left without traffic undrained once it answers; the problems, one line each. A
    unit whose service has no undrain command now is dropped with a warning: nothing here can put it back."""
    problems = []  # type: List[str]
    for unit in owed:
        instance = instances.get(unit)
        if instance is None or not instance.hooks.undrain:
            host.owed.discard(unit)
            warnings.append("%s was left without traffic by an earlier run, and no undrain command of this run names "
                            "it: put it back into its load balancer by hand" % unit)
            continue
        why = wait_ready(instance, options.ready_seconds, host)
        problem = "not ready: %s" % why if why else host.undrain(instance)
        if problem:
            problems.append("%s: %s" % (unit, problem))
    return problems


def _owed_said(options: Options) -> str:
    return ("the host stays marked for retry (%s): the next run undrains them before it deploys; fix the undrain "
            "command or the load balancer and run again" % os.path.join(options.record_dir, UNDRAIN))


def _deploy(deployments: Sequence[Deployment], options: Options, host: Host, check: bool = False) -> Dict[str, Any]:
    """Apply the services' files and (re)start their instances behind their gates (see the module docstring).

    Returns {"changed", "failed", "msg", "instances": [{unit, action, ok, msg, rolled_back, ab_gate}],
    "services": {name: {"written": [paths], "held": bool}}, "diffs": [(path, before, after)], "warnings"}.
    In check mode only what would be done."""
    if options.batch < 1:
        raise NumaError("restart batch %r: give 1 or more instances at a time" % options.batch)
    warnings = []  # type: List[str]
    instances = [instance for deployment in deployments for instance in deployment.instances]
    by_unit = {instance.unit: instance for instance in instances}
    earlier = read_pending(options.record_dir)
    taken_back = {}  # type: Dict[str, str]
    if earlier is not None and not check:
        taken_back, problems = take_back(earlier, options, host, by_unit)
        if problems:
            return _unfinished(problems, options, "an earlier change nobody judged could not be taken back")
        remove_pending(options.record_dir)
    found = read_found({path for deployment in deployments for path in deployment.wanted.files})
    changes = [decide(deployment.wanted, found, read_rejected(options.record_dir, deployment.wanted.name, warnings)
                      if deployment.wanted.gated else {}) for deployment in deployments]
    states = host.states([instance.unit for instance in instances])
    running = {unit for unit, props in states.items() if props.get("ActiveState") == "active"}
    restart = {unit for change in changes for unit in change.restart}
    first = {unit for change in changes for unit in change.first}
    due = [(instance, "restart" if instance.unit in running else "start") for instance in instances
           if instance.unit in restart or instance.unit not in running]
    writes = {path: text for change in changes for path, text in change.writes.items()}
    report = _Report(changes, found, taken_back, earlier, warnings)
    if check:
        return report.summary([_result(instance, action, True, "would %s %s" % (action, instance.unit))
                               for instance, action in due], bool(due or writes or earlier))
    if not due and not writes:
        return report.summary([], earlier is not None)
    pending = Pending(previous_texts(tuple(changes), found), {instance.unit: instance.unit in running
                                                              for instance, _action in due},
                      first=[instance.unit for instance, _action in due if instance.unit in first],
                      made=missing_directories(writes))
    write_pending(options.record_dir, pending)
    problems = write_files(writes)
    if not problems and any(change.reload for change in changes):
        problems = [problem for problem in [host.systemctl("daemon-reload")] if problem]
    if problems:
        _said, undo_problems = take_back(pending, options, host, by_unit)
        if not undo_problems:
            remove_pending(options.record_dir)
        return report.not_applied(problems, undo_problems, options)
    results = _roll(due, first, pending, options, host)
    if all(result["ok"] and _kept(result) for result in results):
        remove_pending(options.record_dir)
        merge_verdicts(options.record_dir, _verdicts(results), warnings)
        return report.summary(results, True)
    said, undo_problems = take_back(pending, options, host, by_unit)
    for result in results:
        result["rolled_back"] = said.get(result["unit"])
    if not undo_problems:
        remove_pending(options.record_dir)
        slower = {result["unit"] for result in results if not _kept(result)}
        for change, deployment in zip(changes, deployments):
            if change.writes and slower & {instance.unit for instance in deployment.instances}:
                write_rejected(options.record_dir, change.service, rejected_record(change),
                               {unit: verdict for unit, verdict in _verdicts(results).items() if unit in slower})
        merge_verdicts(options.record_dir, _verdicts(results), warnings)
    return report.summary(results, True, undo_problems, options)


def _kept(result: Mapping[str, Any]) -> bool:
    return (result["ab_gate"] or {}).get("kept") is not False


def _verdicts(results: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    return {result["unit"]: result["ab_gate"] for result in results if result["ab_gate"]}


def _unfinished(problems: Sequence[str], options: Options, what: str, said: str = "") -> Dict[str, Any]:
    return {"changed": True, "failed": True, "instances": [], "services": {}, "diffs": [], "warnings": [],
            "msg": "%s: %s; %s" % (what, "; ".join(problems), said or _marked(options))}


def _marked(options: Options) -> str:
    return ("the host stays marked for retry (%s): the next run takes this change back before it deploys, or fix "
            "what is named and run again" % os.path.join(options.record_dir, PENDING))


# --- batches and gates -------------------------------------------------------------------------------


def _roll(due: Sequence[Tuple[Instance, str]], first: Sequence[str], pending: Pending, options: Options,
          host: Host) -> List[Dict[str, Any]]:
    """Start or restart ``due`` ``batch`` at a time behind their gates; stops at the first batch that fails
    (the rest are reported as not (re)started)."""
    results = []  # type: List[Dict[str, Any]]
    for start in range(0, len(due), options.batch):
        judged = _batch(due[start:start + options.batch], first, pending, options, host)
        results += judged
        if not all(result["ok"] and _kept(result) for result in judged):
            results += [dict(_result(instance, action, False, "not %s: the change was rolled back" % DONE[action]),
                             skipped=True) for instance, action in due[start + options.batch:]]
            break
    return results


def _batch(group: Sequence[Tuple[Instance, str]], first: Sequence[str], pending: Pending, options: Options,
           host: Host) -> List[Dict[str, Any]]:
    """One batch: the running instances drained, baselines measured, instances (re)started, then each gated and,
    passed, undrained. A drain that fails, or a baseline that cannot be measured, leaves the whole batch as it
    runs (undrained again): the change is then taken back, unmeasured. Each instance is in the pending record
    before anything starts it (its unbound baseline, its bound start). An undrain that fails fails its
    instance: the change is taken back, and the rollback's restart undrains it again."""
    undrained = _drain(group, host)
    if undrained:
        return undrained
    baselines = {}  # type: Dict[str, Any]
    for instance, action in group:
        if instance.gate and instance.unit in first:
            baselines[instance.unit] = (_touch(pending, [instance.unit], options)
                                        or _unbound_baseline(instance, options, host))
        elif instance.gate and action == "restart":
            baselines[instance.unit] = _measured(instance, host)
    unmeasured = {unit: why for unit, why in baselines.items() if isinstance(why, str)}
    refused = _touch(pending, [instance.unit for instance, _action in group], options) if not unmeasured else None
    if unmeasured or refused:
        return _left_as_they_run(group, host, {instance.unit: refused or unmeasured.get(
            instance.unit, "another instance of its batch was not measured before its restart")
            for instance, _action in group})
    started = {instance.unit: host.start(action, instance.unit) for instance, action in group}
    judged = [_ab(result, instance, baselines.get(instance.unit), host, instance.unit in first)
              for result, (instance, _action) in zip(_gate(group, started, options, host), group)]
    return [_undrained(result, instance, host) for result, (instance, _action) in zip(judged, group)]


def _drain(group: Sequence[Tuple[Instance, str]], host: Host) -> List[Dict[str, Any]]:
    """Each running instance of the batch drained before anything touches it; empty when all were, else the
    batch's results: none touched, those already drained undrained again."""
    for instance, action in group:
        problem = host.drain(instance) if action == "restart" else None
        if problem:
            why = {other.unit: "another instance of its batch was not drained" for other, _action in group}
            why[instance.unit] = ("%s; the instance was not touched: fix the drain command or the load balancer and "
                                  "run again" % problem)
            return _left_as_they_run(group, host, why)
    return []


def _left_as_they_run(group: Sequence[Tuple[Instance, str]], host: Host,
                      why: Mapping[str, str]) -> List[Dict[str, Any]]:
    """The results of a batch left untouched, each instance drained for it put back into traffic."""
    results = []
    for instance, action in group:
        said = why[instance.unit]
        problem = host.undrain(instance) if instance.unit in host.out and action == "restart" else None
        if problem:
            said += "; and putting it back into traffic failed: %s" % problem
        results.append(_result(instance, action, False, "%s: not %s: %s" % (instance.unit, DONE[action], said)))
    return results


def _undrained(result: Dict[str, Any], instance: Instance, host: Host) -> Dict[str, Any]:
    """A (re)started instance that passed every gate put back into traffic: its undrain is its last gate."""
    if not (result["ok"] and _kept(result)):
        return result
    problem = host.undrain(instance)
    if problem is None:
        return result
    return dict(result, ok=False, msg="%s: ready and judged, but %s: it runs without traffic"
                % (instance.unit, problem))


def _touch(pending: Pending, units: Sequence[str], options: Options) -> Optional[str]:
    """``units`` in the pending record before anything starts them: nothing may run that the record does not
    name. None, or why the record could not be written (then nothing is started)."""
    touched = pending.touched + [unit for unit in units if unit not in pending.touched]
    try:
        write_pending(options.record_dir, Pending(pending.files, pending.units, touched, pending.first, pending.made))
    except NumaError as exc:
        return str(exc)
    pending.touched = touched
    return None


def _gate(group: Sequence[Tuple[Instance, str]], refused: Mapping[str, Optional[str]], options: Options,
          host: Host) -> List[Dict[str, Any]]:
    waits, seconds = {}, {}  # type: Dict[str, Optional[str]], Dict[str, float]
    for instance, _action in group:
        began = host.clock()
        waits[instance.unit] = refused[instance.unit] or wait_ready(instance, options.ready_seconds, host)
        seconds[instance.unit] = round(host.clock() - began, 1)
    audits = [instance.audit for instance, _action in group if instance.audit and waits[instance.unit] is None]
    reports = {report["unit"]: report for report in
               (audit_units(options.root, audits, options.ready_seconds, options.settle_seconds, run=host.run,
                            clock=host.clock, sleep=host.sleep) if audits else [])}
    results = []
    for instance, action in group:
        why = waits[instance.unit]
        if why is None and instance.unit in reports and not reports[instance.unit]["ok"]:
            why = "its audit failed: %s" % reports[instance.unit]["msg"]
        result = (_result(instance, action, True, "%s and ready" % DONE[action]) if why is None else
                  _result(instance, action, False, "%s: %s" % (instance.unit, why)))
        results.append(dict(result, seconds=seconds[instance.unit]))
    return results


def wait_ready(instance: Instance, ready_seconds: float, host: Host) -> Optional[str]:
    """None once the instance is active and answers, else why not, as soon as it is known: its unit failed,
    exited, or is being restarted by systemd (a crash loop), each with the last lines of its journal; or time
    ran out."""
    deadline = host.clock() + ready_seconds
    restarts = None  # type: Optional[int]
    active_before = False
    while True:
        props = host.states([instance.unit])[instance.unit]
        state, sub = props.get("ActiveState"), props.get("SubState")
        count = _count(props.get("NRestarts"))
        restarts = count if restarts is None else restarts
        why = None  # type: Optional[str]
        result = props.get("Result") or "failed"
        if state == "failed" and (count > 0 or result == "start-limit-hit"):
            # Restarted until systemd's start limit gave up on it: a crash loop seen after its end.
            why = "it was crash-looping: its server exited (status %s) and systemd restarted it %d times (%s)" % (
                props.get("ExecMainStatus") or "?", count, result)
        elif state == "failed":
            why = "its unit failed (%s)" % result
        elif sub == "auto-restart" or count > restarts:
            why = "it is crash-looping: its server exited (status %s) and systemd restarts it" % (
                props.get("ExecMainStatus") or "?")
        elif state in ("inactive", "deactivating"):
            why = "its server exited (status %s)" % (props.get("ExecMainStatus") or "?")
        if why:
            said = host.journal(instance.unit)
            return "%s; its journal: %s" % (why, said) if said else "%s: see `journalctl -u %s`" % (why, instance.unit)
        seen = "unit %s" % state
        if state == "active" and (instance.url or instance.port):
            seen = host.answers(instance, max(0.1, min(PROBE_SECONDS, deadline - host.clock()))) or ""
            if not seen:
                return None
        elif state == "active":
            # Nothing to ask: active at two looks in a row, not restarted between them (a crash-looping server
            # is active for a moment after each restart).
            if active_before:
                return None
            seen = "unit active, looked at once"
        active_before = state == "active"
        if host.clock() >= deadline:
            return "not ready after %.0f s (%s)" % (ready_seconds, seen)
        host.sleep(min(POLL_SECONDS, max(0.0, deadline - host.clock())))


def _count(text: Optional[str]) -> int:
    return int(text) if text and text.isdecimal() and len(text) < 10 else 0


def _measured(instance: Instance, host: Host) -> Any:
    """The running instance's rates before its restart, or why there are none."""
    try:
        return host.rates(instance.gate)
    except NumaError as exc:
        return "not measured before its restart: %s" % exc


def _unbound_baseline(instance: Instance, options: Options, host: Host) -> Any:
    """A first deployment's rates started once without placement (the Linux default), or why there are none.
    Stopped again and its runtime drop-in removed whatever happened; a step of that which fails is the
    answer, as the bound start could then run unbound."""
    problem = _write_baseline_drop_in(options.root, instance.unit) or host.systemctl("daemon-reload")
    rates = None
    if not problem:
        problem = host.start("start", instance.unit) or wait_ready(instance, options.ready_seconds, host)
        if not problem:
            rates = _measured(instance, host)
    cleanup = [step for step in (host.systemctl("stop", instance.unit), remove_baseline_drop_in(options.root,
               instance.unit), host.systemctl("daemon-reload")) if step]
    if problem or cleanup:
        return "no unbound baseline: %s" % "; ".join(([problem] if problem else []) + cleanup)
    return rates


def _baseline_directory(root: str, unit: str) -> str:
    return os.path.join(RUNTIME_UNIT_DIR, unit + ".d")


def _write_baseline_drop_in(root: str, unit: str) -> Optional[str]:
    """The runtime drop-in of the unbound baseline, in /run (gone at a reboot), written in directories root alone
    may write, reached without following a link; None, or why it could not be."""
    try:
        names = safe_fs.names_of(root, _baseline_directory(root, unit))
        fd, problem, _owner = safe_fs.open_directory(root, names, safe_fs.PRIVATE_DIR, create=True)
    except OSError as exc:
        return "no runtime drop-in for the unbound baseline: %s" % exc
    if problem:
        return "refusing %s for the unbound baseline: %s" % (problem.path, problem.why)
    try:
        safe_fs.write_atomically(fd, BASELINE_DROP_IN, BASELINE_DROP_IN_TEXT.encode("utf-8"), 0o644,
                                 "." + BASELINE_DROP_IN)
    except OSError as exc:
        return "no runtime drop-in for the unbound baseline: %s" % exc
    finally:
        os.close(fd)
    return None


def remove_baseline_drop_in(root: str, unit: str) -> Optional[str]:
    """The unbound baseline's runtime drop-in removed (and its directory, when empty); None, or why not."""
    try:
        fd, _problem, _owner = safe_fs.walk(root, safe_fs.names_of(root, _baseline_directory(root, unit)), None)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return "the unbound baseline's drop-in of %s not removed: %s" % (unit, exc)
    try:
        root_files.remove(fd, BASELINE_DROP_IN)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return "the unbound baseline's drop-in of %s not removed: %s" % (unit, exc.strerror or exc)
    finally:
        os.close(fd)
    try:
        root_files.remove_directory_under(root, _baseline_directory(root, unit))
    except OSError:
        pass  # not empty: someone else's drop-ins are there too
    return None


def _ab(result: Dict[str, Any], instance: Instance, before: Optional[List[float]], host: Host,
        first: bool) -> Dict[str, Any]:
    """The A/B verdict of a restarted instance that passed its gates (``ab_gate``; kept False: it got slower).
    A first deployment's verdict compares binding with the unbound default, and keeps the binding."""
    if not result["ok"] or before is None:
        return result
    try:
        verdict = judge(before, host.rates(instance.gate), instance.gate.min_gain_percent,
                        instance.gate.max_noise_percent)
    except NumaError as exc:
        return dict(result, ok=False, msg="%s: not measured after its restart: %s" % (instance.unit, exc))
    if first:
        verdict = dict(verdict, kept=True, baseline="unbound", msg=first_verdict(verdict))
    if verdict["kept"]:
        return dict(result, ab_gate=verdict, msg="%s; %s" % (result["msg"], verdict["msg"]))
    return dict(result, ab_gate=verdict, msg="%s: %s" % (instance.unit, verdict["msg"]))


def first_verdict(verdict: Mapping[str, Any]) -> str:
    """What a first deployment's gate says: binding against the unbound default, kept either way."""
    helps = verdict["gain_percent"] >= -verdict["noise_percent"]
    return ("unbound %.2f -> bound %.2f tokens/s (%+.1f %%, noise %.1f %%): first deployment, binding kept%s"
            % (verdict["before_tokens_per_second"], verdict["after_tokens_per_second"], verdict["gain_percent"],
               verdict["noise_percent"], "" if helps else "; SLOWER than the unbound default here: check the "
               "service's layout, threads and reserve_cpus"))


# --- taking a change back --------------------------------------------------------------------------------


def take_back(pending: Pending, options: Options, host: Host,
              instances: Mapping[str, Instance]) -> Tuple[Dict[str, str], List[str]]:
    """Put the host back as it was before ``pending``'s change: (unit -> what was done to it, every step that
    failed). Every step is tried whatever the ones before did: the instances that did not run before (first
    deployments among them) are stopped, every written file gets its previous text back, the unbound
    baseline's drop-ins go, systemd reloads, and the instances that ran restart on their previous files.
    With a failed reload no instance is restarted: systemd would start it on the change it still holds.
    ``instances`` say how to tell each is ready again (one not among them: when systemd says active)."""
    said = {}  # type: Dict[str, str]
    problems = []  # type: List[str]
    restart = [unit for unit in pending.touched if pending.units[unit] and unit not in pending.first]
    known = {unit: instances.get(unit, Instance(unit, None, None, None)) for unit in pending.touched}
    for unit in pending.touched:
        if unit in restart:
            continue
        # Out of traffic first: a stop is the end of a rollback, not a reason to drop its requests.
        drained = host.drain(known[unit])
        problem = host.systemctl("stop", unit)
        said[unit] = ("stopped: %s" % ("its first deployment, nothing to go back to" if unit in pending.first else
                                       "it did not run before the change") if not problem else "NOT stopped")
        said[unit] += "; %s, stopped all the same" % drained if drained and not problem else ""
        problems += [problem] if problem else []
        if not problem:
            host.stopped(unit)
    problems += ["%s not put back" % problem for problem in write_files(pending.files)]
    remove_made_directories(pending.made)  # after the files: a first deployment's drop-in directories are empty now
    problems += [problem for problem in (remove_baseline_drop_in(options.root, unit) for unit in pending.touched)
                 if problem]
    reload = host.systemctl("daemon-reload")
    for unit in restart:
        if reload:
            said[unit] = "NOT restarted: systemd did not reload"
            continue
        # A rollback restarts whatever its drain said: the host back as it was matters more than the requests.
        drained = host.drain(known[unit])
        refused = host.start("restart", unit)
        if refused:  # what runs now is unknown: the change's process may still be running
            said[unit] = "NOT restarted"
            problems.append("%s not back: %s" % (unit, refused))
            continue
        # Restarted on its previous files: not ready there either is the server's trouble, said, not retried.
        why = wait_ready(known[unit], options.ready_seconds, host)
        said[unit] = "back on its previous unit and plan, %s" % ("ready" if why is None else "NOT ready: %s" % why)
        said[unit] += "; %s, restarted all the same" % drained if drained else ""
        back = _back_into_traffic(known[unit], why, host)
        said[unit] += "; %s" % back if back else ""
    if reload:
        problems.append(reload + ("; %s not restarted" % ", ".join(restart) if restart else ""))
    for unit in pending.units:
        said.setdefault(unit, "left on its previous unit and plan")
    return said, problems


def _back_into_traffic(instance: Instance, why: Optional[str], host: Host) -> str:
    """What undraining an instance a rollback restarted did ("" without an undrain command): only a ready one is
    put back, and one that is not (or whose undrain fails) is owed its undrain."""
    if not instance.hooks.undrain:
        host.out.discard(instance.unit)
        return ""
    if why is not None:
        host.owed.add(instance.unit)
        return "NOT undrained: not ready"
    problem = host.undrain(instance)
    return "undrained" if problem is None else "NOT undrained: %s" % problem


# --- results ----------------------------------------------------------------------------------------------


def _result(instance: Instance, action: str, ok: bool, msg: str) -> Dict[str, Any]:
    return {"unit": instance.unit, "action": action, "ok": ok, "msg": msg, "rolled_back": None, "ab_gate": None}


class _Report:
    """What a deployment says: the services' files and holds, the instances, and what was taken back."""

    def __init__(self, changes: Sequence[Change], found: Mapping[str, Found], taken_back: Mapping[str, str],
                 earlier: Optional[Pending], warnings: List[str]) -> None:
        self.changes = changes
        self.found = found
        self.taken_back = taken_back
        self.earlier = earlier
        self.warnings = warnings

    def _base(self, changed: bool) -> Dict[str, Any]:
        services = {change.service: {"written": sorted(change.writes), "held": change.held}
                    for change in self.changes}
        diffs = [(path, self.found.get(path, Found(None)).text, text) for change in self.changes
                 for path, text in sorted(change.writes.items())]
        return {"changed": changed, "failed": False, "services": services, "diffs": diffs,
                "warnings": list(self.warnings), "instances": []}

    def _notes(self) -> List[str]:
        notes = ["%s: this change is not tried again: its A/B gate rolled it back before (ab-gates.json has the "
                 "figures); change the service, or remove %s from the plan directory, to measure it "
                 "again" % (change.service, rejected_record_name(change.service)) for change in self.changes if change.held]
        if self.earlier is not None:
            notes.insert(0, "an earlier change nobody judged was taken back first (%s)" % (
                "; ".join("%s %s" % item for item in sorted(self.taken_back.items())) or "no instance touched"
                if self.taken_back or not self.earlier.units else "would be taken back first"))
        return notes

    def summary(self, results: List[Dict[str, Any]], changed: bool, undo_problems: Sequence[str] = (),
                options: Optional[Options] = None) -> Dict[str, Any]:
        """The outcome; failed when a gate failed (not for a slower change taken back completely) or when a
        rollback left something undone."""
        failed = [result for result in results if not result["ok"] and not result.get("skipped")]
        slower = [result for result in results if not _kept(result)]
        if failed or slower:
            msg = "; ".join(result["msg"] for result in failed + slower) + "; the change was rolled back: " + "; ".join(
                "%s %s" % (result["unit"], result["rolled_back"]) for result in results if result["rolled_back"])
        else:
            msg = ("%d instance(s) started or restarted, each ready" % len(results) if results else
                   "every instance runs")
        if undo_problems and options is not None:
            msg += "; the rollback is INCOMPLETE: %s; %s" % ("; ".join(undo_problems), _marked(options))
        return dict(self._base(changed), failed=bool(failed or undo_problems), instances=results,
                    msg="; ".join(self._notes() + [msg]))

    def not_applied(self, problems: Sequence[str], undo_problems: Sequence[str], options: Options) -> Dict[str, Any]:
        """The change could not be written (or systemd not reloaded): nothing was restarted."""
        msg = "the change was not applied: %s; nothing was restarted, %s" % (
            "; ".join(problems), "its files were put back" if not undo_problems else
            "and putting its files back failed too: %s; %s" % ("; ".join(undo_problems), _marked(options)))
        return dict(self._base(True), failed=True, msg="; ".join(self._notes() + [msg]))
