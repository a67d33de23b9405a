"""No ansible command prints a Python deprecation warning: ansible-core does not pin its cryptography, and 51.0
deprecated DSA, which ansible-core imports for its SSH agent, so every command began with a
CryptographyDeprecationWarning. requirements.txt pins cryptography below it (and the matrix and the execution
environment take that pin); a venv made before the pin fails here with the fix.
"""

import os
import re
import subprocess
from importlib import metadata

import pytest

from tests.tools import ansible_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Python's warnings ("CryptographyDeprecationWarning: DSA is deprecated", "DeprecationWarning: ...") and Ansible's
# own "[DEPRECATION WARNING]".
WARNED = re.compile(r"\w*DeprecationWarning\b|\[DEPRECATION WARNING\]")


def _pin(name):
    with open(os.path.join(REPO, "requirements.txt")) as handle:
        return re.search(r"^%s==(\S+)" % re.escape(name), handle.read(), re.MULTILINE).group(1)


def _env():
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "PYTHONWARNINGS"))}
    env.update(ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return env


def test_this_venv_has_the_pinned_cryptography():
    try:
        installed = metadata.version("cryptography")
    except metadata.PackageNotFoundError:
        pytest.skip("cryptography is not installed beside this interpreter")
    assert installed == _pin("cryptography"), (
        "cryptography %s here, requirements.txt pins %s: pip install -r requirements.txt (make venv)"
        % (installed, _pin("cryptography")))


@pytest.mark.parametrize("argv", [
    ["ansible-playbook", "--version"],
    ["ansible", "--version"],
    # A module run: the controller's connection and callback plugins load (the SSH agent code among them).
    ["ansible", "localhost", "-c", "local", "-m", "inferops.numa.numa_facts"],
], ids=lambda argv: " ".join(argv))
def test_an_ansible_command_prints_no_deprecation_warning(argv):
    done = subprocess.run([ansible_command(argv[0])] + argv[1:], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    warned = [line for line in (done.stdout + done.stderr).splitlines() if WARNED.search(line)]
    assert warned == []
