"""Command-line tools the tests run: found, or the test is skipped with the reason, never crashed.

Under `make test` (tests/phases.py sets INFEROPS_NUMA_REQUIRE_TOOLS=1) a tool that `make test` installs (the apt
packages, the venv's commands) is there by then: its absence is a failure, since a skip would hide a check that never
ran. Anywhere else it stays a skip. The captured machines of ../shared/fixtures/hwloc-linux are not the project's to
install (they sit beside the clone, never in it): without them their tests skip cleanly, under `make test` too, and
the phase table counts the skips.
"""

import os
import shutil
import sys

import pytest


def ansible_command(name):
    """The path of an Ansible command (``ansible``, ``ansible-playbook``); skips the test without one.

    The one installed beside this interpreter comes first: the tests hand it this interpreter
    (``ansible_python_interpreter``), so both sides see the same ansible-core. Else the one on PATH.
    """
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.access(beside, os.X_OK) else shutil.which(name)
    if found is None:
        missing("%s is not installed: pip install ansible-core next to %s" % (name, sys.executable))
    return found


REQUIRE_TOOLS = "INFEROPS_NUMA_REQUIRE_TOOLS"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HWLOC_DUMPS = os.path.join(os.path.dirname(REPO), "shared", "fixtures", "hwloc-linux")
NO_DUMPS = "../shared/fixtures/hwloc-linux not present (a clone without ../shared beside it)"


def hwloc_dumps(*names):
    """A mark that skips the test unless ../shared holds the named captured machines (any one when none named)."""
    if names:
        present = all(os.path.exists(os.path.join(HWLOC_DUMPS, name + ".tar.bz2")) for name in names)
    else:
        present = os.path.isdir(HWLOC_DUMPS) and any(name.endswith(".tar.bz2") for name in os.listdir(HWLOC_DUMPS))
    return pytest.mark.skipif(not present, reason=NO_DUMPS)


def tools_required():
    """True under `make test`, which installs every tool and fixture the tests use."""
    return os.environ.get(REQUIRE_TOOLS) == "1"


def missing(reason):
    """A tool or fixture `make test` installs is absent: skip the test, or fail it under `make test`."""
    if tools_required():
        pytest.fail("%s (under make test, %s=1: make test installs it, so it must be there)" % (reason, REQUIRE_TOOLS),
                    pytrace=False)
    pytest.skip(reason)


def needs(absent, reason):
    """A mark for a test that needs a tool or fixture `make test` installs: skipped when ``absent`` (a failure
    under `make test`). tests/conftest.py applies it when the test is set up."""
    return pytest.mark.needs_tool(bool(absent), reason=reason)



# Lines of ansible-playbook's output that are not the rest of a warning: older cores (2.14) wrap a warning at 79
# columns, on lines of their own without a prefix; a line starting like these begins something else.
_NOT_A_WARNING_GOING_ON = ("[", "TASK ", "PLAY ", "RUNNING ", "NO MORE ", "ok:", "changed:", "skipping:", "fatal:",
                           "failed:", "included:", "...")


def warnings_in(output):
    """Each "[WARNING]: ..." of ansible-playbook's ``output`` as one line, its wrapped lines joined with a space."""
    found = []
    going_on = False
    for line in output.splitlines():
        if line.startswith("[WARNING]:"):
            found.append(line.rstrip())
            going_on = True
        elif going_on and line.strip() and not line.startswith(_NOT_A_WARNING_GOING_ON):
            found[-1] += " " + line.strip()
        else:
            going_on = False
    return found
