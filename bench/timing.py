"""Wall time of whole commands: best and median of repeated runs, printed as ratios."""

import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What targets run numa-pin with (the baseline is /usr/bin/python3 -I -c pass);
# never a pyenv shim, which alone costs ~100 ms per start.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)
PACKAGE_PARENT = os.path.join(REPO, "plugins", "module_utils")


def time_command(argv, runs, env=None, cwd=None):
    """Seconds per run of argv (best, median); output discarded; a failing command aborts."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd, check=True)
        samples.append(time.perf_counter() - start)
    return min(samples), statistics.median(samples)


def report(title, rows, baseline, goal):
    """Print each row's median and its ratio to the baseline row."""
    print("\n== %s" % title)
    base = dict(rows)[baseline][1]
    for name, (best, median) in rows:
        print("  %-58s best %7.1f ms  median %7.1f ms  ratio %.2f" % (name, best * 1e3, median * 1e3, median / base))
    print("  goal: %s" % goal)
