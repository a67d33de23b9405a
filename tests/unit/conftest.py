"""tests/unit is pure: no test here starts a process. Every way the standard library has to start one fails the
test that tries, naming where such a test belongs (tests/integration/<name>_processes.py)."""
import os
import shutil
import stat
import tempfile
import subprocess

import pytest

# Ansible's display, imported first inside a test, asks ldconfig where libc is (ctypes.util.find_library): a process
# the library starts once per interpreter, not one the code under test starts. Imported here, before the guard.
import ansible.utils.display  # noqa: F401

SPAWNERS = {os: ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve", "execvp", "execvpe",
                 "spawnv", "spawnve", "spawnvp", "spawnvpe"),
            subprocess: ("Popen",)}


class ProcessStarted(AssertionError):
    """A unit test started (or tried to start) a process."""


def _refuse(name):
    def refused(*args, **kwargs):
        raise ProcessStarted("a unit test called %s(%s): tests/unit starts no process; give the code under test a "
                             "fake runner, or move the test to tests/integration/<name>_processes.py"
                             % (name, ", ".join(repr(arg) for arg in args[:2])))
    return refused


@pytest.fixture(autouse=True, scope="package")
def no_processes():
    with pytest.MonkeyPatch.context() as patch:
        for module, names in SPAWNERS.items():
            for name in names:
                if hasattr(module, name):
                    patch.setattr(module, name, _refuse("%s.%s" % (module.__name__, name)))
        yield


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
