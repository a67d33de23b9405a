"""Traffic hooks: their tokens (base/tokens, decide/rollout.hook_argv), their checks (act/hooks, the preflight),
running one with a deadline (act/hooks.run_hook), and where numa_rollout's core runs them (act/rollout): drain,
restart, gates, undrain, one batch at a time, around a rollback's restarts too, and the units a failed undrain
leaves without traffic recorded for the next run."""
import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import change_files, hooks, rollout
from ansible_collections.inferops.numa.plugins.module_utils.numa.base import tokens
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.records import UNDRAIN
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import hook_argv
from ansible_collections.inferops.numa.plugins.plugin_utils import preflight
from tests.unit.test_rollout import BROKEN, NEW, FakeSystemd, Tree


# --- tokens and checks ----------------------------------------------------------------------------------------

def test_a_hooks_tokens_are_filled_per_instance_and_json_braces_pass_through():
    argv = ["lb", "set server be/{unit} state drain", "{service}:{instance}:{port}", '{"weight": 0}']
    assert hook_argv(argv, "llama", 1, 8081) == [
        "lb", "set server be/llama@1.service state drain", "llama:1:8081", '{"weight": 0}']
    assert hook_argv(None, "llama", 0, None) == []


def test_a_hooks_port_without_a_port_is_refused_by_the_server_commands_rule():
    with pytest.raises(NumaError, match=r"\{port\}.*set port_base"):
        hook_argv(["lb", "{port}"], "llama", 0, None)


def test_unknown_tokens_are_named_once_each_in_order():
    assert tokens.unknown_tokens(["{unti}", "{threads}-{unti}", "{unit}", '{"a": 1}', "{}"]) == ["{unti}", "{threads}"]


def _entry_problems(**keys):
    _merged, problems = preflight.check_entries([dict({"name": "llama", "command": ["/bin/server"]}, **keys)], {})
    return problems


@pytest.mark.parametrize("keys, problem", [
    ({"drain_command": "haproxy drain"}, "service llama: drain_command: 'haproxy drain' is not a list of strings; "
                                          "give the command as an argv list (no shell)"),
    ({"undrain_command": ["lb", 5]}, "service llama: undrain_command: ['lb', 5] is not a list of strings"),
    ({"drain_command": ["lb", "{unti}"]}, "service llama: drain_command: {unti}: no such token; a hook's tokens are "
                                          "{service}, {unit}, {instance}, {port}"),
    ({"drain_command": ["", "x"]}, "service llama: drain_command: its program (the first item) is empty"),
    ({"undrain_command": ["lb", "{port}"]}, "service llama: undrain_command: argument '{port}' uses {port} but the "
                                            "plan has no port: set port_base"),
    ({"drain_seconds": -1}, "service llama: drain_seconds: -1 is out of range; give a value from 0 to 86400"),
    ({"hook_seconds": 0}, "service llama: hook_seconds: 0 is out of range; give a value from 1 to 86400"),
    ({"stop_timeout_seconds": -5}, "service llama: stop_timeout_seconds: -5 is out of range"),
])
def test_the_preflight_refuses_a_bad_hook_in_one_line(keys, problem):
    problems = _entry_problems(**keys)
    assert len(problems) == 1 and problems[0].startswith(problem), problems
    assert "\n" not in problems[0]


def test_the_preflight_takes_good_hooks_and_gives_the_defaults():
    merged, problems = preflight.check_entries([{"name": "llama", "command": ["/bin/server"], "port_base": 8080,
                                                 "drain_command": ["lb", "{unit}", "{port}"]}], {})
    assert problems == []
    assert {key: merged[0][key] for key in ("drain_command", "undrain_command", "hook_seconds", "drain_seconds",
                                            "stop_timeout_seconds")} == {
        "drain_command": ["lb", "{unit}", "{port}"], "undrain_command": None, "hook_seconds": 60, "drain_seconds": 0,
        "stop_timeout_seconds": None}


@pytest.mark.parametrize("seconds, grace, problem", [(0, 0, "hook_seconds 0"), (float("nan"), 0, "hook_seconds"),
                                                     (5, -1, "drain_seconds -1")])
def test_the_module_refuses_a_deadline_or_grace_out_of_range(seconds, grace, problem):
    with pytest.raises(NumaError, match=problem):
        hooks.hooks_from(["a"], [], seconds, grace)


# --- how a failed one is said --------------------------------------------------------------------------------

def test_a_failed_hook_is_one_line_with_its_command_exit_code_and_last_stderr_line():
    def run(argv, seconds):
        return 3, "out\n", "first\nNo such server.\n\n"
    assert hooks.hook_problem("drain", ["lb", "be/a@0.service"], 5, run) == (
        "its drain command `lb be/a@0.service` exited 3: No such server.")
    assert hooks.hook_problem("undrain", ["lb"], 5, lambda argv, seconds: (-9, "", "")) == (
        "its undrain command `lb` was killed by signal 9: it wrote nothing")
    assert hooks.hook_problem("drain", ["lb"], 5, lambda argv, seconds: (0, "", "noise")) is None


# --- where the rollout runs them ------------------------------------------------------------------------------

class Timeline:
    """One log of systemd's unit-changing calls and the hooks run, in the order they happened; ``fail``:
    (hook, unit) -> how many of the next such runs exit 1."""

    def __init__(self, systemd, fail=None):
        self.systemd = systemd
        self.fail = dict(fail or {})
        self.log = []
        self.checked = False

    def run(self, argv):
        result = self.systemd.run(argv)
        if argv[0] == "systemctl" and argv[1] in ("start", "restart", "stop"):
            self.log.append((argv[1], argv[-1]))
        return result

    def hook(self, argv, seconds):
        assert seconds == 7
        kind, unit = argv
        self.log.append((kind, unit))
        if self.fail.get((kind, unit)):
            self.fail[(kind, unit)] -= 1
            return 1, "", "lb: backend %s refused\n" % unit
        return 0, "", ""

    def host(self):
        return rollout.Host(self.run, lambda instance, seconds: None,
                            lambda gate: pytest.fail("no gate expected"), lambda: self.systemd.now,
                            self.systemd._sleep, hook=self.hook)


def _hooked(deployment):
    instances = tuple(instance._replace(hooks=hooks.Hooks(("drain", instance.unit), ("undrain", instance.unit), 7))
                      for instance in deployment.instances)
    return deployment._replace(instances=instances)


@pytest.fixture
def tree(trusted_dir):
    return Tree(trusted_dir)


def _deploy(tree, timeline, template=NEW, check=False, **options):
    return rollout.deploy([_hooked(tree.deployment(template=template))], tree.options(**options), timeline.host(),
                          check)


def test_each_instance_is_drained_restarted_gated_and_undrained_before_the_next(tree):
    tree.lay(plans=("{}\n", "{}\n"))
    timeline = Timeline(FakeSystemd(active=["a@0.service", "a@1.service"]))
    result = _deploy(tree, timeline)
    assert result["failed"] is False, result["msg"]
    assert timeline.log == [("drain", "a@0.service"), ("restart", "a@0.service"), ("undrain", "a@0.service"),
                            ("drain", "a@1.service"), ("restart", "a@1.service"), ("undrain", "a@1.service")]


def test_a_batch_is_drained_together_and_undrained_together(tree):
    tree.lay(plans=("{}\n", "{}\n"))
    timeline = Timeline(FakeSystemd(active=["a@0.service", "a@1.service"]))
    assert _deploy(tree, timeline, batch=2)["failed"] is False
    assert timeline.log == [("drain", "a@0.service"), ("drain", "a@1.service"), ("restart", "a@0.service"),
                            ("restart", "a@1.service"), ("undrain", "a@0.service"), ("undrain", "a@1.service")]


def test_a_first_start_is_not_drained_and_is_undrained_once_ready(tree):
    timeline = Timeline(FakeSystemd())
    assert _deploy(tree, timeline)["failed"] is False
    assert timeline.log == [("start", "a@0.service"), ("undrain", "a@0.service"),
                            ("start", "a@1.service"), ("undrain", "a@1.service")]


def test_a_failed_drain_leaves_its_instance_untouched_and_the_rollback_wraps_its_restarts(tree):
    tree.lay(plans=("{}\n", "{}\n"))
    timeline = Timeline(FakeSystemd(active=["a@0.service", "a@1.service"]), fail={("drain", "a@1.service"): 1})
    result = _deploy(tree, timeline)
    assert result["failed"] is True
    assert timeline.log == [("drain", "a@0.service"), ("restart", "a@0.service"), ("undrain", "a@0.service"),
                            ("drain", "a@1.service"),
                            # the rollback: a@0 back on its previous files, a@1 never touched
                            ("drain", "a@0.service"), ("restart", "a@0.service"), ("undrain", "a@0.service")]
    assert ("a@1.service: not restarted: its drain command `drain a@1.service` exited 1: lb: backend a@1.service "
            "refused; the instance was not touched: fix the drain command or the load balancer and run again"
            in result["msg"]), result["msg"]
    assert tree.pending() is None and change_files.read_undrain(tree.dir) == []


def test_a_failed_gate_is_taken_back_inside_the_same_drain(tree):
    tree.lay(plans=("{}\n", "{}\n"))
    timeline = Timeline(FakeSystemd(active=["a@0.service", "a@1.service"], template=tree.template))
    result = _deploy(tree, timeline, template=BROKEN)
    assert result["failed"] is True
    # Drained once; not undrained on the change that failed; undrained once back on its previous unit.
    assert timeline.log == [("drain", "a@0.service"), ("restart", "a@0.service"), ("restart", "a@0.service"),
                            ("undrain", "a@0.service")]
    assert "undrained" in result["instances"][0]["rolled_back"]


def test_a_failed_undrain_fails_the_host_and_the_next_run_undrains_first(tree):
    tree.lay(plans=("{}\n", "{}\n"))
    timeline = Timeline(FakeSystemd(active=["a@0.service", "a@1.service"]), fail={("undrain", "a@0.service"): 2})
    result = _deploy(tree, timeline)
    assert result["failed"] is True
    assert timeline.log == [("drain", "a@0.service"), ("restart", "a@0.service"), ("undrain", "a@0.service"),
                            ("restart", "a@0.service"), ("undrain", "a@0.service")]
    assert "a@0.service: ready and judged, but its undrain command `undrain a@0.service` exited 1" in result["msg"]
    assert result["msg"].endswith("a@0.service run without traffic: their undrain failed; the host stays marked for "
                                  "retry (%s): the next run undrains them before it deploys; fix the undrain command "
                                  "or the load balancer and run again" % os.path.join(tree.dir, UNDRAIN))
    assert change_files.read_undrain(tree.dir) == ["a@0.service"]

    # A check runs no hook and says what it would do.
    checking = Timeline(timeline.systemd)
    said = _deploy(tree, checking, check=True)
    assert checking.log == [] and said["msg"].startswith("would undrain first: a@0.service; ")

    # The load balancer is fixed: the next run undrains a@0 first, then deploys.
    again = Timeline(timeline.systemd)
    result = _deploy(tree, again)
    assert result["failed"] is False, result["msg"]
    assert again.log[0] == ("undrain", "a@0.service")
    assert again.log[1:] == [("drain", "a@0.service"), ("restart", "a@0.service"), ("undrain", "a@0.service"),
                             ("drain", "a@1.service"), ("restart", "a@1.service"), ("undrain", "a@1.service")]
    assert result["msg"].startswith("undrained first: a@0.service; ")
    assert change_files.read_undrain(tree.dir) == []


def test_an_owed_undrain_that_fails_again_stops_the_run_before_any_change(tree):
    tree.lay(plans=("{}\n", "{}\n"))
    change_files.write_undrain(tree.dir, ["a@1.service"])
    timeline = Timeline(FakeSystemd(active=["a@0.service", "a@1.service"]), fail={("undrain", "a@1.service"): 1})
    result = _deploy(tree, timeline)
    assert result["failed"] is True and timeline.log == [("undrain", "a@1.service")]
    assert result["msg"].startswith("instances an earlier run left without traffic are not undrained: a@1.service: "
                                    "its undrain command `undrain a@1.service` exited 1")
    assert change_files.read_undrain(tree.dir) == ["a@1.service"]
    assert tree.pending() is None


def test_check_mode_runs_no_hook(tree):
    tree.lay(plans=("{}\n", "{}\n"))
    timeline = Timeline(FakeSystemd(active=["a@0.service", "a@1.service"]))
    result = _deploy(tree, timeline, check=True)
    assert timeline.log == [] and [entry["msg"] for entry in result["instances"]] == [
        "would restart a@0.service", "would restart a@1.service"]
