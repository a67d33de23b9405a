"""numa-pin exec, run as a process, hands the server the engine recipe's argv and environment."""

import json
import os
import subprocess
import sys

from tests.unit.test_engines import PACKAGE_PARENT


def test_numa_pin_exec_hands_the_server_exactly_the_recipes_argv_and_env(tmp_path):
    """On this host (whatever its nodes): TensorRT-LLM's switch in the environment, the argv as given."""
    report = tmp_path / "seen.json"
    stand_in = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, "
                "open(%r, 'w'))" % str(report))
    done = subprocess.run([sys.executable, "-m", "numa", "exec", "--best-effort", "--engine", "trtllm", "--",
                           sys.executable, "-c", stand_in, "-t", "{threads}"],
                          env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(report.read_text())
    assert seen["argv"] == ["-t", seen["env"]["OMP_NUM_THREADS"]]
    assert seen["env"]["TLLM_NUMA_AWARE_WORKER_AFFINITY"] == "0"  # one node here: keep numa-pin's affinity
    assert "numa-pin:" in done.stderr and "exec" in done.stderr
