"""numa-pin facts as a process of its own on corrupted roots: facts and one-line warnings, never a traceback.

The in-process fuzz of the reader and the planner, and the mutations used here, are in
tests/conformance/test_fuzz_reader.py; these cases start ``python -m numa`` as the installed launcher does.
"""

import json
import os
import random
import subprocess
import sys
from contextlib import ExitStack

from tests.conformance.test_fuzz_reader import (  # noqa: F401 - machines: the fixture, used by name
    MACHINES, NODE_DIR, SEED, check_facts, escaping_symlink, fifo, huge, machines)
from tests.tools import hwloc_dumps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_PARENT = os.path.join(REPO, "plugins", "module_utils")
CLI_CASES = 3

needs_dumps = hwloc_dumps(*MACHINES)


def numa_pin(*args):
    return subprocess.run([sys.executable, "-m", "numa"] + list(args), env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60,
                          check=False)


@needs_dumps
def test_numa_pin_facts_on_mutated_machines_prints_facts_and_no_traceback(machines, tmp_path):
    roots, canary = machines
    root = roots["16amd64-8n2c"]
    rng = random.Random("cli-%d" % SEED)
    for case, mutation in enumerate([fifo, escaping_symlink, huge][:CLI_CASES]):
        with ExitStack() as undo:
            undo.callback(mutation(rng, root, NODE_DIR + "/node%d/meminfo" % case, str(tmp_path), canary))
            done = numa_pin("facts", "--root", root)
        assert done.returncode == 0 and done.stderr == "", (mutation.__name__, done.stderr)
        facts = json.loads(done.stdout)
        check_facts(facts)
        assert any("node%d/meminfo" % case in warning for warning in facts["warnings"]), facts["warnings"]


def test_numa_pin_facts_on_a_root_that_is_a_fifo_fails_in_one_line(tmp_path):
    os.mkfifo(str(tmp_path / "root"))
    done = numa_pin("facts", "--root", str(tmp_path / "root"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "not a directory" in done.stderr, done.stderr
