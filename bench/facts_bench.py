"""Issue 2 benchmark: numa_facts vs Ansible's ping (numa-pin facts vs lstopo: start_bench.py).

    .venv/bin/python bench/facts_bench.py [--runs N]
"""

import argparse
import os
import sys

from timing import PYTHON, REPO, report, time_command


def facts_vs_ping(runs):
    bindir = os.path.dirname(sys.executable)
    ansible = os.path.join(bindir, "ansible")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), PATH=bindir + os.pathsep + os.environ["PATH"])
    base = [ansible, "localhost", "-e", "ansible_python_interpreter=" + PYTHON, "-m"]
    rows = [
        ("ansible localhost -m ping", time_command(base + ["ping"], runs, env, REPO)),
        ("ansible localhost -m numa_facts", time_command(base + ["numa_facts"], runs, env, REPO)),
        ("ansible localhost -m setup -a gather_subset=hardware",
         time_command(base + ["setup", "-a", "gather_subset=hardware"], runs, env, REPO)),
    ]
    report("numa_facts vs Ansible's own round trip", rows, "ansible localhost -m ping", "numa_facts <= 1.1x ping")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    facts_vs_ping(max(3, parser.parse_args().runs // 2))


if __name__ == "__main__":
    main()
