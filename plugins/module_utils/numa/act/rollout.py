"""Restart a host's instances in batches, each gated on its server answering and its audit passing; an instance
that fails either goes back to its previous unit and plan, and the host stops there with the reason.

A placement change restarts the server: done for every instance at once, it takes the host's whole capacity down
together, and a bad change (a plan the server cannot run under, a binding that fails its audit) would then hold
every instance. Here instances go ``batch`` at a time, and the next batch starts only when each of this one
answers its readiness probe:

- an HTTP URL (the engine recipe's health endpoint on the instance's port, or the entry's own ``health_url``):
  ready on status 200 (llama-server and vLLM answer 503 while the model loads);
- a port without a URL (engine ``generic``): ready when it accepts a TCP connection;
- neither: ready when systemd reports the unit active.

A unit that systemd reports ``failed`` is not waited for. When an instance fails its gate, or its A/B gate
(ab_gate.py) finds it slower, the host's whole change goes back: every kept file gets its ``<file>.previous``
back (written by the role before it changed them; a unit template is shared by all the instances of its service,
so one instance cannot go back alone), the instances already (re)started restart on them, an instance with
nothing kept (its first deployment) is stopped rather than left crash-looping, and no further batch starts.
A failed gate fails the host; a slower placement is a verdict, not a failure, and the rejected files are kept as
``<file>.rejected``: the role does not try the same change again on the next run (it would be rolled back again).

An instance's first deployment has no placement of ours to compare with: its baseline is the same server started
once without one (the Linux default, through a runtime drop-in that numa-pin and systemd read), so the gate
measures the very gain binding claims. It reports that gain and keeps the binding either way: there is nothing of
ours to go back to, and a server never runs unbound beyond its measurement.
"""

import contextlib
import os
import socket
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple
from http import client as http_client
from urllib.parse import urlsplit

from .ab_gate import Gate, judge, measure
from ..base.errors import NumaError
from ..system import safe_fs
from .unit_text import BASELINE_DROP_IN, BASELINE_DROP_IN_TEXT, REJECTED_SUFFIX
from ..read.audit import UnitAudit, audit_units
from ..read.systemctl import CommandRunner, show_units

POLL_SECONDS = 2.0
PROBE_TIMEOUT_SECONDS = 2.0
PREVIOUS_SUFFIX = ".previous"
RUNTIME_UNIT_DIR = "run/systemd/system"
DONE = {"start": "started", "restart": "restarted"}


class Instance(NamedTuple):
    """One instance to start or restart, how to tell it is ready, how to audit it, and what to put back."""
    unit: str
    restart: bool  # restart (its unit or plan changed); else start it if it is not running
    url: Optional[str]
    port: Optional[int]
    audit: Optional[UnitAudit]
    kept: Tuple[str, ...]  # files the role changed and kept a <file>.previous of
    gate: Optional[Gate] = None  # measure tokens/s before and after a restart; keep the change only if not slower
    first: bool = False  # its first deployment: nothing of it was there before


Probe = Callable[["Instance"], Optional[str]]  # None when ready, else what it saw
Measure = Callable[[Gate], List[float]]  # tokens/s of the gate's rounds


def probe(instance: Instance) -> Optional[str]:
    """None when the instance answers (HTTP 200 from its URL, or a TCP connection to its port), else why not."""
    if instance.url:
        return _http_probe(instance.url)
    if instance.port:
        try:
            socket.create_connection(("127.0.0.1", instance.port), timeout=PROBE_TIMEOUT_SECONDS).close()
            return None
        except OSError as exc:
            return "port %d: %s" % (instance.port, exc.strerror or exc)
    return None


def _http_probe(url: str) -> Optional[str]:
    """None on HTTP 200 from ``url``, else what came back. http.client, not urllib: no proxy from the environment
    stands between a host and its own server."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "%s is not an http(s) URL" % url
    kind = http_client.HTTPSConnection if parts.scheme == "https" else http_client.HTTPConnection
    try:
        connection = kind(parts.hostname, parts.port, timeout=PROBE_TIMEOUT_SECONDS)
        try:
            connection.request("GET", (parts.path or "/") + ("?" + parts.query if parts.query else ""))
            status = connection.getresponse().status
        finally:
            connection.close()
    except (OSError, http_client.HTTPException, ValueError) as exc:
        return "%s: %s" % (url, exc)
    return None if status == 200 else "%s answered %d" % (url, status)


def roll(instances: Sequence[Instance], batch: int, ready_seconds: float, run: CommandRunner,
         root: str = "/", check: bool = False, settle_seconds: float = 3.0, answers: Probe = probe,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
         rates: Measure = measure) -> Dict[str, Any]:
    """Start or restart ``instances`` (those that need it) ``batch`` at a time behind their gates.

    Returns {"changed", "failed", "msg", "instances": [{unit, action, ok, msg, rolled_back}]}; in check mode
    only what would be done.
    """
    if batch < 1:
        raise NumaError("restart batch %r: give 1 or more instances at a time" % batch)
    states = show_units([instance.unit for instance in instances], run)
    # A changed instance that is not running is started, as one that was never deployed (a dry run says so).
    running = {instance.unit for instance in instances if states[instance.unit].get("ActiveState") == "active"}
    due = [(instance, "restart" if instance.unit in running else "start") for instance in instances
           if instance.restart or instance.unit not in running]
    results = []  # type: List[Dict[str, Any]]
    if check:
        results = [_result(instance, action, True, "would %s %s" % (action, instance.unit)) for instance, action in due]
        return _summary(results, bool(due))
    done = []  # type: List[Tuple[Instance, str]]
    for start in range(0, len(due), batch):
        group = due[start:start + batch]
        # A first deployment restarts (its plan was written) or starts, but has no placement of ours to measure.
        baselines = {instance.unit: _unbound_baseline(instance, ready_seconds, run, root, answers, clock, sleep, rates)
                     if instance.first else _baseline(instance, rates) for instance, action in group
                     if instance.gate and (action == "restart" or instance.first)}
        refused = {instance.unit: _start(run, action, instance.unit) for instance, action in group}
        judged = [_ab(result, instance, baselines.get(instance.unit), rates) for result, (instance, _action) in
                  zip(_gate(group, refused, ready_seconds, run, root, settle_seconds, answers, clock, sleep), group)]
        results += judged
        done += group
        if any(not result["ok"] or (result["ab_gate"] or {}).get("kept") is False for result in judged):
            results += [dict(_result(instance, action, False, "not %s: the change was rolled back" % DONE[action]),
                             skipped=True) for instance, action in due[start + batch:]]
            failed = any(not result["ok"] for result in judged)
            undone = undo(done, due[start + batch:], ready_seconds, run, answers, clock, sleep, rejected=not failed)
            for result in results:
                result["rolled_back"] = undone.get(result["unit"])
            break
    return _summary(results, bool(due))


def _start(run: CommandRunner, action: str, unit: str) -> Optional[str]:
    """``systemctl start|restart`` the unit; None, or what systemctl said when it refused (a unit whose start
    fails at once: the gate fails it without waiting)."""
    try:
        _systemctl(run, action, unit)
    except NumaError as exc:
        return str(exc)
    return None


def _gate(group: Sequence[Tuple[Instance, str]], refused: Mapping[str, Optional[str]], ready_seconds: float,
          run: CommandRunner, root: str, settle_seconds: float, answers: Probe, clock: Callable[[], float],
          sleep: Callable[[float], None]) -> List[Dict[str, Any]]:
    waits = {instance.unit: refused[instance.unit] or wait_ready(instance, ready_seconds, run, answers, clock, sleep)
             for instance, _action in group}
    audits = [instance.audit for instance, _action in group if instance.audit and waits[instance.unit] is None]
    reports = {report["unit"]: report for report in
               (audit_units(root, audits, ready_seconds, settle_seconds, run=run, clock=clock, sleep=sleep)
                if audits else [])}
    results = []
    for instance, action in group:
        why = waits[instance.unit]
        if why is None and instance.unit in reports and not reports[instance.unit]["ok"]:
            why = "its audit failed: %s" % reports[instance.unit]["msg"]
        if why is None:
            results.append(_result(instance, action, True, "%s and ready" % DONE[action]))
            continue
        results.append(_result(instance, action, False, "%s: %s" % (instance.unit, why)))
    return results


def _baseline(instance: Instance, rates: Measure) -> Any:
    """The running instance's rates before its restart, or why there are none (the gate then keeps the change)."""
    try:
        return rates(instance.gate)
    except NumaError as exc:
        return "no baseline: %s" % exc


def _unbound_baseline(instance: Instance, ready_seconds: float, run: CommandRunner, root: str, answers: Probe,
                      clock: Callable[[], float], sleep: Callable[[float], None], rates: Measure) -> Any:
    """A first deployment's rates started once without placement (the Linux default), or why there are none;
    the instance is stopped again, its runtime drop-in removed, whatever happened."""
    directory = os.path.join(root, RUNTIME_UNIT_DIR, instance.unit + ".d")
    try:
        _write_baseline_drop_in(root, instance.unit)
        try:
            _systemctl(run, "daemon-reload")
            why = _start(run, "start", instance.unit) or wait_ready(instance, ready_seconds, run, answers, clock,
                                                                    sleep)
            return "no unbound baseline: %s" % why if why else rates(instance.gate)
        finally:
            try:
                _systemctl(run, "stop", instance.unit)
            finally:
                os.unlink(os.path.join(directory, BASELINE_DROP_IN))
                with contextlib.suppress(OSError):  # not empty: someone else's drop-ins are there too
                    os.rmdir(directory)
                _systemctl(run, "daemon-reload")
    except (NumaError, OSError) as exc:
        return "no unbound baseline: %s" % exc


def _write_baseline_drop_in(root: str, unit: str) -> None:
    """The runtime drop-in of the unbound baseline, in /run (gone at a reboot), written in directories root alone
    may write, reached without following a link."""
    names = safe_fs.names_of(root, os.path.join(RUNTIME_UNIT_DIR, unit + ".d"))
    fd, problem, _owner = safe_fs.open_directory(root, names, safe_fs.PRIVATE_DIR, create=True)
    if problem:
        raise NumaError("refusing %s for the unbound baseline: %s" % (problem.path, problem.why))
    try:
        safe_fs.write_atomically(fd, BASELINE_DROP_IN, BASELINE_DROP_IN_TEXT.encode("utf-8"), 0o644,
                                 "." + BASELINE_DROP_IN)
    finally:
        os.close(fd)


def _ab(result: Dict[str, Any], instance: Instance, before: Any, rates: Measure) -> Dict[str, Any]:
    """The A/B verdict of a restarted instance that passed its gates (``ab_gate``; kept False: it got slower).
    A first deployment's verdict compares binding with the unbound default, and keeps the binding."""
    if not result["ok"] or before is None:
        return result
    if isinstance(before, str):
        return dict(result, ab_gate={"kept": True, "msg": before})
    try:
        verdict = judge(before, rates(instance.gate), instance.gate.min_gain_percent)
    except NumaError as exc:
        return dict(result, ok=False, msg="%s: not measured after its restart: %s" % (instance.unit, exc))
    if instance.first:
        verdict = dict(verdict, kept=True, baseline="unbound", msg=first_verdict(verdict))
        return dict(result, ab_gate=verdict, msg="%s; %s" % (result["msg"], verdict["msg"]))
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


def wait_ready(instance: Instance, ready_seconds: float, run: CommandRunner, answers: Probe = probe,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
               ) -> Optional[str]:
    """None once the instance is active and answers, else why not (its unit failed, or time ran out)."""
    deadline = clock() + ready_seconds
    seen = "not started"
    while True:
        props = show_units([instance.unit], run)[instance.unit]
        state = props.get("ActiveState")
        if state == "failed":
            return "its unit failed (%s): see `journalctl -u %s`" % (props.get("Result") or "failed", instance.unit)
        if state == "active":
            seen = answers(instance) or ""
            if not seen:
                return None
        else:
            seen = "unit %s" % state
        if clock() >= deadline:
            return "not ready after %.0f s (%s)" % (ready_seconds, seen)
        sleep(POLL_SECONDS)


def undo(done: Sequence[Tuple[Instance, str]], pending: Sequence[Tuple[Instance, str]], ready_seconds: float,
         run: CommandRunner, answers: Probe = probe, clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep, rejected: bool = False) -> Dict[str, str]:
    """Take the host's whole change back: every kept file gets its ``.previous`` back (a unit template is shared
    by all the instances of its service, so one instance alone cannot go back), the instances already
    (re)started restart on them, a first deployment is stopped, and the pending ones are left as they run.
    ``rejected`` (the A/B gate's verdict, not a failure): the new files are kept as ``<file>.rejected``, for the
    role not to try the same change again. Returns unit -> what was done to it."""
    restored = False
    for instance, _action in list(done) + list(pending):
        for path in instance.kept:
            if os.path.isfile(path + PREVIOUS_SUFFIX):
                if rejected:
                    os.replace(path, path + REJECTED_SUFFIX)
                os.replace(path + PREVIOUS_SUFFIX, path)
                restored = True
    if restored:
        _systemctl(run, "daemon-reload")
    said = {}
    for instance, _action in done:
        if not instance.kept:
            _systemctl(run, "stop", instance.unit)
            said[instance.unit] = "stopped: its first deployment, nothing to go back to"
            continue
        _systemctl(run, "restart", instance.unit)
        why = wait_ready(instance, ready_seconds, run, answers, clock, sleep)
        said[instance.unit] = "back on its previous unit and plan, %s" % ("ready" if why is None else
                                                                          "NOT ready: %s" % why)
    for instance, _action in pending:
        said[instance.unit] = "left on its previous unit and plan"
    return said


def _systemctl(run: CommandRunner, action: str, unit: Optional[str] = None) -> None:
    argv = ["systemctl", action] + (["--", unit] if unit else [])
    rc, out, err = run(argv)
    if rc != 0:
        raise NumaError("%s failed (rc %d): %s" % (" ".join(argv), rc, (err or out).strip()))


def _result(instance: Instance, action: str, ok: bool, msg: str) -> Dict[str, Any]:
    return {"unit": instance.unit, "action": action, "ok": ok, "msg": msg, "rolled_back": None, "ab_gate": None}


def _summary(results: List[Dict[str, Any]], changed: bool) -> Dict[str, Any]:
    # A change the A/B gate rolled back is a verdict, not a failure: the instances run, on their previous placement.
    failed = [result for result in results if not result["ok"] and not result.get("skipped")]
    slower = [result for result in results if (result["ab_gate"] or {}).get("kept") is False]
    if failed or slower:
        msg = "; ".join(result["msg"] for result in failed + slower) + "; the change was rolled back: " + "; ".join(
            "%s %s" % (result["unit"], result["rolled_back"]) for result in results if result["rolled_back"])
    else:
        msg = "%d instance(s) started or restarted, each ready" % len(results) if results else "every instance runs"
    return {"changed": changed, "failed": bool(failed), "msg": msg, "instances": results}
