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


# ---------------------------------------------------------------- the originals, recorded once and put back

RECORD = "var/lib/inferops-numa/originals/numa_test.json"
DROPIN = "etc/test.d/60-inferops-numa-test.conf"


def snapshot(root):
    """The runtime value and the drop-in's bytes (None: absent), as a restore must leave them."""
    with open(os.path.join(root, "sys/kernel/test/level"), "rb") as handle:
        level = handle.read()
    path = os.path.join(root, DROPIN)
    if not os.path.lexists(path):
        return level, None
    if os.path.islink(path):
        return level, "-> " + os.readlink(path)
    with open(path, "rb") as handle:
        return level, handle.read(), oct(os.stat(path).st_mode & 0o777)


@pytest.fixture
def own_dropin(root):
    """A host whose drop-in path already holds the admin's own file."""
    os.makedirs(os.path.join(root, "etc/test.d"), 0o755)
    with open(os.path.join(root, DROPIN), "w") as handle:
        handle.write("level 1 # the admin's\n")
    os.chmod(os.path.join(root, DROPIN), 0o640)
    return root


def test_the_first_apply_records_the_originals_and_a_later_one_keeps_them(own_dropin):
    root = own_dropin
    knobs.apply(plan(root, "3"))
    record = os.path.join(root, RECORD)
    assert oct(os.stat(record).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(record)).st_mode & 0o777) == "0o700"
    originals, refused = knobs.read_originals(root, TEST)
    assert refused is None
    assert originals.settings == (("level", "/sys/kernel/test/level", "1"),)
    assert originals.dropin == knobs.DropinOriginal(knobs.FILE, "level 1 # the admin's\n", 0o640)
    with open(record, "rb") as handle:
        first = handle.read()
    knobs.apply(plan(root, "5"))  # the host now holds our 3: recording it would lose the host's 1
    with open(record, "rb") as handle:
        assert handle.read() == first


@pytest.mark.parametrize("admin_dropin", [False, True])
def test_restore_puts_back_the_values_and_the_dropin_byte_for_byte(root, admin_dropin):
    if admin_dropin:
        os.makedirs(os.path.join(root, "etc/test.d"), 0o755)
        with open(os.path.join(root, DROPIN), "w") as handle:
            handle.write("level 1 # the admin's\n")
        os.chmod(os.path.join(root, DROPIN), 0o640)
    before = snapshot(root)
    knobs.apply(plan(root, "3"))
    knobs.apply(plan(root, "4"))
    assert snapshot(root) != before

    checked = knobs.plan_restore(root, TEST)  # check mode: planned and shown, nothing written
    assert checked.changed and checked.refused is None and snapshot(root) != before
    file_diff, runtime_diff = knobs.diff(checked.knob)
    assert (runtime_diff["before"], runtime_diff["after"]) == ("level = 4\n", "level = 1\n")
    assert file_diff["after"] == ("level 1 # the admin's\n" if admin_dropin else "")
    assert "would restore the originals of numa_test: level 4 -> 1" in knobs.restore_summary(checked, True)

    knobs.restore(checked)
    assert snapshot(root) == before
    assert not os.path.exists(os.path.join(root, RECORD))
    again = knobs.plan_restore(root, TEST)  # nothing recorded any more: nothing to do
    assert not again.changed and again.refused is None and again.record is None
    assert "no originals recorded" in knobs.restore_summary(again, False)


def test_a_mask_at_the_dropin_path_is_recorded_and_put_back(root):
    os.makedirs(os.path.join(root, "etc/test.d"), 0o755)
    os.symlink("/dev/null", os.path.join(root, DROPIN))
    before = snapshot(root)
    setting = knobs.Setting("level", "/sys/kernel/test/level", "1", "3")
    found = knobs.inspect_dropin(root, TEST.dropin_path)  # as numa_balancing's force: true replaces a mask
    knobs.apply(knobs.KnobPlan(TEST, root, (setting,), found.content, "level 3\n", knobs.rewrite_reason(found), [], []))
    assert not os.path.islink(os.path.join(root, DROPIN))
    knobs.restore(knobs.plan_restore(root, TEST))
    assert snapshot(root) == before == (b"1\n", "-> /dev/null")


def test_a_setting_managed_later_is_added_without_touching_the_first(root):
    with open(os.path.join(root, "sys/kernel/test/extra"), "w") as handle:
        handle.write("7\n")
    knobs.apply(plan(root, "3"))
    extra = knobs.Setting("extra", "/sys/kernel/test/extra", "7", "8")
    level = knobs.Setting("level", "/sys/kernel/test/level", "3", "3")
    knobs.apply(plan(root, "3")._replace(settings=(level, extra)))
    originals, _ = knobs.read_originals(root, TEST)
    assert originals.settings == (("level", "/sys/kernel/test/level", "1"), ("extra", "/sys/kernel/test/extra", "7"))
    knobs.restore(knobs.plan_restore(root, TEST))
    assert knobs.read_value(root, "level", "/sys/kernel/test/level") == "1"
    assert knobs.read_value(root, "extra", "/sys/kernel/test/extra") == "7"


def hostile_symlink(record):
    os.rename(record, record + ".elsewhere")
    os.symlink(record + ".elsewhere", record)


def hostile_writable(record):
    os.chmod(record, 0o666)


def hostile_garbage(record):
    with open(record, "w") as handle:
        handle.write("{not json")


def hostile_foreign_path(record):
    import json
    with open(record) as handle:
        data = json.load(handle)
    data["settings"][0]["path"] = "/sys/kernel/test/../../../etc/shadow"
    with open(record, "w") as handle:
        json.dump(data, handle)


def hostile_directory(record):
    os.chmod(os.path.dirname(record), 0o777)


@pytest.mark.parametrize("spoil, cause", [
    (hostile_symlink, "it is a symlink"),
    (hostile_writable, "it is mode 0666, writable by others than its owner"),
    (hostile_garbage, "not the JSON record of numa_test's originals"),
    (hostile_foreign_path, "not the JSON record of numa_test's originals"),
    (hostile_directory, "writable by others"),
])
def test_a_record_not_to_be_trusted_is_refused_and_nothing_is_done(root, spoil, cause):
    knobs.apply(plan(root, "3"))
    spoil(os.path.join(root, RECORD))
    before = snapshot(root)
    refused = knobs.plan_restore(root, TEST)
    assert not refused.changed and refused.refused and "\n" not in refused.refused
    assert refused.refused.startswith("refusing the originals record %s" % os.path.join(root, RECORD))
    import re
    assert re.search(cause, refused.refused)
    knobs.restore(refused)  # refused: acts on nothing
    assert snapshot(root) == before
    with pytest.raises(NumaError, match="refusing the originals record"):  # nor does an apply add to it
        knobs.apply(plan(root, "5"))
    assert snapshot(root) == before
