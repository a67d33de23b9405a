"""One trust rule for the drop-ins root keeps for boot (system/root_files.dropin_distrust): a regular file of the user
the module runs as that no group or other user may write. balancing's sysctl.d file and the weights' tmpfiles.d file
are both judged by it: one that fails it is rewritten (balancing) or refused (weights), never applied as it is."""

import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import balancing, interleave_weights, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.system import root_files
from tests.fixtures import sysfs
from tests.unit.balancing_fakeroot import FakeRoot


def regular(tmp_path, mode):
    path = tmp_path / "file"
    path.write_text("x\n")
    os.chmod(str(path), mode)
    return str(path)


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o640, 0o444])
def test_a_regular_file_root_alone_may_write_is_trusted(tmp_path, mode):
    assert root_files.dropin_distrust(os.lstat(regular(tmp_path, mode))) is None


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666, 0o620])
def test_a_file_group_or_others_may_write_is_not(tmp_path, mode):
    assert root_files.dropin_distrust(os.lstat(regular(tmp_path, mode))) == (
        "mode %04o, writable by others than its owner" % mode)


def test_a_link_or_a_fifo_is_not(tmp_path):
    os.symlink(regular(tmp_path, 0o644), str(tmp_path / "link"))
    os.mkfifo(str(tmp_path / "fifo"))
    assert root_files.dropin_distrust(os.lstat(str(tmp_path / "link"))) == "a symlink"
    assert root_files.dropin_distrust(os.lstat(str(tmp_path / "fifo"))) == "not a regular file"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_file_another_user_owns_is_not(tmp_path):
    path = regular(tmp_path, 0o644)
    os.chown(path, 4242, 4242)
    assert root_files.dropin_distrust(os.lstat(path)) == "owned by uid 4242"


# ---------------------------------------------------------------- both drop-ins, judged by that rule


def balancing_dropin(tmp_path):
    """A host whose sysctl.d drop-in balancing wrote; (root, its path on the host)."""
    host = FakeRoot(tmp_path / "sysctl").knobs(balancing=1, zone_reclaim=0).debian()
    plan = balancing.make_plan(host.path, balancing.BalancingRequest())
    knobs.write_dropin(plan.knob)
    return host.path, host.real(balancing.DROPIN_PATH)


def weights_dropin(tmp_path):
    """A host whose tmpfiles.d drop-in holds what numa_weights writes; (root, its path on the host)."""
    root = str(tmp_path / "weights")
    sysfs.snc2_cxl().write(root)
    directory = os.path.join(root, "etc/tmpfiles.d")
    os.makedirs(directory, 0o755)
    os.chmod(directory, 0o755)
    path = os.path.join(directory, interleave_weights.DROPIN_NAME)
    with open(path, "w") as handle:
        handle.write(interleave_weights.dropin_text("hmat", {0: 1}, None))
    os.chmod(path, 0o644)
    return root, path


def untrusted(path, how):
    """The drop-in at ``path`` made untrusted: group-writable, or a link to a copy of itself."""
    if how == "0664":
        os.chmod(path, 0o664)
    else:
        os.rename(path, path + ".real")
        os.symlink(os.path.basename(path) + ".real", path)


@pytest.mark.parametrize("how", ["0664", "symlink"])
def test_balancing_rewrites_an_untrusted_dropin_even_with_the_right_text(tmp_path, how):
    root, path = balancing_dropin(tmp_path)
    assert not balancing.make_plan(root, balancing.BalancingRequest()).dropin_changed
    untrusted(path, how)
    plan = balancing.make_plan(root, balancing.BalancingRequest())
    assert plan.dropin_changed and plan.dropin_flaw.startswith("mode 0664, writable" if how == "0664" else "a symlink")


@pytest.mark.parametrize("how", ["0664", "symlink"])
def test_weights_refuses_an_untrusted_dropin(tmp_path, how):
    root, path = weights_dropin(tmp_path)
    assert knobs.read_trusted(root, interleave_weights.KNOB).startswith("# Written by inferops.numa")
    untrusted(path, how)
    with pytest.raises(NumaError, match="refusing to use %s: %s" % (path, "mode 0664" if how == "0664" else "a symlink")):
        knobs.read_trusted(root, interleave_weights.KNOB)
