"""The Python latency method against a C pointer chase of the same buffer, on this machine.

This is what makes the number trustworthy: the engine's full path (fork, pin, bind,
move_pages check, chase minus interpreter cost) must land within +-30 % of
tests/helpers/chase.c, compiled here. Other builds share these CPUs, so a pair of
runs is retried up to ATTEMPTS times; a method that is wrong stays wrong every time.
"""

import os
import shutil
import subprocess

import pytest

from tests.tools import needs

from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import cost
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import topology

HELPER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "chase.c")
COMPILER = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
TOLERANCE = 0.30
ATTEMPTS = 3
STEPS = 1000000

pytestmark = needs(COMPILER is None, "no C compiler (cc, gcc or clang) to build the reference")


@pytest.fixture(scope="module")
def chase_binary(tmp_path_factory):
    binary = str(tmp_path_factory.mktemp("chase") / "chase")
    subprocess.run([COMPILER, "-O2", "-o", binary, HELPER], check=True)
    return binary


@pytest.fixture(scope="module")
def host():
    facts = topology.read("/")
    if not facts["nodes"] or not facts["nodes"][0]["has_cpus"] or not facts["nodes"][0]["has_memory"]:
        pytest.skip("node 0 of this host has no CPUs or no memory")
    return facts


def c_fastest_ns(binary, size, steps):
    out = subprocess.run([binary, str(size), str(steps), str(cost.CHUNK_STEPS)], check=True,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    return float(out.split()[0])


def test_python_latency_within_30_percent_of_c_chase_of_the_same_buffer(chase_binary, host):
    options = cost.CostOptions(chase_steps=STEPS, repeats=3)
    tried = []
    for _ in range(ATTEMPTS):
        result = cost.measure(host, options)
        node = result["nodes"][0]
        assert result["placement"]["%d->%d" % (node, node)].startswith("65 of 65 sampled pages on node")
        python_ns = result["latency_ns"][0][0]
        # As many timed stretches as the engine had over its rounds: the same chances of a quiet one.
        c_ns = c_fastest_ns(chase_binary, result["method"]["buffer_bytes"], STEPS * options.rounds)
        tried.append("python %.1f ns (raw %.1f - overhead %.1f) vs C %.1f ns, buffer %d MiB"
                     % (python_ns, result["method"]["raw_ns"][0][0], result["method"]["overhead_ns"][0][0],
                        c_ns, result["method"]["buffer_bytes"] >> 20))
        if abs(python_ns - c_ns) <= TOLERANCE * c_ns:
            print("\n" + tried[-1])
            return
    pytest.fail("Python chase outside +-30%% of C in %d attempts: %s" % (ATTEMPTS, "; ".join(tried)))


def test_c_chase_of_an_l1_buffer_is_the_l1_hit_the_subtraction_also_removes(chase_binary, host):
    small = cost.buffer_sizes(host["cpus"]["caches"], cost.CostOptions())[1]
    # Documented error of the method: about one L1 hit (a few cycles), far below any DRAM latency.
    assert c_fastest_ns(chase_binary, small, STEPS) < 5.0
