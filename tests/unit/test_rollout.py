"""numa_rollout's core (module_utils/numa/act/rollout.py): batches, readiness gates, audits and rollbacks, with a
fake systemd and fake servers."""
import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import ab_gate, rollout
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.engines import health_url
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError


class FakeHost:
    """systemctl as a dict of unit states; ``boots`` says how each unit comes up after a (re)start."""

    def __init__(self, active=(), boots=None):
        self.state = {unit: "active" for unit in active}
        self.boots = boots or {}
        self.calls = []
        self.now = 0.0

    def run(self, argv):
        self.calls.append(argv[1:] if argv[1] != "show" else None)
        if argv[1] == "show":
            units = argv[argv.index("--") + 1:]
            return 0, "\n\n".join("Id=%s\nActiveState=%s\nResult=%s\nMainPID=0" % (
                unit, self.state.get(unit, "inactive"), "exit-code" if self.state.get(unit) == "failed" else
                "success") for unit in units) + "\n", ""
        if argv[1] in ("start", "restart"):
            self.state[argv[-1]] = self.boots.get(argv[-1], "active")
            if self.state[argv[-1]] == "failed":
                return 1, "", "Job for %s failed because the control process exited with error code." % argv[-1]
        elif argv[1] == "stop":
            self.state[argv[-1]] = "inactive"
        return 0, "", ""

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def instance(name, restart=True, kept=()):
    return rollout.Instance(name, restart, None, None, None, tuple(kept))


def actions(host):
    return [call for call in host.calls if call]


def test_restarts_go_one_at_a_time_and_only_where_needed():
    host = FakeHost(active=["a@0.service", "a@1.service", "a@2.service"])
    result = rollout.roll([instance("a@0.service"), instance("a@1.service", restart=False), instance("a@2.service")],
                          1, 60, host.run, answers=lambda i: None, clock=host.clock, sleep=host.sleep)
    assert not result["failed"] and result["changed"]
    assert actions(host) == [["restart", "--", "a@0.service"], ["restart", "--", "a@2.service"]]
    assert [r["msg"] for r in result["instances"]] == ["restarted and ready"] * 2


def test_the_next_batch_waits_for_the_server_to_answer():
    host = FakeHost()
    seen = []

    def answers(inst):
        seen.append((inst.unit, host.now, list(actions(host))))
        return None if host.now >= 6 else "http://127.0.0.1:8080/health answered 503"
    result = rollout.roll([instance("a@0.service", restart=False), instance("a@1.service", restart=False)], 1, 60,
                          host.run, answers=answers, clock=host.clock, sleep=host.sleep)
    assert not result["failed"]
    # a@1 was started only after a@0 answered (at 6 s), never while it loaded.
    assert all(["start", "--", "a@1.service"] not in done for unit, _now, done in seen if unit == "a@0.service")
    assert actions(host) == [["start", "--", "a@0.service"], ["start", "--", "a@1.service"]]


def test_a_server_that_never_answers_is_rolled_back_and_the_rest_are_left_alone(tmp_path):
    unit_file = tmp_path / "a@.service"
    unit_file.write_text("new\n")
    (tmp_path / "a@.service.previous").write_text("old\n")
    host = FakeHost(active=["a@0.service", "a@1.service"])
    result = rollout.roll([instance("a@0.service", kept=[str(unit_file)]), instance("a@1.service")], 1, 10,
                          host.run, answers=lambda i: "port 8080: Connection refused", clock=host.clock,
                          sleep=host.sleep)
    assert result["failed"]
    assert unit_file.read_text() == "old\n" and not (tmp_path / "a@.service.previous").exists()
    assert actions(host) == [["restart", "--", "a@0.service"], ["daemon-reload"], ["restart", "--", "a@0.service"]]
    first, second = result["instances"]
    assert first["msg"] == "a@0.service: not ready after 10 s (port 8080: Connection refused)"
    assert first["rolled_back"].startswith("back on its previous unit and plan, NOT ready: not ready after 10 s")
    assert second == {"unit": "a@1.service", "action": "restart", "ok": False, "ab_gate": None, "skipped": True,
                      "msg": "not restarted: the change was rolled back",
                      "rolled_back": "left on its previous unit and plan"}
    assert result["msg"].startswith("a@0.service: not ready after 10 s")


def test_a_rollback_takes_the_whole_change_back_also_from_instances_that_passed(tmp_path):
    template = tmp_path / "a@.service"
    plans = [tmp_path / ("a@%d.plan.json" % i) for i in range(2)]
    for path in [template] + plans:
        path.write_text("new\n")
        (tmp_path / (path.name + ".previous")).write_text("old\n")
    host = FakeHost(active=["a@0.service", "a@1.service"], boots={})
    ready = iter([None, "answered 503"] + [None] * 10)
    result = rollout.roll([instance("a@0.service", kept=[str(template), str(plans[0])]),
                           instance("a@1.service", kept=[str(template), str(plans[1])])], 1, 0, host.run,
                          answers=lambda i: next(ready), clock=host.clock, sleep=host.sleep)
    assert result["failed"]
    assert [path.read_text() for path in [template] + plans] == ["old\n"] * 3
    assert actions(host)[-3:] == [["daemon-reload"], ["restart", "--", "a@0.service"],
                                  ["restart", "--", "a@1.service"]]
    assert [r["rolled_back"] for r in result["instances"]] == ["back on its previous unit and plan, ready"] * 2


def test_a_failed_unit_is_not_waited_for_and_a_first_deployment_is_stopped():
    host = FakeHost(boots={"a@0.service": "failed"})
    result = rollout.roll([instance("a@0.service", restart=False)], 1, 600, host.run, answers=lambda i: None,
                          clock=host.clock, sleep=host.sleep)
    assert result["failed"] and host.now == 0
    (only,) = result["instances"]
    assert only["msg"] == ("a@0.service: systemctl start -- a@0.service failed (rc 1): Job for a@0.service failed "
                           "because the control process exited with error code.")
    assert only["rolled_back"] == "stopped: its first deployment, nothing to go back to"
    assert host.state["a@0.service"] == "inactive"


def test_a_failed_audit_rolls_the_instance_back(monkeypatch):
    host = FakeHost(active=["a@0.service"])
    audit = rollout.UnitAudit("a@0.service", None, 99.0, "all")
    monkeypatch.setattr(rollout, "audit_units", lambda *args, **kwargs: [
        {"unit": "a@0.service", "ok": False, "msg": "a@0.service: 61.0% of its pages on node 0, below 99%"}])
    result = rollout.roll([rollout.Instance("a@0.service", True, None, None, audit, ())], 1, 60, host.run,
                          answers=lambda i: None, clock=host.clock, sleep=host.sleep)
    assert result["failed"] and "its audit failed: a@0.service: 61.0% of its pages" in result["msg"]


def test_batches_of_two_restart_together():
    host = FakeHost(active=["a@%d.service" % i for i in range(3)])
    rollout.roll([instance("a@%d.service" % i) for i in range(3)], 2, 60, host.run, answers=lambda i: None,
                 clock=host.clock, sleep=host.sleep)
    assert actions(host) == [["restart", "--", "a@0.service"], ["restart", "--", "a@1.service"],
                             ["restart", "--", "a@2.service"]]


def test_a_changed_instance_that_is_not_running_is_started():
    host = FakeHost(active=["a@1.service"])
    result = rollout.roll([instance("a@0.service"), instance("a@1.service")], 1, 60, host.run, check=True)
    assert [entry["msg"] for entry in result["instances"]] == ["would start a@0.service", "would restart a@1.service"]


def test_check_mode_says_what_it_would_do_and_does_nothing():
    host = FakeHost(active=["a@0.service"])
    result = rollout.roll([instance("a@0.service"), instance("a@1.service", restart=False),
                           instance("a@0.service", restart=False)], 1, 60, host.run, check=True)
    assert actions(host) == [] and result["changed"]
    assert [(r["unit"], r["msg"]) for r in result["instances"]] == [
        ("a@0.service", "would restart a@0.service"), ("a@1.service", "would start a@1.service")]


def test_nothing_to_do_is_not_a_change_and_a_zero_batch_is_refused():
    host = FakeHost(active=["a@0.service"])
    assert rollout.roll([instance("a@0.service", restart=False)], 1, 60, host.run)["changed"] is False
    with pytest.raises(NumaError, match="give 1 or more"):
        rollout.roll([], 0, 60, host.run)


@pytest.mark.parametrize("engine, port, given, wanted", [
    ("llama.cpp", 8080, None, "http://127.0.0.1:8080/health"),
    ("vllm", 8000, None, "http://127.0.0.1:8000/health"),
    ("generic", 9000, None, None),
    ("generic", 9000, "http://127.0.0.1:{port}/ready", "http://127.0.0.1:9000/ready"),
    ("llama.cpp", None, None, None),
])
def test_the_readiness_url_comes_from_the_entry_or_the_engine(engine, port, given, wanted):
    assert health_url(engine, port, given) == wanted


def test_the_probe_reads_the_status_and_a_closed_port(tmp_path):
    import http.server
    import threading

    codes = [503, 200]

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(codes.pop(0))
            self.end_headers()

        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        url = "http://127.0.0.1:%d/health" % port
        ready = rollout.Instance("a@0.service", True, url, port, None, ())
        assert rollout.probe(ready) == "%s answered 503" % url
        assert rollout.probe(ready) is None
        assert rollout.probe(ready._replace(url=None)) is None  # the port accepts a connection
    finally:
        server.shutdown()
        server.server_close()
    assert rollout.probe(ready._replace(url=None)).startswith("port %d: " % port)


# --- the A/B gate ---------------------------------------------------------------------------------------------

GATE = ab_gate.Gate("http://127.0.0.1:8080", "llama.cpp", "Hi", 8, 3, None)


def gated_roll(tmp_path, before, after, min_gain=None):
    unit_file = tmp_path / "a@.service"
    unit_file.write_text("new\n")
    (tmp_path / "a@.service.previous").write_text("old\n")
    host = FakeHost(active=["a@0.service"])
    measured = iter([before, after])
    gate = GATE._replace(min_gain_percent=min_gain)
    result = rollout.roll([rollout.Instance("a@0.service", True, None, None, None, (str(unit_file),), gate)], 1, 60,
                          host.run, answers=lambda i: None, clock=host.clock, sleep=host.sleep,
                          rates=lambda g: next(measured))
    return result, unit_file.read_text(), actions(host)


def test_a_faster_placement_is_kept(tmp_path):
    result, unit, done = gated_roll(tmp_path, [4.0, 4.2, 4.1], [7.9, 8.1, 8.0])
    (only,) = result["instances"]
    assert not result["failed"] and unit == "new\n" and only["rolled_back"] is None
    assert only["ab_gate"]["kept"] and only["ab_gate"]["gain_percent"] == pytest.approx(95.12, abs=0.01)
    assert done == [["restart", "--", "a@0.service"]]


def test_a_slower_placement_is_rolled_back_and_the_host_does_not_fail(tmp_path):
    result, unit, done = gated_roll(tmp_path, [8.0, 8.1, 7.9], [4.0, 4.1, 3.9])
    (only,) = result["instances"]
    assert not result["failed"] and result["changed"] and unit == "old\n"
    assert done == [["restart", "--", "a@0.service"], ["daemon-reload"], ["restart", "--", "a@0.service"]]
    assert only["msg"].startswith("a@0.service: 8.00 -> 4.00 tokens/s (-50.0 %, noise 5.0 %, capped): rolled back")


def test_a_change_within_the_noise_is_kept_unless_a_gain_is_demanded(tmp_path):
    assert gated_roll(tmp_path, [8.0, 9.0, 7.0], [7.8, 8.6, 7.2])[0]["instances"][0]["ab_gate"]["kept"]
    result, unit, _ = gated_roll(tmp_path, [8.0, 9.0, 7.0], [7.8, 8.6, 7.2], min_gain=5.0)
    assert not result["instances"][0]["ab_gate"]["kept"] and unit == "old\n"


def test_the_judge_and_the_noise_band():
    verdict = ab_gate.judge([10.0, 10.0, 10.0], [9.0, 9.0, 9.0], None)
    assert (verdict["gain_percent"], verdict["noise_percent"], verdict["kept"]) == (-10.0, 1.0, False)  # the floor
    assert ab_gate.robust_sigma([9.0, 10.0, 11.0]) == pytest.approx(1.4826 * 1.495)
    assert ab_gate.judge([10.0, 11.0], [10.0, 11.0], None)["kept"]


def test_measure_asks_llama_server_and_an_openai_server_the_same_question():
    asked = []

    def ask(url, seconds, body):
        path = url[len(GATE.base_url):]
        asked.append((path, dict(body or {})))
        if path == "/v1/models":
            return ab_gate.engine_http.Answer(200, b'{"data": [{"id": "m"}]}')
        if path == "/completion":
            return ab_gate.engine_http.Answer(200, b'{"timings": {"predicted_per_second": 5.0}}')
        return ab_gate.engine_http.Answer(200, b'{"usage": {"completion_tokens": 8}}')
    ticks = iter(range(100))
    assert ab_gate.measure(GATE, ask) == [5.0, 5.0, 5.0] and len(asked) == 4  # one warm-up round left out
    assert asked[0] == ("/completion", {"prompt": "Hi", "n_predict": 8, "ignore_eos": True, "cache_prompt": False})
    asked.clear()
    rates = ab_gate.measure(GATE._replace(api="openai"), ask, clock=lambda: float(next(ticks)))
    assert rates == [8.0, 8.0, 8.0] and asked[0] == ("/v1/models", {})
    assert asked[1] == ("/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 8, "ignore_eos": True,
                                            "temperature": 0})


def test_a_unit_that_fails_after_it_started_is_not_waited_for():
    host = FakeHost(active=["a@0.service"])
    started = host.run

    def run(argv):
        done = started(argv)
        if argv[1] == "restart":
            host.state[argv[-1]] = "failed"  # exec'd, then exited: systemctl said nothing
        return done
    result = rollout.roll([instance("a@0.service", kept=["/nonexistent/a@.service"])], 1, 600, run,
                          answers=lambda i: None, clock=host.clock, sleep=host.sleep)
    assert host.now == 0 and result["failed"]
    assert result["instances"][0]["msg"] == "a@0.service: its unit failed (exit-code): see `journalctl -u a@0.service`"


def test_a_slower_change_is_kept_as_rejected_and_a_failed_one_is_not(tmp_path):
    gated_roll(tmp_path, [8.0, 8.1, 7.9], [4.0, 4.1, 3.9])
    assert (tmp_path / "a@.service.rejected").read_text() == "new\n"
    assert (tmp_path / "a@.service").read_text() == "old\n" and not (tmp_path / "a@.service.previous").exists()
    (tmp_path / "a@.service.rejected").unlink()
    test_a_server_that_never_answers_is_rolled_back_and_the_rest_are_left_alone(tmp_path)
    assert not (tmp_path / "a@.service.rejected").exists()  # a failure may be passing: it is tried again


def first_roll(tmp_path, baseline, bound, boots=None, restart=False):
    """A first deployment of a@0 behind the gate: the unbound baseline measured at ``baseline``, bound at ``bound``;
    the drop-in each systemctl call saw."""
    host = FakeHost(boots=boots)
    drop_in = tmp_path / "run/systemd/system/a@0.service.d" / rollout.BASELINE_DROP_IN
    seen = []
    run = host.run

    def watched(argv):
        seen.append((argv[1], drop_in.is_file()))
        return run(argv)
    measured = iter([baseline, bound])
    result = rollout.roll([rollout.Instance("a@0.service", restart, None, None, None, (), GATE, first=True)], 1, 60,
                          watched, root=str(tmp_path), answers=lambda i: None, clock=host.clock, sleep=host.sleep,
                          rates=lambda g: next(measured))
    return result, [call for call in seen if call[0] != "show"], drop_in


@pytest.mark.parametrize("restart", [False, True])  # True: the role wrote its first plan and unit
def test_a_first_deployment_is_measured_unbound_first_then_bound_and_kept(tmp_path, restart):
    result, calls, drop_in = first_roll(tmp_path, [4.0, 4.2, 4.1], [7.9, 8.1, 8.0], restart=restart)
    assert calls == [("daemon-reload", True), ("start", True), ("stop", True), ("daemon-reload", False),
                     ("start", False)]
    assert not drop_in.exists() and not drop_in.parent.exists()
    (only,) = result["instances"]
    assert not result["failed"] and only["ab_gate"]["kept"] and only["ab_gate"]["baseline"] == "unbound"
    assert only["ab_gate"]["msg"] == ("unbound 4.10 -> bound 8.00 tokens/s (+95.1 %, noise 5.0 %): first deployment, "
                                      "binding kept")


def test_binding_slower_than_the_default_is_said_and_kept_on_a_first_deployment(tmp_path):
    result, _calls, _drop_in = first_roll(tmp_path, [8.0, 8.1, 7.9], [4.0, 4.1, 3.9])
    (only,) = result["instances"]
    assert not result["failed"] and only["ab_gate"]["kept"] and only["rolled_back"] is None
    assert "SLOWER than the unbound default here" in only["ab_gate"]["msg"]


def test_an_unbound_start_that_fails_leaves_no_drop_in_and_the_bound_start_goes_on(tmp_path):
    host_boots = {"a@0.service": "failed"}
    result, calls, drop_in = first_roll(tmp_path, [1.0], [1.0], boots=host_boots)
    assert not drop_in.exists() and ("daemon-reload", False) in calls
    (only,) = result["instances"]
    assert result["failed"] and only["msg"].startswith("a@0.service: systemctl start -- a@0.service failed")


def test_the_baseline_drop_in_is_not_written_through_a_planted_link(tmp_path):
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run/systemd/system/a@0.service.d").symlink_to(tmp_path / "elsewhere")
    result, calls, _drop_in = first_roll(tmp_path, [1.0], [2.0, 2.0])
    assert calls == [("start", False)] and not list((tmp_path / "elsewhere").iterdir())
    assert result["instances"][0]["ab_gate"]["msg"].startswith("no unbound baseline: ")
