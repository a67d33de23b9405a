"""Command-line tools the tests run: found, or the test is skipped with the reason, never crashed."""

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
        pytest.skip("%s is not installed: pip install ansible-core next to %s" % (name, sys.executable))
    return found
