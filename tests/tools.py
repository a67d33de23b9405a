"""Command-line tools the tests run: found, or the test is skipped with the reason, never crashed.

Under `make test` (tests/phases.py sets INFEROPS_NUMA_REQUIRE_TOOLS=1) a tool or fixture that `make test` installs
(the apt packages, the venv's commands, ../shared/fixtures) is there by then: its absence is a failure, since a skip
would hide a check that never ran. Anywhere else (a plain clone, a developer without ../shared) it stays a skip.
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
