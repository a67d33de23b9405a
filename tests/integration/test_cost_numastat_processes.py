"""A perf that hangs (a real process standing in for it) is killed."""

import subprocess

from ansible_collections.inferops.numa.plugins.module_utils.numa.read import numastat


def test_perf_that_hangs_is_killed(monkeypatch):
    monkeypatch.setattr(numastat, "PERF_GRACE_SECONDS", 0.2)
    process = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               universal_newlines=True)
    result = numastat.finish_perf(process, 0.1)
    assert result["available"] is False and "killed" in result["reason"]
    assert process.poll() is not None
