"""tests/unit is pure: no test here starts a process. Every way the standard library has to start one fails the
test that tries, naming where such a test belongs (tests/integration/<name>_processes.py)."""
import os
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
