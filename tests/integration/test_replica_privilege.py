"""replica.py run as root on directories a less-privileged user owns: every attack of issue 14 is refused.

The user is ``nobody`` (uid 65534): a forked child that has only its rights plants links and files
the way such a user could, then root makes the copy. Besides what each test checks, nothing
outside the replica directory may change: paths, inodes, modes, owners, sizes, times, contents.
"""
import hashlib
import os
import pwd
import shutil
import signal
import stat
import tempfile
import traceback

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import replica
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

from tests.unit.test_pagecache import write_file
from tests.integration.test_replica_processes import show_argv_and_note, start_slow_copy
from tests.unit.test_replica import SIZE, read_bytes, statvfs_with_free

NOBODY = 65534


def nobody_exists():
    try:
        pwd.getpwuid(NOBODY)
    except KeyError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="runs the replica path as root, and only root can plant files as "
                                                 "another user"),
    pytest.mark.skipif(not nobody_exists(), reason="no user with uid %d (nobody) to own the directories" % NOBODY),
]


def as_nobody(action, *args):
    """Run ``action(*args)`` in a child that has only nobody's rights; fail the test if it raises."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            action(*args)
            code = 0
        except BaseException:  # noqa: B902  (reported, then the child's exit code fails the test)
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "nobody's %s failed" % action.__name__


class Tree:
    """A model and a root-only corner owned by root, and nobody's home holding the replica directory."""

    def __init__(self, base):
        self.base = base
        self.model = write_file(self.make("models", 0o755, "model.gguf"), SIZE)
        self.secret = write_file(self.make("models", 0o755, "secret.gguf"), 1 << 16)
        os.chmod(self.secret, 0o600)
        self.rootonly = self.make("rootonly", 0o700)
        self.victim = write_file(os.path.join(self.rootonly, "victim"), 1 << 12)
        self.hidden = write_file(os.path.join(self.rootonly, "hidden.gguf"), 1 << 12)
        os.chmod(self.hidden, 0o644)
        self.home = self.make("home", 0o755)
        self.replicas = os.path.join(self.home, "replicas")
        os.chown(self.home, NOBODY, NOBODY)
        as_nobody(os.mkdir, self.replicas, 0o755)
        self.copy = replica.replica_path(self.replicas, self.model, [0])

    def make(self, directory, mode, *inside):
        path = os.path.join(self.base, directory)
        if not os.path.isdir(path):
            os.mkdir(path)
            os.chmod(path, mode)
        return os.path.join(path, *inside)

    def snapshot(self):
        """Every path outside the replica directory: (inode, mode, owner, size, mtime, content or link)."""
        seen = {}
        for directory, subdirectories, files in os.walk(self.base):
            subdirectories[:] = [name for name in subdirectories if os.path.join(directory, name) != self.replicas]
            for path in [directory] + [os.path.join(directory, name) for name in subdirectories + files]:
                info = os.lstat(path)
                seen[path] = (info.st_ino, info.st_mode, info.st_uid, info.st_gid, info.st_size, info.st_mtime_ns,
                              self.content(path, info))
        return seen

    @staticmethod
    def content(path, info):
        if stat.S_ISLNK(info.st_mode):
            return os.readlink(path)
        if stat.S_ISREG(info.st_mode):
            return hashlib.sha256(read_bytes(path)).hexdigest()
        return None

    def made_in_replicas(self):
        """The files in the replica directory other than locks: what a refused start must not leave."""
        return [os.path.join(directory, name) for directory, _, files in os.walk(self.replicas)
                for name in files if name != replica.LOCK_NAME]


@pytest.fixture
def tree():
    base = tempfile.mkdtemp(prefix="replica-privilege-", dir="/var/tmp")
    os.chmod(base, 0o755)
    try:
        as_nobody(os.listdir, base)
    except AssertionError:
        shutil.rmtree(base)
        pytest.skip("nobody cannot reach %s (a directory above it is closed to others)" % base)
    yield Tree(base)
    shutil.rmtree(base)


def assert_the_copy_is_roots_copy_of_the_model(tree):
    info = os.lstat(tree.copy)
    assert stat.S_ISREG(info.st_mode) and info.st_uid == 0
    assert read_bytes(tree.copy) == read_bytes(tree.model)


def plant_node_directory(tree):
    os.mkdir(os.path.dirname(tree.copy), 0o755)


def test_a_link_at_the_copys_name_to_a_root_file_is_replaced_never_written_through(tree):
    def plant(copy, victim):
        plant_node_directory(tree)
        os.symlink(victim, copy)

    as_nobody(plant, tree.copy, tree.victim)
    before = tree.snapshot()
    assert replica.ensure_replica(tree.model, tree.replicas, [0]) == (tree.copy, True)
    assert_the_copy_is_roots_copy_of_the_model(tree)
    assert tree.snapshot() == before


@pytest.mark.parametrize("linked", ["node directory", "directory above the replica directory"])
def test_a_link_on_the_replica_path_into_a_root_only_directory_is_refused(tree, linked):
    if linked == "node directory":
        link, root = os.path.dirname(tree.copy), tree.replicas
    else:
        link = os.path.join(tree.home, "link")
        root = os.path.join(link, "replicas")
    as_nobody(os.symlink, tree.rootonly, link)
    before = tree.snapshot()
    with pytest.raises(NumaError, match="refusing the replica directory %s: it is a symbolic link "
                                        r"\(owner nobody \(uid %d\)\)" % (link, NOBODY)):
        replica.ensure_replica(tree.model, root, [0])
    assert tree.snapshot() == before


@pytest.mark.parametrize("which, refusal", [
    ("a link to a root-only file", "it is a symbolic link"),
    ("a root-only file", r"the service's user nobody \(uid %d\) may not read it" % NOBODY),
    ("a file in a root-only directory", r"the service's user nobody \(uid %d\) may not read it" % NOBODY),
])
def test_a_model_the_service_user_may_not_read_is_not_copied(tree, which, refusal):
    model = {"a root-only file": tree.secret, "a file in a root-only directory": tree.hidden}.get(which)
    if model is None:
        model = os.path.join(tree.home, "model.gguf")
        as_nobody(os.symlink, tree.secret, model)
    before = tree.snapshot()
    with pytest.raises(NumaError, match="cannot replicate %s: %s" % (model, refusal)):
        replica.ensure_replica(model, tree.replicas, [0])
    assert tree.made_in_replicas() == []
    assert tree.snapshot() == before


@pytest.mark.parametrize("planted", ["link", "file"])
def test_a_planted_copy_with_the_models_size_times_and_stamp_is_not_used(tree, planted):
    info = os.stat(tree.model)
    forged_stamp = replica._stamp(info)
    evil = os.path.join(tree.home, "evil.gguf")

    def plant(copy):
        write_file(evil, SIZE)
        os.utime(evil, ns=(info.st_atime_ns, info.st_mtime_ns))
        os.setxattr(evil, replica.STAMP_ATTRIBUTE, forged_stamp)
        plant_node_directory(tree)
        if planted == "link":
            os.symlink(evil, copy)
        else:
            shutil.copy2(evil, copy)
            os.setxattr(copy, replica.STAMP_ATTRIBUTE, forged_stamp)

    as_nobody(plant, tree.copy)
    before = tree.snapshot()
    assert replica.ensure_replica(tree.model, tree.replicas, [0]) == (tree.copy, True)
    assert_the_copy_is_roots_copy_of_the_model(tree)
    assert tree.snapshot() == before


@pytest.mark.parametrize("case, owner_named", [
    ("nobody's, writable by all", r"nobody \(uid %d\)" % NOBODY),
    ("root's, writable by its group", r"root \(uid 0\)"),
    ("a third user's", "uid %d" % (NOBODY - 1)),
])
def test_a_replica_directory_others_may_write_is_refused_naming_it_and_its_owner(tree, case, owner_named):
    if case == "nobody's, writable by all":
        root = os.path.join(tree.home, "open")
        as_nobody(os.mkdir, root)
        as_nobody(os.chmod, root, 0o777)
    elif case == "root's, writable by its group":
        root = tree.make("shared", 0o770)
    else:
        root = os.path.join(tree.home, "other")
        os.mkdir(root, 0o755)
        os.chown(root, NOBODY - 1, NOBODY - 1)
    before = tree.snapshot()
    with pytest.raises(NumaError, match="refusing the replica directory %s.*%s.*chmod go-w" % (root, owner_named)):
        replica.ensure_replica(tree.model, root, [0])
    assert tree.snapshot() == before


@pytest.mark.parametrize("naming", ["unnamed", "named"])
def test_sigterm_during_the_copy_leaves_no_partial_copy(tree, naming):
    before = tree.snapshot()
    child = start_slow_copy(tree.model, tree.replicas, naming)
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGTERM
    assert os.listdir(os.path.dirname(tree.copy)) == [replica.LOCK_NAME]
    assert tree.snapshot() == before


def test_a_partial_copy_left_by_a_crash_is_removed_and_its_space_counted_free(tree, monkeypatch):
    nobodys = os.path.join(os.path.dirname(tree.copy), replica._partial_name())

    def plant(partial):
        plant_node_directory(tree)
        write_file(partial, 1 << 12)

    as_nobody(plant, nobodys)
    child = start_slow_copy(tree.model, tree.replicas, "named")
    assert child.stdout.readline() == "copying\n"  # the first chunk is written
    child.kill()
    child.communicate(timeout=30)
    node = os.path.dirname(tree.copy)
    left = [os.path.join(node, name) for name in os.listdir(node) if replica._is_partial_name(name)]
    left.remove(nobodys)
    assert len(left) == 1
    held = os.stat(left[0]).st_blocks * 512
    assert held > 0
    before = tree.snapshot()
    real = os.statvfs(node)
    monkeypatch.setattr(os, "statvfs", lambda path: statvfs_with_free(real, SIZE - held))
    assert replica.ensure_replica(tree.model, tree.replicas, [0]) == (tree.copy, True)
    assert not os.path.exists(left[0]) and os.path.exists(nobodys)  # only root's own partial copies go
    assert_the_copy_is_roots_copy_of_the_model(tree)
    assert tree.snapshot() == before


def test_numa_pin_exec_as_root_starts_the_server_on_the_shared_model_and_says_why(tree):
    argv, note = show_argv_and_note(tree.secret, tree.replicas, "--model", tree.secret)
    assert argv == ["--model", tree.secret]
    assert "NOT replicated, the server maps the shared model: cannot replicate %s: the service's user nobody" % (
        tree.secret) in note
    assert tree.made_in_replicas() == []
