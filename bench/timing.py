"""Wall time of whole commands: best and median of repeated runs, printed as ratios; numa-pin installed as the role does."""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What targets run numa-pin with (the baseline is /usr/bin/python3 -I -c pass);
# never a pyenv shim, which alone costs ~100 ms per start.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)
PACKAGE_PARENT = os.path.join(REPO, "plugins", "module_utils")
HELPER_TASKS = os.path.join(REPO, "roles", "numa_host", "tasks", "helper.yml")


def install_helper(directory):
    """numa-pin as roles/numa_host installs it, under ``directory``: the package copied and compiled
    to bytecode, and the role's own launcher (its #! line and flags); returns the launcher's path."""
    package = os.path.join(directory, "numa")
    shutil.copytree(os.path.join(PACKAGE_PARENT, "numa"), package, ignore=shutil.ignore_patterns("__pycache__"))
    # Written whatever PYTHONDONTWRITEBYTECODE says, and for the interpreter the launcher names.
    subprocess.run([PYTHON, "-I", "-m", "compileall", "-q", package], check=True)
    launcher = os.path.join(directory, "numa-pin")
    with open(launcher, "w") as handle:
        handle.write(_role_launcher(directory))
    os.chmod(launcher, 0o755)
    return launcher


def _role_launcher(directory):
    with open(HELPER_TASKS) as handle:
        tasks = yaml.safe_load(handle)
    (template,) = [task["ansible.builtin.set_fact"]["_numa_host_helper_launcher"] for task in tasks
                   if "_numa_host_helper_launcher" in task.get("ansible.builtin.set_fact", {})]
    # The role installs each version in a directory of its own; the bench's directory stands for it.
    text = (template.replace("{{ numa_host_python }}", PYTHON)
            .replace("{{ _numa_host_helper_version[:12] }}", "bench")
            .replace("{{ _numa_host_helper_this_home | to_json }}", json.dumps(directory))
            .replace("{{ _numa_host_helper_this_home }}", directory))
    if "{{" in text:
        raise SystemExit("%s: the launcher uses a variable this bench does not fill in:\n%s" % (HELPER_TASKS, text))
    return text


def time_round_robin(commands, runs, env=None):
    """{name: (best, median) seconds} of each (name, argv) in ``commands``, run in turn ``runs`` times:
    a change in the machine's load hits every command alike, so their ratios hold."""
    samples = {name: [] for name, _argv in commands}
    for _ in range(runs):
        for name, argv in commands:
            samples[name].append(time_command(argv, 1, env)[0])
    return {name: (min(values), statistics.median(values)) for name, values in samples.items()}


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
