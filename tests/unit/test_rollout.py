"""numa_rollout's core (module_utils/numa/act/rollout.py and decide/rollout.py): a host's deployment as one change
that ends applied and judged, taken back completely, or recorded for the next run to take back - with a fake
systemd whose steps fail on cue, and servers whose answers follow the files on disk."""
import json
import os
import time

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import change_files, rollout
from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import ab_gate
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.engines import health_url
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import Found, Service, decide, digest

OLD, NEW, BROKEN = "old placement\n", "new placement\n", "broken placement\n"


class FakeSystemd:
    """systemctl as a dict of unit states. A (re)started unit comes up as ``boots(unit)`` says (default: from the
    unit template on disk: "failed" when it holds BROKEN). ``fails``: (verb, unit or None) -> how many of the next
    such calls fail. ``journal``: unit -> its lines, the server's own, or ("systemd", line) for systemd's."""

    def __init__(self, active=(), boots=None, fails=None, template=None):
        self.state = {unit: "active" for unit in active}
        self.sub = {}
        self.restarts = {}
        self.boots = boots or (lambda unit: "failed" if template and _text(template) == BROKEN else "active")
        self.fails = dict(fails or {})
        self.journal = {}
        self.journal_calls = []
        self.calls = []
        self.now = 0.0

    def run(self, argv):
        if argv[0] == "journalctl":
            self.journal_calls.append(argv)
            unit = argv[argv.index("-u") + 1]
            return 0, "".join(json.dumps({"MESSAGE": line[1], "_SYSTEMD_UNIT": "init.scope", "UNIT": unit}
                                         if isinstance(line, tuple) else {"MESSAGE": line, "_SYSTEMD_UNIT": unit})
                              + "\n" for line in self.journal.get(unit, [])), ""
        verb, unit = argv[1], argv[-1] if "--" in argv else None
        if verb == "show":
            units = argv[argv.index("--") + 1:]
            return 0, "\n\n".join(self._show(unit) for unit in units) + "\n", ""
        self.calls.append([verb] + ([unit] if unit else []))
        for key in ((verb, unit), (verb, None)):
            if self.fails.get(key):
                self.fails[key] -= 1
                return 1, "", "Failed to %s: Access denied (on cue)" % verb
        if verb in ("start", "restart"):
            self.state[unit] = self.boots(unit)
            if self.state[unit] == "failed":
                return 1, "", "Job for %s failed because the control process exited with error code." % unit
        elif verb == "stop":
            self.state[unit] = "inactive"
        elif verb == "is-active" and self.state.get(unit) != "active":
            return 3, self.state.get(unit, "inactive") + "\n", ""
        return 0, "", ""

    def _show(self, unit):
        state = self.state.get(unit, "inactive")
        return "Id=%s\nActiveState=%s\nSubState=%s\nResult=%s\nMainPID=0\nNRestarts=%d\nExecMainStatus=%s" % (
            unit, state, self.sub.get(unit, "running" if state == "active" else "dead"),
            "exit-code" if state == "failed" else "success", self.restarts.get(unit, 0),
            "1" if state == "failed" else "0")

    def actions(self):
        """The calls that change a unit (every start is preceded by its reset-failed, checked on its own)."""
        return [call for call in self.calls if call[0] != "reset-failed"]

    def host(self, answers=None, rates=None):
        return rollout.Host(self.run, answers or (lambda instance, seconds: None),
                            rates or (lambda gate: pytest.fail("no gate expected")), lambda: self.now, self._sleep)

    def _sleep(self, seconds):
        self.now += seconds


def _text(path):
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return None


class Tree:
    """A service ``a`` with a unit template and plan records in a trusted directory, as the role deploys it."""

    def __init__(self, directory, count=2):
        self.dir = str(directory)
        self.template = os.path.join(self.dir, "a@.service")
        self.count = count

    def record(self, index):
        return os.path.join(self.dir, "a@%d.plan.json" % index)

    def drop_in(self, index):
        return os.path.join(self.dir, "a@%d.service.d" % index, "50-inferops-numa.conf")

    def lay(self, template=OLD, plans=("{}\n",), drop_ins=None):
        """What an earlier deployment left: the template and each instance's plan (and drop-in)."""
        change_files.write_files(dict({self.template: template}, **{self.record(i): plan for i, plan in
                                                                    enumerate(plans)}))
        if drop_ins:
            change_files.write_files({self.drop_in(i): text for i, text in enumerate(drop_ins)})

    def deployment(self, template=NEW, plans=None, gate=None, drop_ins=None, audit=None):
        plans = plans or ["{}\n"] * self.count
        files = dict({self.template: template}, **{self.record(i): plan for i, plan in enumerate(plans)})
        units = {}
        for index in range(self.count):
            units["a@%d.service" % index] = (self.template, self.record(index)) + (
                (self.drop_in(index),) if drop_ins is not None else ())
            if drop_ins is not None:
                files[self.drop_in(index)] = drop_ins[index]
        wanted = Service("a", files, units, {"a@%d.service" % i: self.record(i) for i in range(self.count)},
                         gate is not None, frozenset([self.template] + [self.drop_in(i) for i in range(self.count)]))
        instances = tuple(rollout.Instance("a@%d.service" % i, None, 8080 + i, audit and audit(i), gate)
                          for i in range(self.count))
        return rollout.Deployment(wanted, instances)

    def options(self, **changes):
        return rollout.Options(self.dir, **dict({"ready_seconds": 10}, **changes))

    def pending(self):
        return change_files.read_pending(self.dir)


@pytest.fixture
def tree(trusted_dir):
    return Tree(trusted_dir)


def units(count=2):
    return ["a@%d.service" % i for i in range(count)]


# --- what changes ---------------------------------------------------------------------------------------------


def test_only_instances_whose_files_change_restart_one_at_a_time(tree):
    tree.lay(plans=["{}\n", "{}\n"])
    systemd = FakeSystemd(active=units())
    result = rollout.deploy([tree.deployment(template=OLD, plans=['{"cpus": 1}\n', "{}\n"])], tree.options(),
                            systemd.host())
    assert not result["failed"] and result["changed"]
    assert systemd.actions() == [["restart", "a@0.service"]]  # a plan record is no unit: no reload
    assert _text(tree.record(0)) == '{"cpus": 1}\n' and tree.pending() is None
    assert result["services"]["a"] == {"written": [tree.record(0)], "held": False}


def test_a_changed_template_restarts_every_instance_after_one_reload_and_nothing_to_do_changes_nothing(tree):
    tree.lay(plans=["{}\n", "{}\n"])
    systemd = FakeSystemd(active=units())
    rollout.deploy([tree.deployment()], tree.options(), systemd.host())
    assert systemd.actions() == [["daemon-reload"], ["restart", "a@0.service"], ["restart", "a@1.service"]]
    again = rollout.deploy([tree.deployment()], tree.options(), systemd.host())
    assert again["changed"] is False and again["msg"] == "every instance runs" and len(systemd.actions()) == 3
    with pytest.raises(NumaError, match="give 1 or more"):
        rollout.deploy([], tree.options(batch=0), systemd.host())


def test_the_next_batch_waits_for_the_server_to_answer(tree):
    tree.lay(plans=["{}\n", "{}\n"])
    systemd = FakeSystemd(active=units())
    seen = []

    def answers(instance, seconds):
        seen.append((instance.unit, systemd.now, list(systemd.calls)))
        return None if systemd.now >= 6 else "http://127.0.0.1:8080/health answered 503"
    result = rollout.deploy([tree.deployment()], tree.options(), systemd.host(answers))
    assert not result["failed"]
    assert all(["restart", "a@1.service"] not in done for unit, _now, done in seen if unit == "a@0.service")


def test_a_file_that_is_not_as_a_deployment_leaves_it_is_written_again(tree):
    tree.lay(template=NEW, plans=["{}\n", "{}\n"])
    os.chmod(tree.template, 0o666)
    change = decide(tree.deployment().wanted, change_files.read_found([tree.template, tree.record(0),
                                                                       tree.record(1)]), {})
    assert list(change.writes) == [tree.template] and change.restart == tuple(units()) and change.reload


def test_check_mode_says_what_it_would_write_and_restart_and_does_nothing(tree):
    tree.lay(plans=["{}\n"])
    systemd = FakeSystemd(active=["a@0.service"])
    result = rollout.deploy([tree.deployment()], tree.options(), systemd.host(), check=True)
    assert systemd.actions() == [] and result["changed"] and _text(tree.template) == OLD
    assert [(r["unit"], r["msg"]) for r in result["instances"]] == [
        ("a@0.service", "would restart a@0.service"), ("a@1.service", "would start a@1.service")]
    assert (tree.template, OLD, NEW) in result["diffs"] and (tree.record(1), None, "{}\n") in result["diffs"]
    assert tree.pending() is None


# --- gates and rollbacks ------------------------------------------------------------------------------------


def test_a_server_that_never_answers_is_rolled_back_and_the_rest_are_left_alone(tree):
    tree.lay(plans=["{}\n", "{}\n"])
    systemd = FakeSystemd(active=units())
    result = rollout.deploy([tree.deployment()], tree.options(),
                            systemd.host(lambda i, s: "port 8080: Connection refused"))
    assert result["failed"] and _text(tree.template) == OLD and tree.pending() is None
    assert systemd.actions() == [["daemon-reload"], ["restart", "a@0.service"], ["daemon-reload"],
                                 ["restart", "a@0.service"]]
    first, second = result["instances"]
    assert first["msg"] == "a@0.service: not ready after 10 s (port 8080: Connection refused)"
    assert first["rolled_back"].startswith("back on its previous unit and plan, NOT ready: not ready after 10 s")
    assert second == {"unit": "a@1.service", "action": "restart", "ok": False, "ab_gate": None, "skipped": True,
                      "msg": "not restarted: the change was rolled back",
                      "rolled_back": "left on its previous unit and plan"}


def test_a_rollback_takes_the_whole_change_back_also_from_instances_that_passed(tree):
    tree.lay(plans=["{}\n", "{}\n"])
    systemd = FakeSystemd(active=units())
    ready = iter([None, "answered 503"] + [None] * 10)
    result = rollout.deploy([tree.deployment(plans=['{"a": 1}\n', '{"b": 1}\n'])], tree.options(ready_seconds=0),
                            systemd.host(lambda i, s: next(ready)))
    assert result["failed"]
    assert [_text(path) for path in (tree.template, tree.record(0), tree.record(1))] == [OLD, "{}\n", "{}\n"]
    assert systemd.actions()[-3:] == [["daemon-reload"], ["restart", "a@0.service"], ["restart", "a@1.service"]]
    assert [r["rolled_back"] for r in result["instances"]] == ["back on its previous unit and plan, ready"] * 2


def test_a_failed_first_deployment_is_stopped_and_its_files_removed(tree):
    systemd = FakeSystemd(template=tree.template)
    result = rollout.deploy([tree.deployment(template=BROKEN)], tree.options(ready_seconds=600), systemd.host())
    assert result["failed"] and systemd.now == 0
    first = result["instances"][0]
    assert first["msg"].startswith("a@0.service: systemctl start -- a@0.service failed (rc 1): Job for a@0.service")
    assert first["rolled_back"] == "stopped: its first deployment, nothing to go back to"
    assert systemd.state["a@0.service"] == "inactive"
    assert _text(tree.template) is None and _text(tree.record(0)) is None and tree.pending() is None


def test_a_failed_first_deployment_leaves_not_even_the_drop_in_directories_it_made(tree):
    os.makedirs(os.path.dirname(tree.drop_in(1)))
    with open(os.path.join(os.path.dirname(tree.drop_in(1)), "10-operator.conf"), "w") as handle:
        handle.write("[Service]\n")  # an operator's drop-in directory: there before, so kept
    before = sorted(os.listdir(tree.dir))
    systemd = FakeSystemd(template=tree.template)
    result = rollout.deploy([tree.deployment(template=BROKEN, drop_ins=["x\n", "y\n"])], tree.options(),
                            systemd.host())
    assert result["failed"] and tree.pending() is None
    assert sorted(os.listdir(tree.dir)) == before
    assert os.listdir(os.path.dirname(tree.drop_in(1))) == ["10-operator.conf"]


def test_a_crash_loop_fails_the_instance_at_the_first_look_with_its_journal(tree):
    tree.lay(plans=["{}\n"])
    systemd = FakeSystemd(active=["a@0.service"])
    systemd.boots = lambda unit: "activating"
    systemd.sub["a@0.service"] = "auto-restart"
    systemd.journal["a@0.service"] = ["numa-pin: starting", "numa-pin: argument '{port}' uses {port} but the plan "
                                      "has no port: set port_base\x1b[0m", "bye",
                                      ("systemd", "Main process exited, code=exited"),
                                      ("systemd", "Scheduled restart job, restart counter is at 3")]
    tree.count = 1
    result = rollout.deploy([tree.deployment()], tree.options(ready_seconds=600), systemd.host())
    assert result["failed"] and systemd.now == 0
    message = result["instances"][0]["msg"]
    assert message.startswith("a@0.service: it is crash-looping: its server exited (status 0) and systemd restarts "
                              "it; its journal: numa-pin: starting | numa-pin: argument '{port}' uses {port} but "
                              "the plan has no port: set port_base\\x1b[0m | bye"), message
    assert "\n" not in result["msg"]


def test_a_restart_count_that_grows_is_a_crash_loop_and_a_server_that_exits_is_not_waited_for(tree):
    tree.lay(plans=["{}\n"])
    tree.count = 1
    systemd = FakeSystemd(active=["a@0.service"])
    looks = []

    def answers(instance, seconds):
        looks.append(systemd.now)
        systemd.restarts["a@0.service"] = 1  # restarted between two looks, running again at the next
        return "answered 503" if len(looks) == 1 else None
    result = rollout.deploy([tree.deployment()], tree.options(ready_seconds=600), systemd.host(answers))
    assert "crash-looping" in result["instances"][0]["msg"] and systemd.now == rollout.POLL_SECONDS
    systemd = FakeSystemd(active=["a@0.service"], boots=lambda unit: "inactive")
    tree.lay(plans=["{}\n"])
    result = rollout.deploy([tree.deployment()], tree.options(ready_seconds=600), systemd.host())
    assert result["instances"][0]["msg"].startswith("a@0.service: its server exited (status 0): see `journalctl")


def test_a_failed_audit_rolls_the_instance_back(tree, monkeypatch):
    tree.lay(plans=["{}\n"])
    tree.count = 1
    systemd = FakeSystemd(active=["a@0.service"])
    monkeypatch.setattr(rollout, "audit_units", lambda *args, **kwargs: [
        {"unit": "a@0.service", "ok": False, "msg": "a@0.service: 61.0% of its pages on node 0, below 99%"}])
    result = rollout.deploy([tree.deployment(audit=lambda i: rollout.UnitAudit("a@%d.service" % i, {}, 99.0,
                                                                                 "all"))],
                            tree.options(), systemd.host())
    assert result["failed"] and "its audit failed: a@0.service: 61.0% of its pages" in result["msg"]
    assert _text(tree.template) == OLD


def test_batches_of_two_restart_together(tree):
    tree.count = 3
    tree.lay(plans=["{}\n"] * 3)
    systemd = FakeSystemd(active=units(3))
    rollout.deploy([tree.deployment()], tree.options(batch=2), systemd.host())
    assert systemd.actions() == [["daemon-reload"]] + [["restart", unit] for unit in units(3)]


def test_a_systemd_placement_drop_in_goes_back_with_the_unit_and_plan(tree):
    """pin_mode systemd: the rejected CPUAffinity= lives in the drop-in, which the rollback restores too."""
    tree.lay(plans=["{}\n", "{}\n"], drop_ins=["CPUAffinity=0-1\n", "CPUAffinity=2-3\n"])
    systemd = FakeSystemd(active=units())
    result = rollout.deploy([tree.deployment(drop_ins=["CPUAffinity=0\n", "CPUAffinity=2\n"])], tree.options(),
                            systemd.host(lambda i, s: "answered 500"))
    assert result["failed"]
    assert [_text(tree.drop_in(i)) for i in range(2)] == ["CPUAffinity=0-1\n", "CPUAffinity=2-3\n"]


# --- a rollback that cannot finish, and the next run ------------------------------------------------------------


def test_a_failed_reload_in_the_rollback_restarts_nothing_and_the_next_run_finishes_it_first(tree):
    tree.lay(plans=["{}\n", "{}\n"])
    systemd = FakeSystemd(active=units(), fails={("daemon-reload", None): 0})
    answers = iter([None, "answered 503"] + [None] * 20)

    def flaky(instance, seconds):
        if systemd.actions()[-1] == ["restart", "a@1.service"] and not systemd.fails[("daemon-reload", None)]:
            systemd.fails[("daemon-reload", None)] = 1  # the rollback's reload fails
        return next(answers)
    result = rollout.deploy([tree.deployment()], tree.options(ready_seconds=0), systemd.host(flaky))
    assert result["failed"] and "the rollback is INCOMPLETE" in result["msg"] and "marked for retry" in result["msg"]
    assert "a@0.service, a@1.service not restarted" in result["msg"]
    assert _text(tree.template) == OLD and tree.pending() is not None
    assert systemd.actions()[-1] == ["daemon-reload"]  # no restart on a reload that failed
    # The next run takes the change back first (a reload, every touched instance restarted), then deploys it again.
    systemd.calls.clear()
    again = rollout.deploy([tree.deployment()], tree.options(), systemd.host())
    assert not again["failed"] and again["msg"].startswith("an earlier change nobody judged was taken back first")
    assert systemd.actions() == [["daemon-reload"], ["restart", "a@0.service"], ["restart", "a@1.service"],
                                 ["daemon-reload"], ["restart", "a@0.service"], ["restart", "a@1.service"]]
    assert tree.pending() is None and _text(tree.template) == NEW


def test_a_rollback_restart_that_fails_does_not_stop_the_next_one(tree):
    tree.lay(plans=["{}\n", "{}\n"])
    systemd = FakeSystemd(active=units())
    ready = iter([None, "answered 503"] + [None] * 20)

    def answers(instance, seconds):
        answer = next(ready)
        if answer:
            systemd.fails[("restart", "a@0.service")] = 1
        return answer
    result = rollout.deploy([tree.deployment()], tree.options(ready_seconds=0), systemd.host(answers))
    assert systemd.actions()[-2:] == [["restart", "a@0.service"], ["restart", "a@1.service"]]
    assert result["failed"] and tree.pending() is not None
    assert "a@0.service not back: systemctl restart -- a@0.service failed (rc 1)" in result["msg"]


def test_a_crash_in_the_middle_leaves_the_record_and_the_next_run_takes_the_change_back(tree):
    tree.lay(plans=["{}\n", "{}\n"])
    systemd = FakeSystemd(active=units())

    def crash(instance, seconds):
        raise RuntimeError("the connection dropped")
    with pytest.raises(RuntimeError):
        rollout.deploy([tree.deployment()], tree.options(), systemd.host(crash))
    pending = tree.pending()
    assert pending.touched == ["a@0.service"] and pending.files == {tree.template: OLD}
    systemd.calls.clear()
    again = rollout.deploy([tree.deployment()], tree.options(), systemd.host())
    assert not again["failed"]
    # Only a@0 ran the unjudged change: it alone goes back before the change is applied again.
    assert systemd.actions()[:2] == [["daemon-reload"], ["restart", "a@0.service"]]


def test_a_record_root_cannot_trust_is_refused_before_any_change(tree):
    with open(os.path.join(tree.dir, change_files.PENDING), "w") as handle:
        handle.write('{"files": {"etc/relative": "x"}, "units": {}, "touched": [], "first": []}')
    os.chmod(os.path.join(tree.dir, change_files.PENDING), 0o600)
    systemd = FakeSystemd()
    with pytest.raises(NumaError, match="not the record of a change this collection writes"):
        rollout.deploy([tree.deployment()], tree.options(), systemd.host())
    os.chmod(os.path.join(tree.dir, change_files.PENDING), 0o666)
    with pytest.raises(NumaError, match="only a regular file that root alone may write"):
        rollout.deploy([tree.deployment()], tree.options(), systemd.host())
    assert systemd.actions() == []


def test_a_file_that_cannot_be_written_restarts_nothing_and_puts_the_others_back(tree):
    tree.lay(plans=["{}\n"])
    os.makedirs(tree.record(1))  # a directory where instance 1's plan belongs
    systemd = FakeSystemd(active=units())
    result = rollout.deploy([tree.deployment()], tree.options(), systemd.host())
    assert result["failed"] and systemd.actions() == [["daemon-reload"]]  # the rollback's: nothing restarted
    assert result["msg"].startswith("the change was not applied: %s: not written" % tree.record(1))
    assert _text(tree.template) == OLD and tree.pending() is None


# --- the A/B gate ---------------------------------------------------------------------------------------------

GATE = ab_gate.Gate("http://127.0.0.1:8080", "llama.cpp", "Hi", 8, 3, None)


def gated(tree, before, after, min_gain=None, count=1, plans=None):
    tree.count = count
    systemd = FakeSystemd(active=units(count))
    measured = iter([before, after] * count)

    def rates(gate):
        rate = next(measured)
        if isinstance(rate, Exception):
            raise rate
        return rate
    result = rollout.deploy([tree.deployment(gate=GATE._replace(min_gain_percent=min_gain), plans=plans)],
                            tree.options(), systemd.host(rates=rates))
    return result, systemd


def test_a_faster_placement_is_kept(tree):
    tree.lay()
    result, systemd = gated(tree, [4.0, 4.2, 4.1], [7.9, 8.1, 8.0])
    (only,) = result["instances"]
    assert not result["failed"] and _text(tree.template) == NEW and only["rolled_back"] is None
    assert only["ab_gate"]["kept"] and only["ab_gate"]["gain_percent"] == pytest.approx(95.12, abs=0.01)
    assert json.loads(_text(os.path.join(tree.dir, "ab-gates.json")))["a@0.service"]["kept"] is True


def test_a_slower_placement_is_rolled_back_kept_as_rejected_and_held_the_next_time(tree):
    tree.lay()
    with open(os.path.join(tree.dir, "ab-gates.json"), "w") as handle:
        handle.write('{"other@0.service": {"kept": true, "gain_percent": 3.0}}\n')
    result, systemd = gated(tree, [8.0, 8.1, 7.9], [4.0, 4.1, 3.9])
    (only,) = result["instances"]
    assert not result["failed"] and result["changed"] and _text(tree.template) == OLD
    assert systemd.actions() == [["daemon-reload"], ["restart", "a@0.service"], ["daemon-reload"],
                                 ["restart", "a@0.service"]]
    assert only["msg"].startswith("a@0.service: 8.00 -> 4.00 tokens/s (-50.0 %")
    verdicts = json.loads(_text(os.path.join(tree.dir, "ab-gates.json")))
    assert set(verdicts) == {"other@0.service", "a@0.service"} and verdicts["a@0.service"]["kept"] is False
    rejected = json.loads(_text(os.path.join(tree.dir, "a.rejected.json")))
    assert rejected["files"] == {tree.template: digest(NEW)}
    # The same change again: held, nothing written or restarted; another change is measured.
    again, systemd = gated(tree, None, None)
    assert again["services"]["a"]["held"] and systemd.actions() == [] and _text(tree.template) == OLD
    assert "this change is not tried again" in again["msg"]
    other, _systemd = gated(tree, [8.0, 8.1, 7.9], [8.0, 8.1, 7.9], plans=['{"other": 1}\n'])
    assert not other["services"]["a"]["held"] and _text(tree.template) == NEW
    # Another change was kept since; back where the rejected change started, it is still not tried again.
    tree.lay(template=OLD, plans=["{}\n"])
    held, systemd = gated(tree, None, None)
    assert held["services"]["a"]["held"] and systemd.actions() == []


def test_a_change_within_the_noise_is_kept_unless_a_gain_is_demanded(tree):
    tree.lay()
    assert gated(tree, [8.0, 9.0, 7.0], [7.8, 8.6, 7.2])[0]["instances"][0]["ab_gate"]["kept"]
    tree.lay()
    result, _systemd = gated(tree, [8.0, 9.0, 7.0], [7.8, 8.6, 7.2], min_gain=5.0)
    assert not result["instances"][0]["ab_gate"]["kept"] and _text(tree.template) == OLD


def test_a_rate_not_measured_before_the_restart_leaves_the_instance_as_it_runs(tree):
    tree.lay()
    result, systemd = gated(tree, NumaError("http://127.0.0.1:8080/completion: no whole answer within 5 s"), None)
    assert result["failed"] and ["restart", "a@0.service"] not in systemd.actions()
    assert result["instances"][0]["msg"] == ("a@0.service: not restarted: not measured before its restart: "
                                             "http://127.0.0.1:8080/completion: no whole answer within 5 s")
    assert _text(tree.template) == OLD and tree.pending() is None


def test_a_rate_not_measured_after_the_restart_rolls_back_and_is_not_rejected(tree):
    tree.lay()
    result, systemd = gated(tree, [8.0, 8.0, 8.0], NumaError("gave a list where a number belongs"))
    assert result["failed"] and _text(tree.template) == OLD
    assert "not measured after its restart: gave a list" in result["msg"]
    assert not os.path.exists(os.path.join(tree.dir, "a.rejected.json"))


def first_deployment(tree, baseline, bound, boots=None, fails=None):
    """A first deployment of a@0 behind the gate, measured ``baseline`` unbound and ``bound`` after; the calls
    with whether the baseline drop-in was there at each."""
    tree.count = 1
    root = os.path.join(tree.dir, "root")
    os.makedirs(root, exist_ok=True)
    drop_in = os.path.join(root, "run/systemd/system/a@0.service.d", rollout.BASELINE_DROP_IN)
    systemd = FakeSystemd(boots=boots, fails=fails)
    seen = []
    run = systemd.run

    def watched(argv):
        if argv[1] not in ("show", "reset-failed") and argv[0] == "systemctl":
            seen.append((argv[1], os.path.isfile(drop_in)))
        return run(argv)
    systemd.run = watched
    measured = iter([baseline, bound])
    result = rollout.deploy([tree.deployment(gate=GATE)], tree.options(root=root),
                            systemd.host(rates=lambda gate: next(measured)))
    return result, seen, drop_in


def test_a_first_deployment_is_measured_unbound_first_then_bound_and_kept(tree):
    result, calls, drop_in = first_deployment(tree, [4.0, 4.2, 4.1], [7.9, 8.1, 8.0])
    assert calls == [("daemon-reload", False), ("daemon-reload", True), ("start", True), ("stop", True),
                     ("daemon-reload", False), ("start", False)]
    assert not os.path.exists(drop_in) and not os.path.exists(os.path.dirname(drop_in))
    (only,) = result["instances"]
    assert not result["failed"] and only["ab_gate"]["kept"] and only["ab_gate"]["baseline"] == "unbound"
    assert only["ab_gate"]["msg"].startswith("unbound 4.10 -> bound 8.00 tokens/s (+95.1 %")
    assert only["ab_gate"]["msg"].endswith("first deployment, binding kept")


def test_binding_slower_than_the_default_is_said_and_kept_on_a_first_deployment(tree):
    result, _calls, _drop_in = first_deployment(tree, [8.0, 8.1, 7.9], [4.0, 4.1, 3.9])
    (only,) = result["instances"]
    assert not result["failed"] and only["ab_gate"]["kept"] and only["rolled_back"] is None
    assert "SLOWER than the unbound default here" in only["ab_gate"]["msg"]


def test_an_unbound_baseline_whose_stop_fails_is_not_followed_by_a_start_on_the_running_server(tree):
    result, calls, drop_in = first_deployment(tree, [4.0], [8.0], fails={("stop", "a@0.service"): 1})
    assert result["failed"] and ("start", False) not in calls
    assert "no unbound baseline: systemctl stop -- a@0.service failed" in result["msg"]
    assert not os.path.exists(drop_in)
    assert result["instances"][0]["rolled_back"] == "stopped: its first deployment, nothing to go back to"


def test_the_baseline_drop_in_is_not_written_through_a_planted_link(tree):
    root = os.path.join(tree.dir, "root")
    os.makedirs(os.path.join(root, "run/systemd/system"))
    os.makedirs(os.path.join(tree.dir, "elsewhere"))
    os.symlink(os.path.join(tree.dir, "elsewhere"), os.path.join(root, "run/systemd/system/a@0.service.d"))
    result, calls, _drop_in = first_deployment(tree, [1.0], [2.0])
    assert ("start", True) not in calls and not os.listdir(os.path.join(tree.dir, "elsewhere"))
    assert "no unbound baseline: " in result["msg"] and result["failed"]


# --- readiness and its URL -------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine, port, given, wanted", [
    ("llama.cpp", 8080, None, "http://127.0.0.1:8080/health"),
    ("vllm", 8000, None, "http://127.0.0.1:8000/health"),
    ("generic", 9000, None, None),
    ("generic", 9000, "http://127.0.0.1:{port}/ready", "http://127.0.0.1:9000/ready"),
    ("llama.cpp", None, None, None),
])
def test_the_readiness_url_comes_from_the_entry_or_the_engine(engine, port, given, wanted):
    assert health_url(engine, port, given) == wanted


def test_a_change_held_only_when_every_file_it_writes_is_the_rejected_one():
    wanted = Service("a", {"/u": NEW, "/p": "{}\n", "/d": None}, {"a@0.service": ("/u", "/p", "/d")},
                     {"a@0.service": "/p"}, True, frozenset(["/u", "/d"]))
    found = {"/u": Found(OLD), "/p": Found("{}\n"), "/d": Found("CPUAffinity=0\n")}
    assert decide(wanted, found, {"/u": digest(NEW), "/d": None}).held
    assert not decide(wanted, found, {"/u": digest(NEW)}).held  # the drop-in's removal was not rejected
    assert not decide(wanted._replace(gated=False), found, {"/u": digest(NEW), "/d": None}).held
    change = decide(wanted, found, {})
    assert change.writes == {"/u": NEW, "/d": None} and change.restart == ("a@0.service",) and change.reload
    assert change.first == () and decide(wanted, {}, {}).first == ("a@0.service",)


# --- what the role hands numa_rollout ---------------------------------------------------------------------------

ENTRY = {"pin_mode": "wrapper", "engine": "llama.cpp", "health_url": None, "ab_gate": None, "audit": True,
         "min_local_percent": 99, "pages": "all", "on_drift": "none"}


def test_a_role_entry_becomes_the_files_and_instances_of_one_change():
    from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import rollout_service

    records = [{"policy": "bind", "mem_nodes": [0], "port": 8080}, {"policy": "bind", "mem_nodes": [1], "port": 8081}]
    service = rollout_service(ENTRY, "llama", "[Service]\n", records, [], "/etc/systemd/system", "/etc/inferops-numa")
    files = {item["path"]: item for item in service["files"]}
    assert files["/etc/systemd/system/llama@.service"]["systemd"] is True
    # Byte for byte what the role wrote with to_nice_json (tests/integration/test_rollout_role_processes.py asks
    # Ansible's own filter): an upgrade restarts nothing.
    assert files["/etc/inferops-numa/llama@1.plan.json"]["content"] == (
        '{\n    "mem_nodes": [\n        1\n    ],\n    "policy": "bind",\n    "port": 8081\n}\n')
    assert files["/etc/systemd/system/llama@0.service.d/50-inferops-numa.conf"]["state"] == "absent"
    audit = json.loads(files["/etc/inferops-numa/llama.audit.json"]["content"])
    assert audit == {"audit": True, "min_local_percent": 99.0, "pages": "all", "on_drift": "none"}
    first, second = service["instances"]
    assert second["unit"] == "llama@1.service" and second["port"] == 8081
    assert second["files"] == ["/etc/systemd/system/llama@.service", "/etc/inferops-numa/llama@1.plan.json",
                               "/etc/systemd/system/llama@1.service.d/50-inferops-numa.conf"]
    assert first["audit"] == {"min_local_percent": 99, "pages": "all"} and first["ab_gate"] is None
    systemd = rollout_service(dict(ENTRY, pin_mode="systemd", audit=False), "llama", "u", records[:1],
                              ["CPUAffinity=0-1\n"], "/u", "/p")
    (drop_in,) = [item for item in systemd["files"] if item["path"].endswith(".conf")]
    assert drop_in["content"] == "CPUAffinity=0-1\n" and drop_in["state"] == "present"
    assert systemd["instances"][0]["audit"] is None


def test_a_unit_at_its_start_limit_is_reset_before_each_start():
    """After a crash loop systemd refuses every start ("start request repeated too quickly") until reset-failed."""
    systemd = FakeSystemd()
    assert systemd.host().start("restart", "a@0.service") is None
    assert systemd.calls == [["reset-failed", "a@0.service"], ["restart", "a@0.service"]]


def test_a_refused_start_says_the_units_journal_not_only_systemds_pointer_to_it():
    """A rollback's restart refused (numa-pin exec exiting 2, say) names the cause: the unit's last lines."""
    systemd = FakeSystemd(boots=lambda unit: "failed")
    systemd.journal["a@0.service"] = ["numa-pin: model 900 MiB does not fit node 0 (812 MiB free)"]
    refused = systemd.host().start("restart", "a@0.service")
    assert refused == ("systemctl restart -- a@0.service failed (rc 1): Job for a@0.service failed because the "
                       "control process exited with error code.; its journal: numa-pin: model 900 MiB does not fit "
                       "node 0 (812 MiB free)")
    assert systemd.host().start("restart", "b@0.service").endswith("error code.")  # nothing logged: systemd's alone


def test_a_crash_loop_that_hit_the_start_limit_before_the_first_look_is_still_a_crash_loop():
    """A server that dies at once can be restarted into systemd's start limit before the rollout looks: the unit
    is "failed", and what it was is said, not only that it failed."""
    systemd = FakeSystemd(active=["a@0.service"])
    systemd.state["a@0.service"], systemd.restarts["a@0.service"] = "failed", 5
    plain = rollout.Instance("a@0.service", None, None, None)
    why = rollout.wait_ready(plain, 60, systemd.host())
    assert why.startswith("it was crash-looping: its server exited (status 1) and systemd restarted it 5 times "
                          "(exit-code)"), why
    systemd.restarts["a@0.service"] = 0
    assert rollout.wait_ready(plain, 60, systemd.host()).startswith("its unit failed (exit-code)")


def test_the_journal_quoted_is_this_starts_and_the_servers_own_words_before_systemds():
    systemd = FakeSystemd()
    host = rollout.Host(systemd.run, wall=lambda: 1700000000.5)
    systemd.journal["a@0.service"] = [("systemd", "Started a."), ("systemd", "Main process exited, status=1")]
    assert host.journal("a@0.service") == "Started a. | Main process exited, status=1"
    assert "--since" not in systemd.journal_calls[-1]  # never started by us: its last lines
    host.start("start", "a@0.service")
    systemd.journal["a@0.service"] += ["error: \u00e9t\u00e9 --bogus", ("systemd", "Scheduled restart job")]
    assert host.journal("a@0.service") == "error: \\xe9t\\xe9 --bogus"  # printable, as every quoted line
    since = systemd.journal_calls[-1][systemd.journal_calls[-1].index("--since") + 1]
    assert since == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1699999999.5))


def test_journal_entries_that_are_not_text_are_read_as_text_or_left_out():
    assert rollout._journal_entry(json.dumps({"MESSAGE": list(b"bad \xff byte\x1b"), "_SYSTEMD_UNIT": "a"})) == (
        "a", "bad \ufffd byte\x1b")
    for line in ("not json", "[1]", json.dumps({"MESSAGE": [300]}), json.dumps({"MESSAGE": " "}),
                 json.dumps({"MESSAGE": {"a": 1}})):
        assert rollout._journal_entry(line) is None, line
    assert rollout._journal_entry(json.dumps({"MESSAGE": "x", "_SYSTEMD_UNIT": 5})) == ("", "x")


def test_an_instance_with_nothing_to_ask_is_ready_when_active_at_two_looks_without_a_restart():
    systemd = FakeSystemd(active=["a@0.service"])
    plain = rollout.Instance("a@0.service", None, None, None)
    assert rollout.wait_ready(plain, 60, systemd.host()) is None and systemd.now == rollout.POLL_SECONDS
    looks = iter([0, 1])  # restarted by systemd between the two looks: active at each, but crash-looping
    systemd.restarts = type("Restarts", (), {"get": lambda self, unit, default: next(looks)})()
    assert "crash-looping" in rollout.wait_ready(plain, 60, systemd.host())


def test_the_instances_no_longer_wanted_are_those_with_a_record_past_the_count():
    from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import stale_instances

    paths = ["/p/llama@0.plan.json", "/p/llama@1.plan.json", "/p/llama@12.plan.json", "/p/llama@1x.plan.json",
             "/p/llama-big@3.plan.json", "/p/llama.audit.json", "/p/llama@\u0663.plan.json"]
    assert stale_instances(paths, "llama", 1) == [1, 12]
    assert stale_instances(paths, "llama", 2) == [12] and stale_instances(paths, "llama-big", 1) == [3]
