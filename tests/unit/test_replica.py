"""replica.py: per-node copies of a model, on this host's disk, and numa-pin exec using them."""
import errno
import os
import signal
import stat
import threading

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import replica
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

from tests.unit.test_pagecache import disk_dir, write_file  # noqa: F401  (disk_dir: a fixture)

SIZE = 1 << 20


@pytest.fixture
def model(disk_dir):  # noqa: F811
    return write_file(os.path.join(disk_dir, "model.gguf"), SIZE)


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def test_the_copy_has_the_model_bytes_and_its_times_and_lives_under_the_node(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    copy, copied = replica.ensure_replica(model, root, [0])
    assert copied
    assert os.path.dirname(copy) == os.path.join(root, "node0")
    assert copy.endswith("-model.gguf")
    assert read_bytes(copy) == read_bytes(model)
    assert os.stat(copy).st_mtime_ns == os.stat(model).st_mtime_ns


def test_a_fresh_copy_is_kept_and_a_changed_model_is_copied_again(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    first, _ = replica.ensure_replica(model, root, [0])
    again, copied = replica.ensure_replica(model, root, [0])
    assert (again, copied) == (first, False)
    write_file(model, SIZE // 2)
    again, copied = replica.ensure_replica(model, root, [0])
    assert (again, copied) == (first, True)
    assert read_bytes(again) == read_bytes(model)


def test_instances_of_one_node_copy_once(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(replica.ensure_replica(model, root, [0])))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(copied for _path, copied in outcomes) == [False, False, False, True]
    assert sorted(os.listdir(os.path.join(root, "node0"))) == [".lock", os.path.basename(outcomes[0][0])]


def test_models_of_the_same_name_and_node_sets_get_their_own_copies():
    one = replica.replica_path("/r", "/models/a/model.gguf", [1])
    other = replica.replica_path("/r", "/models/b/model.gguf", [1])
    spread = replica.replica_path("/r", "/models/a/model.gguf", [1, 0])
    assert one != other and one.startswith("/r/node1/") and other.startswith("/r/node1/")
    assert spread.startswith("/r/node0+1/")


def test_no_room_for_the_copy_is_an_error_that_names_the_fix(model, disk_dir, monkeypatch):  # noqa: F811
    statvfs = os.statvfs(disk_dir)
    full = os.statvfs_result((statvfs.f_bsize, statvfs.f_frsize, statvfs.f_blocks, 0, 0) + tuple(statvfs)[5:])
    monkeypatch.setattr(os, "statvfs", lambda path: full)
    with pytest.raises(NumaError, match="no room for a %d-byte replica.*free disk space" % SIZE):
        replica.ensure_replica(model, os.path.join(disk_dir, "replicas"), [0])


def test_a_directory_is_not_replicated(disk_dir):  # noqa: F811
    with pytest.raises(NumaError, match="copies model files"):
        replica.ensure_replica(disk_dir, os.path.join(disk_dir, "replicas"), [0])


def test_the_directory_comes_from_the_option_then_systemd(monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/llama:/var/lib/other")
    assert replica.replica_root("/srv/replicas") == "/srv/replicas"
    assert replica.replica_root(None) == "/var/lib/llama"
    monkeypatch.delenv("STATE_DIRECTORY")
    with pytest.raises(NumaError, match="--replica-dir"):
        replica.replica_root(None)


def test_the_server_arguments_name_the_copy():
    argv = ["llama-server", "--model", "/m/model.gguf", "--lora=/m/model.gguf", "/m/model.gguf.bak"]
    assert replica.point_at_replicas(argv, {"/m/model.gguf": "/r/node1/x-model.gguf"}) == [
        "llama-server", "--model", "/r/node1/x-model.gguf", "--lora=/r/node1/x-model.gguf", "/m/model.gguf.bak"]
    with pytest.raises(NumaError, match="no server argument is the model path /m/other.gguf"):
        replica.point_at_replicas(argv, {"/m/other.gguf": "/r/node1/y-other.gguf"})


# --- a copy no one else can steer ---------------------------------------------------------------------------------


def statvfs_with_free(real, free):
    """``real`` (an os.statvfs result) with ``free`` bytes available, rounded down to its fragments."""
    fields = list(real)
    fields[4] = free // real.f_frsize  # f_bavail
    return os.statvfs_result(fields)


def tmpfile_supported(directory):
    try:
        os.close(os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600))
    except OSError:
        return False
    return True


def test_the_copy_is_readable_by_no_one_the_model_is_not(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    for mode in (0o644, 0o640, 0o604, 0o600):
        os.chmod(model, mode)
        copy, _ = replica.ensure_replica(model, root, [0])
        assert stat.S_IMODE(os.stat(copy).st_mode) & 0o077 & ~mode == 0, oct(mode)


def test_a_copy_is_fresh_only_with_the_stamp_of_this_very_model(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    copy, _ = replica.ensure_replica(model, root, [0])
    os.removexattr(copy, replica.STAMP_ATTRIBUTE)
    assert replica.ensure_replica(model, root, [0]) == (copy, True)
    info = os.stat(model)
    twin = write_file(model + ".twin", SIZE)
    os.utime(twin, ns=(info.st_atime_ns, info.st_mtime_ns))
    os.replace(twin, model)  # same size and times, another file
    assert replica.ensure_replica(model, root, [0]) == (copy, True)
    assert read_bytes(copy) == read_bytes(model)
    assert replica.ensure_replica(model, root, [0]) == (copy, False)


def test_a_link_at_the_copys_name_is_replaced_never_written_through(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    copy = replica.replica_path(root, model, [0])
    os.makedirs(os.path.dirname(copy))
    info = os.stat(model)
    victim = write_file(os.path.join(disk_dir, "victim"), SIZE)
    os.utime(victim, ns=(info.st_atime_ns, info.st_mtime_ns))
    before = read_bytes(victim)
    os.symlink(victim, copy)
    assert replica.ensure_replica(model, root, [0]) == (copy, True)
    assert not os.path.islink(copy) and read_bytes(copy) == read_bytes(model)
    assert read_bytes(victim) == before


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o2770])
def test_a_replica_directory_its_group_or_others_may_write_is_refused(model, disk_dir, mode):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    os.mkdir(root)
    os.chmod(root, mode)
    with pytest.raises(NumaError) as refused:
        replica.ensure_replica(model, root, [0])
    message = str(refused.value)
    assert "refusing the replica directory %s (owner " % root in message and "(uid %d)" % os.geteuid() in message
    assert "chmod go-w" in message and "\n" not in message
    assert os.listdir(root) == []


@pytest.mark.parametrize("mode", [0o1777, 0o755, 0o700])
def test_a_sticky_or_owner_only_replica_directory_is_used(model, disk_dir, mode):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    os.mkdir(root)
    os.chmod(root, mode)
    assert replica.ensure_replica(model, root, [0])[1]


@pytest.mark.parametrize("linked", ["a directory above", "the replica directory", "the node directory"])
def test_a_symbolic_link_on_the_replica_path_is_refused_and_nothing_is_made_behind_it(model, disk_dir,  # noqa: F811
                                                                                        linked):
    elsewhere = os.path.join(disk_dir, "elsewhere")
    os.mkdir(elsewhere)
    link, root = {
        "a directory above": ("link", "link/replicas"),
        "the replica directory": ("link", "link"),
        "the node directory": ("replicas/node0", "replicas"),
    }[linked]
    link, root = os.path.join(disk_dir, link), os.path.join(disk_dir, root)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(elsewhere, link)
    with pytest.raises(NumaError, match="refusing the replica directory %s: it is a symbolic link" % link):
        replica.ensure_replica(model, root, [0])
    assert os.listdir(elsewhere) == []


def test_the_model_is_never_read_through_a_symbolic_link(model, disk_dir):  # noqa: F811
    link = os.path.join(disk_dir, "link.gguf")
    os.symlink(model, link)
    with pytest.raises(NumaError, match="cannot replicate %s: it is a symbolic link.*realpath" % link):
        replica.ensure_replica(link, os.path.join(disk_dir, "replicas"), [0])


def test_a_fifo_in_place_of_the_model_or_the_lock_is_refused_without_waiting(model, disk_dir):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    fifo = os.path.join(disk_dir, "fifo.gguf")
    os.mkfifo(fifo)
    with pytest.raises(NumaError, match="this is not a regular file"):
        replica.ensure_replica(fifo, root, [0])
    os.mkfifo(os.path.join(root, "node0", replica.LOCK_NAME))
    with pytest.raises(NumaError, match="refusing the lock .*: it is not a regular file; remove it"):
        replica.ensure_replica(model, root, [0])


@settings(max_examples=200, derandomize=True)
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1))
def test_a_copy_is_never_taken_for_a_partial_copy_and_a_partial_copy_always_is(name):
    assert not replica._is_partial_name(os.path.basename(replica.replica_path("/r", "/models/" + name, [0])))
    assert replica._is_partial_name(replica._partial_name())


def test_stale_partial_copies_are_removed_and_counted_as_free_space(model, disk_dir, monkeypatch):  # noqa: F811
    root = os.path.join(disk_dir, "replicas")
    copy, _ = replica.ensure_replica(model, root, [0])
    node = os.path.dirname(copy)
    os.unlink(copy)
    stale = write_file(os.path.join(node, replica._partial_name()), SIZE)
    not_partials = [write_file(os.path.join(node, name), 1)
                    for name in ("x.partial-1", ".partial-0123456789ABCDEF", ".partial-0123456789abcdef0")]
    not_partials.append(os.path.join(node, replica._partial_name()))
    os.symlink(model, not_partials[-1])  # a link is never a partial copy of ours, whatever its name
    real = os.statvfs(node)
    monkeypatch.setattr(os, "statvfs", lambda path: statvfs_with_free(real, SIZE - 1))
    assert replica.ensure_replica(model, root, [0]) == (copy, True)
    assert not os.path.exists(stale) and all(os.path.exists(path) for path in not_partials)
    os.unlink(copy)
    with pytest.raises(NumaError, match="no room for a %d-byte replica" % SIZE):
        replica.ensure_replica(model, root, [0])


@pytest.mark.parametrize("naming", ["unnamed", "named"])
def test_a_failed_copy_leaves_no_partial_copy(model, disk_dir, monkeypatch, naming):  # noqa: F811
    if naming == "unnamed" and not tmpfile_supported(disk_dir):
        pytest.skip("the file system of %s has no O_TMPFILE" % disk_dir)
    if naming == "named":
        monkeypatch.setattr(os, "O_TMPFILE", os.O_DIRECTORY)  # what a kernel without O_TMPFILE sees: EISDIR
    root = os.path.join(disk_dir, "replicas")
    node = os.path.join(root, "node0")
    seen = []

    def full_disk(_out, _source, _offset, _count):
        seen.extend(name for name in os.listdir(node) if replica._is_partial_name(name))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "sendfile", full_disk)
    with pytest.raises(NumaError, match="No space left on device; free disk space"):
        replica.ensure_replica(model, root, [0])
    assert len(seen) == (1 if naming == "named" else 0)
    assert os.listdir(node) == [replica.LOCK_NAME]


def test_the_signal_dispositions_are_restored_after_the_copy_and_an_ignored_one_stays_ignored(
        model, disk_dir, monkeypatch):  # noqa: F811
    def own_handler(_signum, _frame):
        pass

    during = []
    sendfile = os.sendfile

    def watched(*args):
        during.append((signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)))
        return sendfile(*args)

    monkeypatch.setattr(os, "sendfile", watched)
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, own_handler)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert replica.ensure_replica(model, os.path.join(disk_dir, "replicas"), [0])[1]
        after = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert during and all(term is not own_handler and hup is signal.SIG_IGN for term, hup in during)
    assert after == (own_handler, signal.SIG_IGN)


# A copy in a process of its own that says when it started and then crawls: 64 KiB per 50 ms.
SLOW_COPY = """
import os, signal, sys, time
from numa.act import replica

# As an interactive start has it: a shell without job control (CI's background phases) starts its
# children with SIGINT ignored, and an ignored signal stays ignored by design.
signal.signal(signal.SIGINT, signal.default_int_handler)

model, root, naming = sys.argv[1:]
if naming == "named":
    os.O_TMPFILE = os.O_DIRECTORY  # what a kernel without O_TMPFILE sees: EISDIR
sendfile = os.sendfile

def crawl(out, source, offset, count):
    print("copying", flush=True)
    time.sleep(0.05)
    return sendfile(out, source, offset, min(count, 1 << 16))

os.sendfile = crawl
replica.ensure_replica(model, root, [0])
"""


def partial_copies(pid, node):
    """The partial copies in ``node``: the named ones, and the unnamed (O_TMPFILE) ones process ``pid`` has open."""
    named = [name for name in os.listdir(node) if replica._is_partial_name(name)]
    fds = os.path.join("/proc", str(pid), "fd")
    links = [os.readlink(os.path.join(fds, fd)) for fd in os.listdir(fds)]
    return named + [link for link in links if link.startswith(os.path.join(node, "#"))]
