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

A unit that systemd reports ``failed`` is not waited for. A rolled-back instance gets its kept files back
(``<file>.previous``, written by the role before it changed them), systemd reloads them and the instance restarts
on them; an instance with nothing kept (its first deployment) is stopped rather than left crash-looping.
"""

import os
import socket
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple
from http import client as http_client
from urllib.parse import urlsplit

from .ab_gate import Gate, judge, measure
from ..base.errors import NumaError
from ..read.audit import UnitAudit, audit_units
from ..read.systemctl import CommandRunner, show_units

POLL_SECONDS = 2.0
PROBE_TIMEOUT_SECONDS = 2.0
PREVIOUS_SUFFIX = ".previous"
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
    due = [(instance, "restart" if instance.restart else "start") for instance in instances
           if instance.restart or states[instance.unit].get("ActiveState") != "active"]
    results = []  # type: List[Dict[str, Any]]
    if check:
        results = [_result(instance, action, True, "would %s %s" % (action, instance.unit)) for instance, action in due]
        return _summary(results, bool(due))
    for start in range(0, len(due), batch):
        group = due[start:start + batch]
        baselines = {instance.unit: _baseline(instance, rates) for instance, action in group
                     if instance.gate and action == "restart"}
        for instance, action in group:
            _systemctl(run, action, instance.unit)
        gated = _gate(group, ready_seconds, run, root, settle_seconds, answers, clock, sleep)
        results += [_ab(result, instance, baselines.get(instance.unit), run, rates)
                    for result, (instance, _action) in zip(gated, group)]
        if not all(result["ok"] for result in results):
            skipped = due[start + batch:]
            results += [_result(instance, action, False, "not %s: an earlier instance failed its gate" % DONE[action])
                        for instance, action in skipped]
            break
    return _summary(results, bool(due))


def _gate(group: Sequence[Tuple[Instance, str]], ready_seconds: float, run: CommandRunner, root: str,
          settle_seconds: float, answers: Probe, clock: Callable[[], float],
          sleep: Callable[[float], None]) -> List[Dict[str, Any]]:
    waits = {instance.unit: wait_ready(instance, ready_seconds, run, answers, clock, sleep)
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
        results.append(dict(_result(instance, action, False, "%s: %s" % (instance.unit, why)),
                            rolled_back=roll_back(instance, run)))
    return results


def _baseline(instance: Instance, rates: Measure) -> Any:
    """The running instance's rates before its restart, or why there are none (the gate then keeps the change)."""
    try:
        return rates(instance.gate)
    except NumaError as exc:
        return "no baseline: %s" % exc


def _ab(result: Dict[str, Any], instance: Instance, before: Any, run: CommandRunner, rates: Measure
        ) -> Dict[str, Any]:
    """The A/B verdict of a restarted instance that passed its gates: rolled back when it got slower."""
    if not result["ok"] or before is None:
        return result
    if isinstance(before, str):
        return dict(result, ab_gate={"kept": True, "msg": before})
    try:
        verdict = judge(before, rates(instance.gate), instance.gate.min_gain_percent)
    except NumaError as exc:
        return dict(result, ok=False, msg="%s: not measured after its restart: %s" % (instance.unit, exc),
                    rolled_back=roll_back(instance, run))
    if verdict["kept"]:
        return dict(result, ab_gate=verdict, msg="%s; %s" % (result["msg"], verdict["msg"]))
    return dict(result, ab_gate=verdict, msg="%s: %s" % (instance.unit, verdict["msg"]),
                rolled_back=roll_back(instance, run))


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


def roll_back(instance: Instance, run: CommandRunner) -> str:
    """Put back the instance's kept files and restart it on them; stop it when nothing was kept. Says what it did."""
    restored = [path for path in instance.kept if os.path.isfile(path + PREVIOUS_SUFFIX)]
    if not restored:
        _systemctl(run, "stop", instance.unit)
        return "stopped: its first deployment, nothing to go back to"
    for path in restored:
        os.replace(path + PREVIOUS_SUFFIX, path)
    _systemctl(run, "daemon-reload")
    _systemctl(run, "restart", instance.unit)
    return "back on its previous %s, restarted" % ", ".join(restored)


def _systemctl(run: CommandRunner, action: str, unit: Optional[str] = None) -> None:
    argv = ["systemctl", action] + (["--", unit] if unit else [])
    rc, out, err = run(argv)
    if rc != 0:
        raise NumaError("%s failed (rc %d): %s" % (" ".join(argv), rc, (err or out).strip()))


def _result(instance: Instance, action: str, ok: bool, msg: str) -> Dict[str, Any]:
    return {"unit": instance.unit, "action": action, "ok": ok, "msg": msg, "rolled_back": None, "ab_gate": None}


def _summary(results: List[Dict[str, Any]], changed: bool) -> Dict[str, Any]:
    # A change the A/B gate rolled back is a verdict, not a failure: the instance runs, on its previous placement.
    failed = [result for result in results if not result["ok"] and result["rolled_back"]]
    msg = "; ".join("%s (%s)" % (result["msg"], result["rolled_back"]) for result in failed) if failed else (
        "%d instance(s) started or restarted, each ready" % len(results) if results else "every instance runs")
    return {"changed": changed, "failed": bool(failed), "msg": msg, "instances": results}
