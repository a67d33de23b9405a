"""The suite's own machinery (tests/conftest.py, tests/tools.py): the shuffled order and its seed, and a tool
`make test` installs that is missing failing under `make test` instead of skipping."""

import os
import types

import pytest

from tests import conftest, tools


class _Config:
    def __init__(self, seed):
        self.shuffle_seed = seed


def _items():
    """Three modules; the second has a class whose tests must stay together."""
    items = []
    for module, cls, count in (("tests/unit/test_a.py", None, 4), ("tests/unit/test_b.py", None, 2),
                               ("tests/unit/test_b.py", "TestB", 3), ("tests/docs/test_c.py", None, 5)):
        for index in range(count):
            nodeid = "%s::%stest_%d" % (module, cls + "::" if cls else "", index)
            items.append(types.SimpleNamespace(nodeid=nodeid, cls=cls))
    return items


def _shuffled(seed):
    items = _items()
    conftest.pytest_collection_modifyitems(None, _Config(seed), items)
    return [item.nodeid for item in items]


def _runs(order, key):
    """How many runs of consecutive equal keys the order has."""
    keys = [key(nodeid) for nodeid in order]
    return sum(1 for index, value in enumerate(keys) if index == 0 or keys[index - 1] != value)


def test_the_same_seed_gives_the_same_order_and_keeps_every_test():
    assert _shuffled(11) == _shuffled(11)
    assert sorted(_shuffled(11)) == sorted(item.nodeid for item in _items())


def test_other_seeds_give_other_orders():
    orders = {tuple(_shuffled(seed)) for seed in range(1, 30)}
    assert len(orders) > 20


def test_a_modules_tests_and_a_classs_tests_stay_together():
    for seed in range(1, 30):
        order = _shuffled(seed)
        assert _runs(order, lambda nodeid: nodeid.split("::")[0]) == 3, order
        assert _runs(order, lambda nodeid: "TestB" in nodeid) <= 3, order


def test_without_a_seed_the_order_is_the_files():
    items = _items()
    conftest.pytest_collection_modifyitems(None, _Config(None), items)
    assert [item.nodeid for item in items] == [item.nodeid for item in _items()]


def test_a_missing_tool_skips_outside_make_test(monkeypatch):
    monkeypatch.delenv(tools.REQUIRE_TOOLS, raising=False)
    with pytest.raises(pytest.skip.Exception, match="promtool is not installed"):
        tools.missing("promtool is not installed")


def test_a_missing_tool_fails_under_make_test(monkeypatch):
    monkeypatch.setenv(tools.REQUIRE_TOOLS, "1")
    with pytest.raises(pytest.fail.Exception, match="promtool is not installed .*make test installs it"):
        tools.missing("promtool is not installed")


def test_the_needs_mark_carries_whether_the_tool_is_absent_and_why():
    for compiler, absent in ((None, True), ("/usr/bin/cc", False)):  # what shutil.which gives
        mark = tools.needs(compiler is None, "no C compiler").mark
        assert (mark.name, mark.args, mark.kwargs) == ("needs_tool", (absent,), {"reason": "no C compiler"})


def test_the_needs_mark_is_applied_when_the_test_is_set_up(monkeypatch):
    monkeypatch.setenv(tools.REQUIRE_TOOLS, "1")
    item = types.SimpleNamespace(iter_markers=lambda name: [tools.needs(True, "no lstopo").mark])
    with pytest.raises(pytest.fail.Exception, match="no lstopo"):
        conftest.pytest_runtest_setup(item)
    present = types.SimpleNamespace(iter_markers=lambda name: [tools.needs(False, "no lstopo").mark])
    conftest.pytest_runtest_setup(present)


@pytest.mark.parametrize("line, chosen", [
    ("tmpfs /dev/shm tmpfs rw,nosuid,relatime,size=24683664k 0 0", True),
    ("tmpfs /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime 0 0", False),  # no fake interpreters, no device nodes
    ("tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0", False),
    ("tmpfs /dev/shm tmpfs ro,relatime 0 0", False),
    ("/dev/vda /dev/shm ext4 rw,relatime 0 0", False),  # not RAM
    ("tmpfs /run tmpfs rw,relatime 0 0", False),
])
def test_scratch_files_go_to_ram_only_where_the_tests_can_use_it(tmp_path, line, chosen):
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw,relatime 0 0\n%s\n" % line)
    expected = conftest.RAM_TMPDIR if chosen and os.access(conftest.RAM_TMPDIR, os.W_OK | os.X_OK) else None
    plenty = lambda path: types.SimpleNamespace(f_bavail=conftest.RAM_MIN_FREE, f_frsize=1)  # noqa: E731
    assert conftest.ram_tmpdir(str(mounts), plenty) == expected
    assert conftest.ram_tmpdir(str(tmp_path / "no-proc"), plenty) is None


def test_scratch_files_go_to_disk_when_ram_is_short(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("tmpfs /dev/shm tmpfs rw,nosuid,relatime 0 0\n")
    if not os.access(conftest.RAM_TMPDIR, os.W_OK | os.X_OK):
        pytest.skip("no writable /dev/shm here")

    def free(blocks):
        return lambda path: types.SimpleNamespace(f_bavail=blocks, f_frsize=4096)
    assert conftest.ram_tmpdir(str(mounts), free(conftest.RAM_MIN_FREE // 4096)) == conftest.RAM_TMPDIR
    assert conftest.ram_tmpdir(str(mounts), free(conftest.RAM_MIN_FREE // 4096 - 1)) is None

    def gone(path):
        raise FileNotFoundError(path)
    assert conftest.ram_tmpdir(str(mounts), gone) is None
