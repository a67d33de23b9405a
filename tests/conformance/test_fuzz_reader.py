"""Seeded corruption of captured machines: the reader and the planner never crash, hang or leave the root.

Each case mutates one to three paths of a real machine dump from hwloc's test suite (extracted
into tmp; the dumps live in ../shared/fixtures/hwloc-linux and are never copied into this repo),
then reads it with ``topology.read`` and plans two requests on what was read, under an alarm.
What may come out: facts with one-line warnings, or a one-line NumaError from the planner. A
canary file outside the root must never be read, whatever symlinks the case planted. Every case
is undone before the next, and its seed is in the failure message. (numa-pin facts run as a process
on mutated machines: tests/integration/test_fuzz_reader_processes.py.)
"""

import errno
import itertools
import json
import os
import random
import shutil
import signal
import stat
import tarfile
from contextlib import ExitStack, contextmanager

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.read import kernel_files
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.cpulist import MAX_CPUS, MAX_NODES
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.tools import HWLOC_DUMPS, hwloc_dumps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMPS = HWLOC_DUMPS
# Many nodes; a large machine (256 CPUs, 64 nodes); PCI devices behind sysfs symlinks.
MACHINES = {"16amd64-8n2c": 150, "256ia64-64n2s2c": 90, "32em64t-2n8c+dax+nvme+mic+dimms": 150}
SEED = 14
CASE_SECONDS = 20  # far above a case's ~0.1 s, for a loaded 2-core machine

pytestmark = hwloc_dumps(*MACHINES)

CANARY = "987654321"
STASHED = itertools.count()
REQUESTS = ({}, {"instances": 2, "instance": 1, "model_size": "1G", "scope": "socket"})
NODE_DIR = "sys/devices/system/node"
KEY_FILES = ("sys/devices/system/cpu/online", "sys/devices/system/cpu/possible", "sys/devices/system/cpu/present",
             NODE_DIR + "/online", NODE_DIR + "/possible", NODE_DIR + "/has_cpu", NODE_DIR + "/has_memory",
             "proc/self/status", "proc/self/cpuset", "proc/mounts", "proc/meminfo")
HUGE = ("9" * 5000, "-" + "1" * 4400, "0x" + "f" * 70000, "0-1048575", "0-99999999999999999999",
        "ffffffff," * 3000 + "1", "Node 0 MemTotal: %s kB" % ("7" * 4400), "10 " * 20000, "1,2,3," * 20000 + "4")


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """Dump name -> (its extracted root, a canary file outside every root)."""
    outside = tmp_path_factory.mktemp("outside")
    canary = outside / "canary"
    canary.write_text("%s\nNode 0 MemTotal: %s kB\n" % (CANARY, CANARY))
    roots = {}
    for name in MACHINES:
        target = str(tmp_path_factory.mktemp("dump"))
        with tarfile.open(os.path.join(DUMPS, name + ".tar.bz2")) as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(target, filter="tar")
            else:
                archive.extractall(target)
        (top,) = os.listdir(target)
        roots[name] = os.path.join(target, top)
    return roots, str(canary)


def entries(root):
    """Every file, directory and symlink under root, relative, in a stable order."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in dirs + sorted(files):
            found.append(os.path.relpath(os.path.join(folder, name), root))
    return found


def pick(rng, root, everything):
    """Half the time a file the reader always opens, else any entry of the dump."""
    if rng.random() < 0.5:
        nodes = [rel for rel in everything if rel.startswith(NODE_DIR + "/node") and rel.count("/") <= 5]
        pool = [rel for rel in KEY_FILES if os.path.lexists(os.path.join(root, rel))] + nodes
        return rng.choice(pool)
    return rng.choice(everything)


# --- mutations: each changes one path and returns how to undo it ---------------------


def set_aside(root, rel, stash):
    """Move the entry away (to a stash outside the root); the undo puts it back."""
    path = os.path.join(root, rel)
    aside = os.path.join(stash, str(next(STASHED)))
    os.rename(path, aside)

    def undo():
        remove(path)
        os.rename(aside, path)
    return undo


def remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def copy_tree(source, target):
    """A copy of a node directory, leaving out what an earlier mutation planted (FIFOs, devices)."""
    def special(folder, names):
        return [name for name in names if not (os.path.islink(os.path.join(folder, name))
                                               or os.path.isdir(os.path.join(folder, name))
                                               or os.path.isfile(os.path.join(folder, name)))]
    shutil.copytree(source, target, symlinks=True, ignore=special)


def write(path, content):
    with open(path, "wb") as handle:
        handle.write(content)


def truncate(rng, root, rel, stash, canary):
    content = b""
    if stat.S_ISREG(os.lstat(os.path.join(root, rel)).st_mode):  # not what an earlier mutation planted
        with open(os.path.join(root, rel), "rb") as handle:
            content = handle.read()
    undo = set_aside(root, rel, stash)
    write(os.path.join(root, rel), content[:rng.randrange(len(content) + 1)])
    return undo


def garbage(rng, root, rel, stash, canary):
    undo = set_aside(root, rel, stash)
    write(os.path.join(root, rel), bytes(rng.choice(b"\x00\xff\n ,-0123456789abcxyz\xe0\xa5\xa7")
                                         for _ in range(rng.randrange(1, 200))))
    return undo


def huge(rng, root, rel, stash, canary):
    undo = set_aside(root, rel, stash)
    write(os.path.join(root, rel), rng.choice(HUGE).encode())
    return undo


def fifo(rng, root, rel, stash, canary):
    undo = set_aside(root, rel, stash)
    os.mkfifo(os.path.join(root, rel))
    return undo


def char_device(rng, root, rel, stash, canary):
    undo = set_aside(root, rel, stash)
    # /dev/zero never ends; /dev/null is empty: reading either as a file is wrong.
    os.mknod(os.path.join(root, rel), stat.S_IFCHR | 0o600, os.makedev(1, rng.choice((3, 5))))
    return undo


def symlink_loop(rng, root, rel, stash, canary):
    undo = set_aside(root, rel, stash)
    os.symlink(rng.choice((os.path.basename(rel), "./" + os.path.basename(rel) + "/x", "/" + rel)),
               os.path.join(root, rel))
    return undo


def escaping_symlink(rng, root, rel, stash, canary):
    undo = set_aside(root, rel, stash)
    target = rng.choice(("../" * 12 + canary.lstrip("/"), canary, os.path.dirname(canary), "/proc/self/status",
                         "/etc/passwd", "../../../../etc/passwd"))
    os.symlink(target, os.path.join(root, rel))
    return undo


def missing(rng, root, rel, stash, canary):
    undo = set_aside(root, rel, stash)
    return undo


def directory(rng, root, rel, stash, canary):
    undo = set_aside(root, rel, stash)
    os.mkdir(os.path.join(root, rel))
    return undo


def renamed_node(rng, root, rel, stash, canary):
    """node1 -> node01 (or beside it: the kernel never prints a leading zero)."""
    names = sorted(name for name in os.listdir(os.path.join(root, NODE_DIR)) if name[4:].isdigit())
    if not names:
        return lambda: None
    old = os.path.join(root, NODE_DIR, rng.choice(names))
    new = os.path.join(root, NODE_DIR, "node0" + old.rsplit("node", 1)[1])
    if rng.random() < 0.5:
        copy_tree(old, new)
        return lambda: shutil.rmtree(new)
    os.rename(old, new)
    return lambda: os.rename(new, old)


def node_not_online(rng, root, rel, stash, canary):
    """A node directory the kernel's online list leaves out: a new one, or one dropped from the list."""
    node_dir = os.path.join(root, NODE_DIR)
    names = sorted(name for name in os.listdir(node_dir) if name[4:].isdigit()) if os.path.isdir(node_dir) else []
    if not names:
        return lambda: None
    if rng.random() < 0.5:
        extra = os.path.join(node_dir, "node%d" % rng.choice((99, MAX_NODES - 1, MAX_NODES, 10 ** 8)))
        if os.path.lexists(extra):  # added by an earlier mutation of the case
            return lambda: None
        copy_tree(os.path.join(node_dir, names[0]), extra)
        return lambda: shutil.rmtree(extra)
    online = os.path.join(root, NODE_DIR, "online")
    put_back = set_aside(root, NODE_DIR + "/online", stash) if os.path.lexists(online) else None
    kept = [name[4:] for name in names]
    kept.remove(rng.choice(kept))
    write(online, (",".join(kept) + "\n").encode())

    def undo():
        remove(online)
        if put_back:
            put_back()
    return undo


MUTATIONS = [truncate, garbage, huge, fifo, symlink_loop, escaping_symlink, missing, directory, renamed_node,
             node_not_online]
if os.geteuid() == 0:  # mknod needs root; CI runs as root
    MUTATIONS.append(char_device)


# --- checks ---------------------------------------------------------------------------


class Hang(Exception):
    pass


@contextmanager
def time_bound(seconds):
    def expire(_signum, _frame):
        raise Hang("no answer within %d s" % seconds)
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def one_line(message):
    return "\n" not in message and len(message) < 500


def check_facts(facts):
    """What the numa_facts contract promises, whatever the files held."""
    text = json.dumps(facts)
    assert CANARY not in text, "read a file outside the root"
    assert all(isinstance(warning, str) and one_line(warning) for warning in facts["warnings"]), facts["warnings"]
    ids = [node["id"] for node in facts["nodes"]]
    assert ids == sorted(set(ids)) and all(0 <= node < MAX_NODES for node in ids)
    assert len(facts["distances"]) == len(ids) and all(len(row) == len(ids) for row in facts["distances"])
    assert all(value is None or 0 <= value <= 255 for row in facts["distances"] for value in row)
    assert all(0 <= cpu < MAX_CPUS for node in facts["nodes"] for cpu in node["cpus"])


def check_plans(facts):
    for options in REQUESTS:
        try:
            plan(facts, Request(**options))
        except NumaError as error:
            assert one_line(str(error)), str(error)


def run_case(root, everything, canary, stash, rng):
    """Apply one to three mutations, read and plan; the mutations' names, for the failure message."""
    applied = []
    with ExitStack() as undo:
        for _ in range(rng.randrange(1, 4)):
            mutation = rng.choice(MUTATIONS)
            rel = pick(rng, root, everything)
            if not os.path.lexists(os.path.join(root, rel)):
                continue  # inside what an earlier mutation of this case moved away
            applied.append("%s(%s)" % (mutation.__name__, rel))
            undo.callback(mutation(rng, root, rel, stash, canary))
        with time_bound(CASE_SECONDS):
            facts = read(root)
            check_facts(facts)
            check_plans(facts)
    return applied


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_mutated_machines_read_and_plan_without_a_traceback(machines, tmp_path, name):
    roots, canary = machines
    root = roots[name]
    everything = entries(root)
    failures = []
    for case in range(MACHINES[name]):
        seed = "%s-%d-%d" % (name, SEED, case)
        applied = []
        try:
            applied = run_case(root, everything, canary, str(tmp_path), random.Random(seed))
        except Exception as error:  # every failure of every case, reported together
            failures.append("seed %s %s: %s: %s" % (seed, applied, type(error).__name__, str(error)[:300]))
    assert not failures, "\n".join(failures[:20])
    assert entries(root) == everything, "a case was not undone"


def test_mutated_machines_read_through_the_walk_too(machines, tmp_path, monkeypatch):
    """Where the kernel has no openat2 (before 5.6, as RHEL 8's 4.18, or behind a seccomp filter), the
    reader walks the path from the root fd: the same cases, the same outcome."""
    monkeypatch.setattr(kernel_files, "has_open_in_root", lambda _fd: False)
    test_mutated_machines_read_and_plan_without_a_traceback(machines, tmp_path, "32em64t-2n8c+dax+nvme+mic+dimms")


def test_the_fuzz_can_fail(machines, tmp_path):
    """The canary is what an escaping read would show: a plain open() of the planted link reads it."""
    roots, canary = machines
    root = roots["16amd64-8n2c"]
    rel = NODE_DIR + "/node0/meminfo"
    with ExitStack() as undo:
        undo.callback(set_aside(root, rel, str(tmp_path)))
        os.symlink(canary, os.path.join(root, rel))
        with open(os.path.join(root, rel)) as handle:
            assert CANARY in handle.read()
        facts = read(root)
    check_facts(facts)
    assert any(rel in warning and os.strerror(errno.ENOENT) in warning for warning in facts["warnings"])
