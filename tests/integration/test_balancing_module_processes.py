"""numa_balancing run ad hoc by the ansible command, as root and as an unprivileged user."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.tools import ansible_command, needs
from tests.unit.balancing_fakeroot import FakeRoot
from tests.unit.test_balancing_module import OURS, REPO, host  # noqa: F401  (host: fixture)


def adhoc(root, extra_env=None, prefix=(), extra_args=()):
    """`ansible localhost -m numa_balancing -a ...` from the repo, as the issue asks.

    Returns the status word of the minimal callback (CHANGED, SUCCESS, FAILED!) and the result dict.
    """
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), **(extra_env or {}))
    proc = subprocess.run(list(prefix) + [ansible_command("ansible"), "localhost", "-m", "numa_balancing",
                                          "-a", "state=disabled root=%s" % root] + list(extra_args),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    # The minimal callback prints "localhost | CHANGED => {json}".
    assert " => " in proc.stdout, proc.stdout + proc.stderr
    head, body = proc.stdout.split(" => ", 1)
    return head.split("|")[-1].strip(), json.loads(body)


def test_adhoc_bare_module_name_resolves_and_runs(host):
    status, out = adhoc(host.path)
    assert status == "CHANGED" and out["changed"] is True and out["persisted_file"] == host.real(OURS)
    assert host.read("/proc/sys/kernel/numa_balancing") == "0\n"
    status, out = adhoc(host.path)
    assert status == "SUCCESS" and out["changed"] is False


SETPRIV = shutil.which("setpriv")
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                    reason="needs root and /usr/bin/python3 to run the module as nobody")
@needs(not SETPRIV, "setpriv (util-linux) is not installed: it runs the module as nobody")
def test_adhoc_as_unprivileged_user_fails_with_become_hint():
    """A real EACCES: root owns the fake root, the module runs as nobody."""
    scratch = tempfile.mkdtemp(prefix="numa-balancing-nobody-")
    try:
        os.chmod(scratch, 0o755)
        home = os.path.join(scratch, "home")
        os.mkdir(home)
        os.chown(home, 65534, 65534)
        host = FakeRoot(os.path.join(scratch, "root")).knobs(balancing=1).debian()
        nobody = (SETPRIV, "--reuid=65534", "--regid=65534", "--clear-groups")
        # The controller is this interpreter: one whose files sit where nobody cannot read them (a pyenv build
        # under /root loading its libpython) cannot run the test.
        probe = subprocess.run(list(nobody) + [sys.executable, "-c", "import ansible"], capture_output=True,
                               text=True, check=False)
        if probe.returncode != 0:
            pytest.skip("%s does not start as nobody: %s" % (sys.executable, probe.stderr.strip()[-200:]))
        # The system interpreter on the target: nobody may not reach the venv's (here it lives under /root).
        status, out = adhoc(host.path, {"HOME": home, "ANSIBLE_HOME": home, "ANSIBLE_LOCAL_TEMP": home,
                                        "ANSIBLE_REMOTE_TMP": home},
                            prefix=nobody, extra_args=("-e", "ansible_python_interpreter=" + SYSTEM_PYTHON))
        assert status == "FAILED!"
        assert "become: true" in out["msg"] and "Permission denied" in out["msg"]
        assert host.read("/proc/sys/kernel/numa_balancing") == "1\n" and not host.exists(OURS)
    finally:
        shutil.rmtree(scratch)
