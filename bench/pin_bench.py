"""Issue 3 benchmark: the numa-pin exec helper's start-up cost.

    .venv/bin/python bench/pin_bench.py [--runs N]

Compares `numa-pin exec --node 0 -- /bin/true` (as installed: python3 -I -S launcher)
with a bare `python3 -I -c pass` and `numactl --cpunodebind=0 --membind=0 /bin/true`.
"""

import argparse
import os
import shutil
import tempfile

from timing import PACKAGE_PARENT, PYTHON, report, time_command

LAUNCHER = """#!%s -IS
import sys
sys.path.insert(0, %r)
from numa.cli import main
sys.exit(main())
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=40)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as scratch:
        launcher = os.path.join(scratch, "numa-pin")
        with open(launcher, "w") as handle:
            handle.write(LAUNCHER % (PYTHON, PACKAGE_PARENT))
        os.chmod(launcher, 0o755)
        rows = [
            ("python3 -I -c pass", time_command([PYTHON, "-I", "-c", "pass"], runs)),
            ("python3 -I -S -c pass (the launcher's flags)", time_command([PYTHON, "-I", "-S", "-c", "pass"], runs)),
            ("numa-pin exec --node 0 -- /bin/true", time_command([launcher, "exec", "--node", "0", "--", "/bin/true"], runs)),
            ("numa-pin explain --node 0", time_command([launcher, "explain", "--node", "0"], runs)),
        ]
        numactl = shutil.which("numactl")
        if numactl:
            rows.append(("numactl --cpunodebind=0 --membind=0 /bin/true",
                         time_command([numactl, "--cpunodebind=0", "--membind=0", "/bin/true"], runs)))
        report("helper start-up", rows, "python3 -I -c pass", "numa-pin exec <= 1.5x a bare interpreter start")


if __name__ == "__main__":
    main()
