"""A persisted kernel knob is one module on act/knobs' shape: a TEST knob (a fake /sys file and an etc/ drop-in
under a tmp root) planned, applied, verified, shown in check and diff mode, and removed."""

import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

TEST = knobs.Knob("numa_test", "/sys/kernel/test", "/etc/test.d/60-inferops-numa-test.conf", "something else writes it")


def plan(root, wanted, persist=True):
    """All a knob's module does: read the runtime value and the drop-in, decide, return a KnobPlan."""
    now = knobs.read_value(root, "level", "/sys/kernel/test/level")
    setting = knobs.Setting("level", "/sys/kernel/test/level", now, wanted)
    dropin = "level %s\n" % wanted if persist else None
    return knobs.KnobPlan(TEST, root, (setting,), knobs.read_trusted(root, TEST), dropin, None, ["asked"], [])


@pytest.fixture
def root(tmp_path):
    os.makedirs(str(tmp_path / "sys/kernel/test"))
    (tmp_path / "sys/kernel/test/level").write_text("1\n")
    os.makedirs(str(tmp_path / "etc"), 0o755)
    return str(tmp_path)


def test_a_test_knob_on_the_shape(root):
    checked = plan(root, "3")  # check mode: planned, shown, nothing written
    assert checked.changed and [s.name for s in checked.runtime_changes] == ["level"]
    file_diff, runtime_diff = knobs.diff(checked)
    assert (file_diff["before"], file_diff["after"]) == ("", "level 3\n")
    assert (runtime_diff["before"], runtime_diff["after"]) == ("level = 1\n", "level = 3\n")
    assert runtime_diff["before_header"] == root + "/sys/kernel/test (runtime)"
    assert knobs.read_value(root, "level", "/sys/kernel/test/level") == "1"

    knobs.apply(checked)  # runtime, then drop-in, then verified
    assert knobs.read_value(root, "level", "/sys/kernel/test/level") == "3"
    assert knobs.read_trusted(root, TEST) == "level 3\n" and not plan(root, "3").changed

    removal = plan(root, "3", persist=False)  # the drop-in goes; the runtime value stays (no record of the first one)
    knobs.apply(removal)
    assert knobs.read_trusted(root, TEST) is None and not os.listdir(os.path.join(root, "etc/test.d"))
    assert knobs.read_value(root, "level", "/sys/kernel/test/level") == "3"


def test_a_value_that_does_not_stick_fails_naming_the_file(root, monkeypatch):
    monkeypatch.setattr(knobs, "read_value", lambda root, name, path: "1")
    with pytest.raises(NumaError, match="wrote 3 to .*/sys/kernel/test/level but the kernel reports 1: something else"):
        knobs.apply(plan(root, "3"))
