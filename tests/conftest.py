"""Make ``ansible_collections.inferops.numa`` importable from a plain checkout; shuffle the tests on request
(``--shuffle``); turn a missing tool `make test` installs into a failure under `make test` (tests/tools.py)."""
import os
import random
import shutil
import stat
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(REPO, "build")
LINK = os.path.join(BUILD, "ansible_collections", "inferops", "numa")

if not os.path.lexists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(os.path.join("..", "..", ".."), LINK)
if BUILD not in sys.path:
    sys.path.insert(0, BUILD)

import pytest  # noqa: E402

from tests.tools import missing  # noqa: E402


# --- the order of the tests: shuffled, with the seed printed to replay it -------------------------------------

SHUFFLE_ENV = "INFEROPS_NUMA_SHUFFLE"


def pytest_addoption(parser):
    parser.addoption("--shuffle", metavar="SEED", default=os.environ.get(SHUFFLE_ENV) or None,
                     help="run the test modules, and the tests of each, in an order shuffled by SEED (an integer; "
                          "'random' picks one); the header and the summary print the seed, and the same seed "
                          "over the same paths replays the order. Default: $%s, else file order." % SHUFFLE_ENV)


# --- scratch files in RAM ---------------------------------------------------------------------------------------

RAM_TMPDIR = "/dev/shm"
# What a run of every pytest phase at once writes there at most (the matrix's cores, integration's fixture
# machines), with room to spare. pytest.ini keeps only failed tests' directories, and of the last run alone.
RAM_MIN_FREE = 2 << 30


def ram_tmpdir(mounts="/proc/mounts", statvfs=os.statvfs):
    """/dev/shm when it is a tmpfs that runs programs and honours device nodes (tests write fake interpreters and
    device nodes in their tmp_path) with RAM_MIN_FREE bytes free, else None (then the disk).

    A fixture machine is thousands of small files, written anew for each test that reads one: on this project's
    virtual disks that writing was most of the time of the unit tests, and in RAM it is a tenth of it. The tests
    that need a disk-backed directory (page cache, replicas) choose /var/tmp or build/ themselves.
    """
    try:
        with open(mounts) as handle:
            entries = [line.split() for line in handle]
    except OSError:
        return None
    found = [entry for entry in entries if len(entry) > 3 and entry[1] == RAM_TMPDIR]
    if not found or found[-1][2] != "tmpfs" or {"noexec", "nodev", "ro"} & set(found[-1][3].split(",")):
        return None
    if not os.access(RAM_TMPDIR, os.W_OK | os.X_OK):
        return None
    try:
        space = statvfs(RAM_TMPDIR)
    except OSError:
        return None
    # A small /dev/shm (a container's 64 MiB), or one others filled, fails tests with ENOSPC: the disk is slower
    # but does not run out half-way.
    return RAM_TMPDIR if space.f_bavail * space.f_frsize >= RAM_MIN_FREE else None


def pytest_configure(config):
    # tmp_path and tempfile's scratch directories in RAM, unless TMPDIR or --basetemp says where.
    if not os.environ.get("TMPDIR") and config.getoption("basetemp") is None and ram_tmpdir():
        os.environ["TMPDIR"] = RAM_TMPDIR
        tempfile.tempdir = None
    config.addinivalue_line("markers", "needs_tool(absent, reason): the test needs a tool or fixture `make test` "
                                       "installs; skipped when absent, a failure under `make test` "
                                       "(tests/tools.py)")
    seed = config.getoption("shuffle")
    if seed is not None and str(seed).lower() == "random":
        seed = random.SystemRandom().randrange(1, 10 ** 6)
    elif seed is not None:
        try:
            seed = int(seed)
        except ValueError:
            raise pytest.UsageError("--shuffle takes an integer seed or 'random', not %r" % seed)
    config.shuffle_seed = seed


def pytest_report_header(config):
    if config.shuffle_seed is not None:
        return "shuffled with seed %d (replay: --shuffle=%d)" % (config.shuffle_seed, config.shuffle_seed)
    return None


def pytest_collection_modifyitems(session, config, items):
    """Modules in a shuffled order, and each module's tests shuffled inside it (a class's tests kept together):
    a module's or a class's fixtures are still set up once, and a test that needs another to run first fails."""
    if config.shuffle_seed is None:
        return
    rng = random.Random(config.shuffle_seed)
    modules = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], {}).setdefault(getattr(item, "cls", None), []).append(item)
    shuffled = []
    groups = list(modules.values())
    rng.shuffle(groups)
    for classes in groups:
        blocks = list(classes.values())
        rng.shuffle(blocks)
        for block in blocks:
            rng.shuffle(block)
            shuffled.extend(block)
    items[:] = shuffled


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs_tool"):
        if mark.args[0]:
            missing(mark.kwargs["reason"])


def pytest_terminal_summary(terminalreporter, config):
    if config.shuffle_seed is not None:
        terminalreporter.write_line("shuffled with seed %d: replay the order with --shuffle=%d over the same paths"
                                    % (config.shuffle_seed, config.shuffle_seed))


# --- a directory root may trust ------------------------------------------------------------------------------

def trusted_chain(path):
    """Whether every directory from / to path is owned by root (or us) and writable by no one else, as
    metrics requires of the plan directory."""
    current = "/"
    for name in [""] + [part for part in path.split("/") if part]:
        current = os.path.join(current, name)
        info = os.lstat(current)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
            return False
    return True


@pytest.fixture
def trusted_dir():
    """A fresh 0755 directory on a chain from / that only root (or this user) may write: tmp_path is under
    /tmp, which anyone may write, so metrics refuses a plan directory there."""
    for base in ("/run", os.environ.get("XDG_RUNTIME_DIR") or "", os.path.expanduser("~")):
        if base and os.path.isdir(base) and os.access(base, os.W_OK) and trusted_chain(base):
            path = tempfile.mkdtemp(prefix="inferops-numa-test-", dir=base)
            os.chmod(path, 0o755)
            yield path
            shutil.rmtree(path, ignore_errors=True)
            return
    pytest.skip("no writable directory here whose chain from / only root or this user may write")
