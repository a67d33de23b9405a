"""Issue 2 benchmark: topology read vs lstopo, and numa_facts vs Ansible's ping.

    .venv/bin/python bench/facts_bench.py [--runs N]
"""

import argparse
import os
import shutil
import sys
import tarfile
import tempfile

from timing import PACKAGE_PARENT, PYTHON, REPO, report, time_command

DUMP = os.path.join(os.path.dirname(REPO), "shared", "fixtures", "hwloc-linux", "256ia64-64n2s2c.tar.bz2")
READ = ("import json, sys; sys.path.insert(0, %r); from numa.topology import read; "
        "json.dumps(read(sys.argv[1]))" % PACKAGE_PARENT)


def reader_vs_lstopo(runs):
    if not os.path.exists(DUMP):
        print("skipped reader vs lstopo: %s not present" % DUMP)
        return
    lstopo = shutil.which("lstopo-no-graphics")
    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(DUMP) as archive:
            archive.extractall(scratch)
        (top,) = os.listdir(scratch)
        root = os.path.join(scratch, top)
        rows = [("numa-pin facts: python3 -I -S reader (256 CPUs, 64 nodes)",
                 time_command([PYTHON, "-I", "-S", "-c", READ, root], runs))]
        if lstopo:
            env = dict(os.environ, HWLOC_FSROOT=root, HWLOC_COMPONENTS="linux,stop")
            rows.append(("lstopo-no-graphics --of xml (same dump)", time_command([lstopo, "--of", "xml"], runs, env)))
            report("topology read, whole process", rows, rows[-1][0], "ratio <= 1.0 against lstopo")
        else:
            print("lstopo-no-graphics not installed (apt-get install hwloc): reader only")
            report("topology read, whole process", rows, rows[0][0], "ratio <= 1.0 against lstopo")


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
    runs = parser.parse_args().runs
    reader_vs_lstopo(runs)
    facts_vs_ping(max(3, runs // 2))


if __name__ == "__main__":
    main()
