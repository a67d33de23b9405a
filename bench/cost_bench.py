#!/usr/bin/env python3
"""How long numa_cost takes with default options, and how its latency compares with C.

Prints:
  - the wall time of the full default measurement of this host (all its pairs);
  - the wall time of a 2-node measurement's worth of work (setup + 4 pairs x rounds). On
    a host with fewer than 2 nodes every run binds node 0 -> node 0: the work per pair
    does not depend on which nodes a pair binds to. Goal: under 30 s (ratio < 1);
  - the Python latency against a C chase of the same buffer (tests/helpers/chase.c,
    compiled here when a compiler exists) and the copy bandwidth.

Run from the repository root: ``.venv/bin/python bench/cost_bench.py``. Other work on
the same CPUs makes every figure worse; the load average is printed with them.
"""

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "build"))
sys.path.insert(0, REPO)

from tests import conftest  # noqa: E402,F401  (creates build/ansible_collections/inferops/numa)

from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import cost  # noqa: E402
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import topology  # noqa: E402

GOAL_SECONDS = 30.0
PAIRS_OF_TWO_NODES = 4


def two_node_equivalent(facts, options):
    """Seconds for setup + 4 pairs x rounds of real work, run on the first measurable pair."""
    begin = time.monotonic()
    big, small, _ = cost.buffer_sizes(facts["cpus"]["caches"], options)
    _, pairs, unmeasured, pin = cost.plan_pairs(facts, cost.needed_bytes(big, small))
    if not pairs:
        raise SystemExit("no measurable pair on this host: %s" % unmeasured)
    rng = random.Random()
    nexts_big = cost.cyclic_permutation(big // cost.LINE_BYTES, rng)
    nexts_small = cost.cyclic_permutation(small // cost.LINE_BYTES, rng)
    setup = time.monotonic() - begin
    cpu_node, mem_node = pairs[0]
    outcomes = []
    for _ in range(PAIRS_OF_TWO_NODES * options.rounds):
        work = cost.PairWork(pin[cpu_node], mem_node, big, small, nexts_big, nexts_small, options, cost.kernel)
        outcomes.append(cost.run_forked(work, options.max_seconds))
    return time.monotonic() - begin, setup, outcomes


def c_reference_ns(size, steps):
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        binary = os.path.join(folder, "chase")
        subprocess.run([compiler, "-O2", "-o", binary, os.path.join(REPO, "tests", "helpers", "chase.c")], check=True)
        out = subprocess.run([binary, str(size), str(steps), str(cost.CHUNK_STEPS)],
                             check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout
    return float(out.split()[0])


def main():
    facts = topology.read("/")
    options = cost.CostOptions()
    print("load average before: %.2f %.2f %.2f on %d CPUs" % (os.getloadavg() + (os.cpu_count(),)))
    begin = time.monotonic()
    result = cost.measure(facts, options)
    full = time.monotonic() - begin
    pairs = len(result["placement"])
    print("full default measurement of this host: %d node(s), %d pair(s) measured, %.1f s wall "
          "(setup %.1f s, buffer %d MiB)" % (len(result["nodes"]), pairs, full, result["method"]["setup_seconds"],
                                            result["method"]["buffer_bytes"] >> 20))
    for key, reason in sorted(result["unmeasured"].items()):
        print("  not measured %s: %s" % (key, reason))

    wall, setup, outcomes = two_node_equivalent(facts, options)
    per_pair = [o for o in outcomes if o and "error" not in o]
    print("2-node equivalent (setup + %d pairs x %d rounds): %.1f s wall (setup %.1f s) -> %.2f of the %.0f s goal"
          % (PAIRS_OF_TWO_NODES, options.rounds, wall, setup, wall / GOAL_SECONDS, GOAL_SECONDS))

    latency = result["latency_ns"][0][0]
    # As many timed stretches as the engine had over its rounds.
    c_ns = c_reference_ns(result["method"]["buffer_bytes"], options.chase_steps * options.rounds)
    print("latency node 0 -> node 0: python %.1f ns (raw %.1f - interpreter %.1f), spread %.2f"
          % (latency, result["method"]["raw_ns"][0][0], result["method"]["overhead_ns"][0][0],
             result["method"]["spread"][0][0]))
    if c_ns is None:
        print("C reference: no compiler here")
    else:
        print("C reference chase of the same buffer: %.1f ns -> python / C = %.2f" % (c_ns, latency / c_ns))
    print("copy bandwidth node 0 -> node 0: %.2f GB/s (read + write), the 2-node runs: %s GB/s"
          % (result["bandwidth_gbps"][0][0], ", ".join("%.2f" % o["bandwidth_gbps"] for o in per_pair)))
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
