"""numa_governor: the cpufreq governor set by policy, persisted by a tmpfiles.d drop-in, and put back."""

import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import governor, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from tests.unit.test_device_irqs import GATE, measured

POLICIES = "sys/devices/system/cpu/cpufreq"


def host(tmp_path, policies=((0, 1), (2, 3)), current="powersave", available="performance powersave"):
    """A root whose cpufreq has one policy per tuple of CPUs, each running ``current``, as intel_pstate shows
    them (each CPU's cpufreq a link to its policy)."""
    root = str(tmp_path / "root")
    for number, cpus in enumerate(policies):
        directory = os.path.join(root, POLICIES, "policy%d" % number)
        os.makedirs(directory)
        for name, text in (("related_cpus", " ".join(map(str, cpus))), ("scaling_governor", current),
                           ("scaling_available_governors", available)):
            with open(os.path.join(directory, name), "w") as handle:
                handle.write(text + "\n")
        for cpu in cpus:
            os.makedirs(os.path.join(root, "sys/devices/system/cpu/cpu%d" % cpu))
            os.symlink("../cpufreq/policy%d" % number, os.path.join(root, "sys/devices/system/cpu/cpu%d/cpufreq" % cpu))
    return root


def governors(root):
    return {name: open(os.path.join(root, POLICIES, name, "scaling_governor")).read().strip()
            for name in sorted(os.listdir(os.path.join(root, POLICIES)))}


def dropin(root):
    path = os.path.join(root, governor.DROPIN_PATH.lstrip("/"))
    return open(path).read() if os.path.exists(path) else None


def test_every_policy_gets_the_governor_now_and_a_boot_time_dropin(tmp_path):
    root = host(tmp_path)
    plan = governor.make_plan(root, "performance")
    assert governor.result(plan, True)["msg"].startswith("would set policy0 powersave -> performance; policy1")
    assert governors(root) == {"policy0": "powersave", "policy1": "powersave"}  # planning writes nothing
    knobs.apply(plan.knob)
    assert governors(root) == {"policy0": "performance", "policy1": "performance"}
    assert dropin(root).splitlines()[1:] == [
        "w /sys/devices/system/cpu/cpufreq/policy0/scaling_governor - - - - performance",
        "w /sys/devices/system/cpu/cpufreq/policy1/scaling_governor - - - - performance"]
    again = governor.make_plan(root, "performance")
    assert not again.changed and governor.result(again, False)["msg"].startswith("governor already as wanted")


def test_cpus_choose_their_policies_and_a_shared_policy_is_named(tmp_path):
    root = host(tmp_path, policies=((0, 1), (2, 3), (4, 5)))
    plan = governor.make_plan(root, "performance", cpus="3-5")
    knobs.apply(plan.knob)
    assert governors(root) == {"policy0": "powersave", "policy1": "performance", "policy2": "performance"}
    assert "policy1 also clocks CPUs 2, which are not in cpus: they get the governor too" in plan.knob.reasons
    assert governor.result(plan, False)["policies"]["policy2"] == {"cpus": "4-5", "before": "powersave",
                                                                   "after": "performance"}


@pytest.mark.parametrize("options, message", [
    ({"governor": "turbo"}, r"governor turbo is not available: policy0 \(CPUs 0-1\) offers performance powersave"),
    ({"governor": "performance", "cpus": "2-9"}, r"cpus 4-9 are in no cpufreq policy .*give CPUs of 0-3"),
    ({"governor": "performance", "cpus": "x"}, r"^cpus: "),
    ({"governor": "../../etc"}, r"governor '../../etc' is no cpufreq governor's name"),
])
def test_what_the_host_cannot_take_is_refused_naming_the_fix_and_changes_nothing(tmp_path, options, message):
    root = host(tmp_path)
    with pytest.raises(NumaError, match=message):
        governor.make_plan(root, **options)
    assert governors(root) == {"policy0": "powersave", "policy1": "powersave"} and dropin(root) is None


def test_a_host_without_cpufreq_changes_nothing_and_says_so(tmp_path):
    root = str(tmp_path / "vm")
    os.makedirs(os.path.join(root, "sys/devices/system/cpu"))
    plan = governor.make_plan(root, "performance")
    result = governor.result(plan, False)
    assert not plan.changed and result["supported"] is False and "no cpufreq policies" in result["msg"]


def test_the_original_governors_and_dropin_come_back(tmp_path):
    root = host(tmp_path)
    knobs.apply(governor.make_plan(root, "performance").knob)
    knobs.apply(governor.make_plan(root, "powersave").knob)  # a later change keeps the first originals
    refused, result = knobs.put_back(root, governor.KNOB, False, False, governor.restore_result)
    assert refused is None and result["changed"] and result["governor"] == governor.ORIGINAL
    assert governors(root) == {"policy0": "powersave", "policy1": "powersave"} and dropin(root) is None
    refused, again = knobs.put_back(root, governor.KNOB, False, False, governor.restore_result)
    assert refused is None and not again["changed"] and "nothing to restore" in again["msg"]


def test_persist_false_removes_the_dropin_and_keeps_the_governor(tmp_path):
    root = host(tmp_path)
    knobs.apply(governor.make_plan(root, "performance").knob)
    plan = governor.make_plan(root, "performance", persist=False)
    assert plan.changed and not plan.knob.runtime_changes
    knobs.apply(plan.knob)
    assert dropin(root) is None and governors(root)["policy0"] == "performance"


def test_a_planted_symlink_at_the_dropin_or_a_policy_file_is_never_followed(tmp_path):
    root = host(tmp_path)
    os.makedirs(os.path.join(root, "etc/tmpfiles.d"))
    os.symlink("/etc/shadow", os.path.join(root, governor.DROPIN_PATH.lstrip("/")))
    with pytest.raises(NumaError, match="refusing to use .*a symlink"):
        governor.make_plan(root, "performance")
    os.unlink(os.path.join(root, governor.DROPIN_PATH.lstrip("/")))
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    policy0 = os.path.join(root, POLICIES, "policy0", "scaling_governor")
    os.unlink(policy0)
    os.symlink(str(target), policy0)
    with pytest.raises(NumaError, match="refusing to"):
        knobs.apply(governor.make_plan(root, "performance").knob)
    assert target.read_text() == "keep\n"


def test_a_governor_something_else_rewrites_fails_naming_who_does_it(tmp_path, monkeypatch):
    root = host(tmp_path)
    plan = governor.make_plan(root, "performance")
    monkeypatch.setattr(knobs, "write_setting", lambda _root, _setting: None)  # the write does not stick
    with pytest.raises(NumaError, match="but the kernel reports powersave: something else sets the governor"):
        knobs.apply(plan.knob)


# ---------------------------------------------------------------- the A/B gate

UNIT = "llama@1.service"


def test_a_governor_change_the_gate_finds_no_slower_is_kept_with_its_verdict(tmp_path):
    root = host(tmp_path)
    plan = governor.make_plan(root, "performance")
    verdicts, rolled_back = governor.apply_gated(plan, [(UNIT, GATE)], measured([10.0] * 3, [12.0] * 3))
    assert not rolled_back and verdicts[UNIT]["kept"] and verdicts[UNIT]["gain_percent"] == 20.0
    assert governors(root) == {"policy0": "performance", "policy1": "performance"} and dropin(root)


def test_a_slower_governor_is_put_back_whole_recorded_and_not_tried_again_until_asked_otherwise(tmp_path):
    root = host(tmp_path)
    plan = governor.make_plan(root, "performance")
    verdicts, rolled_back = governor.apply_gated(plan, [(UNIT, GATE)], measured([10.0] * 3, [5.0] * 3))
    assert rolled_back and not verdicts[UNIT]["kept"]
    assert governors(root) == {"policy0": "powersave", "policy1": "powersave"} and dropin(root) is None
    result = governor.result(plan, False, verdicts, rolled_back)
    assert result["msg"].startswith("rolled back, slower by the A/B gate: %s 10.00 -> 5.00 tokens/s" % UNIT)
    again = governor.unless_rejected(governor.make_plan(root, "performance"), root)
    assert not again.changed and "the A/B gate rolled this change back before (%s: 10.00 -> 5.00" % UNIT in (
        again.knob.reasons[-1])
    other = governor.unless_rejected(governor.make_plan(root, "performance", cpus="0"), root)
    assert other.changed  # another change is measured
    knobs.put_back(root, governor.KNOB, False, False, governor.restore_result)
    assert knobs.forget(root, governor.REJECTED_PATH, False) and governor.rejected(root) is None


def test_a_governor_change_that_cannot_be_measured_changes_nothing_before_and_is_taken_back_after(tmp_path):
    root = host(tmp_path)
    plan = governor.make_plan(root, "performance")
    with pytest.raises(NumaError, match="cannot measure the tokens/s of llama@1.service before the change; nothing"):
        governor.apply_gated(plan, [(UNIT, GATE)], measured(NumaError("refused")))
    assert governors(root) == {"policy0": "powersave", "policy1": "powersave"} and dropin(root) is None
    with pytest.raises(NumaError, match="after the change: timed out; the governors were put back as they were"):
        governor.apply_gated(plan, [(UNIT, GATE)], measured([10.0] * 3, NumaError("timed out")))
    assert governors(root) == {"policy0": "powersave", "policy1": "powersave"} and dropin(root) is None


def test_a_rejected_record_that_is_not_the_modules_or_not_roots_alone_is_refused(tmp_path):
    root = host(tmp_path)
    path = os.path.join(root, governor.REJECTED_PATH.lstrip("/"))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write('{"settings": {"policy0": 7}, "dropin": null, "verdict": "x"}')
    os.chmod(path, 0o600)
    with pytest.raises(NumaError, match="is not the A/B gate's record numa_governor writes; remove it"):
        governor.unless_rejected(governor.make_plan(root, "performance"), root)
    os.chmod(path, 0o666)
    with pytest.raises(NumaError, match="refusing to use .*governor.rejected"):
        governor.rejected(root)
