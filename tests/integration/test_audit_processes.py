"""The audit of a real zombie: a child process this test starts."""

import subprocess
import time

from ansible_collections.inferops.numa.plugins.module_utils.numa.read import audit


def _proc_state(pid):
    with open("/proc/%d/stat" % pid) as handle:
        return handle.read().rpartition(")")[2].split()[0]


def test_a_real_zombie_fails_the_audit():
    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while _proc_state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        report = audit.audit_pids("/", [child.pid], None)
    finally:
        child.wait()
    assert report["ok"] is False and "is a zombie (state Z" in report["msg"]
