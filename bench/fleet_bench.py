"""Issue 16 benchmark: the fleet report over a simulated fleet, in controller seconds per host, next to `ansible -m ping`.

    .venv/bin/python bench/fleet_bench.py [--hosts 200] [--forks 5 ...] [--strategy linear ...] [--out DIR]

The fleet is one inventory of --hosts hosts, all on the local connection; host i reads captured machine
i mod M (the M real machines of ../shared/fixtures/hwloc-linux, each extracted once) through `numa_root`,
and plans its services (one llama instance per node with CPUs) with numa_metrics, which deploys nothing.
For each forks/strategy pair it times `ansible all -m ping` over the same inventory and forks, then
`ansible-playbook playbooks/fleet_report.yml`, and prints wall seconds and controller CPU seconds (this
process's children: with the local connection the modules run here too) per host, and their ratio
(goal: fleet report <= 1.5x ping), medians of --rounds alternated runs after one untimed run of each. The
last run's report is left in --out.
"""

import argparse
import glob
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUMPS = os.path.join(os.path.dirname(REPO), "shared", "fixtures", "hwloc-linux")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)
SERVICES = [{"name": "llama", "layout": "per_node", "model_size": "4G", "memory_headroom": "10%+1G",
             "port_base": 8080, "command": ["/opt/llama.cpp/bin/llama-server", "-t", "{threads}"]}]


def extract_machines(directory, dumps=DUMPS):
    """Every captured machine extracted once under ``directory``: their root folders, sorted."""
    roots = []
    for archive in sorted(glob.glob(os.path.join(dumps, "*.tar.bz2"))):
        name = os.path.basename(archive)[:-len(".tar.bz2")]
        target = os.path.join(directory, name)
        if not os.path.isdir(target):
            os.makedirs(target + ".partial", exist_ok=True)
            with tarfile.open(archive) as tar:
                # Extraction filters came in Python 3.11.4 and 3.12; Debian 12's 3.11.2 has none.
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(target + ".partial", **safe)
            os.rename(target + ".partial", target)
        (top,) = [entry for entry in os.listdir(target) if os.path.isdir(os.path.join(target, entry))]
        roots.append(os.path.join(target, top))
    return roots


def write_inventory(path, roots, hosts, python=PYTHON, extra_hosts=None):
    """A YAML inventory of ``hosts`` local hosts, host i reading roots[i % len(roots)]."""
    import json

    width = len(str(hosts - 1))
    members = {}
    for index in range(hosts):
        members["fleet-%0*d" % (width, index)] = {"numa_root": roots[index % len(roots)]}
    members.update(extra_hosts or {})
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": python,
                                  "inference_service_list": SERVICES},
                         "hosts": members}}
    with open(path, "w") as handle:
        json.dump(inventory, handle, indent=1)  # JSON is YAML
    return path


def timed(argv, env):
    """(wall seconds, children's CPU seconds) of one command, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit("%s failed (rc %d):\n%s" % (" ".join(argv[:3]), done.returncode, done.stdout[-3000:]))
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--forks", type=int, nargs="+", default=[5, 20])
    parser.add_argument("--strategy", nargs="+", default=["linear", "free"])
    parser.add_argument("--rounds", type=int, default=2,
                        help="ping and report alternately this many times per setting; the medians are printed")
    parser.add_argument("--out", default=os.path.join(REPO, "build", "fleet"))
    args = parser.parse_args()
    if not glob.glob(os.path.join(DUMPS, "*.tar.bz2")):
        raise SystemExit("no captured machines in %s: the fleet needs ../shared/fixtures/hwloc-linux" % DUMPS)
    roots = extract_machines(os.path.join(args.out, "machines"))
    inventory = write_inventory(os.path.join(args.out, "inventory.yml"), roots, args.hosts)
    bindir = os.path.dirname(sys.executable)
    print("simulated fleet: %d hosts over %d captured machines, %s" % (args.hosts, len(roots), inventory))
    print("%-8s %-6s %12s %12s %12s %12s %8s %8s" % ("strategy", "forks", "ping s/host", "report s/host",
                                                  "ping cpu/h", "report cpu/h", "wall", "cpu"))
    for strategy in args.strategy:
        for forks in args.forks:
            env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_STRATEGY=strategy,
                       ANSIBLE_HOST_KEY_CHECKING="False", PATH=bindir + os.pathsep + os.environ["PATH"])
            # A controller keeps the bytecode of the collection's plugins after its first run; without it
            # (this machine's environment sets PYTHONDONTWRITEBYTECODE) every fork compiles the report's
            # filter and its module_utils again, 20-40 ms per host, which a real controller does not pay.
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            ping_argv = [os.path.join(bindir, "ansible"), "-i", inventory, "all", "-m", "ping", "-f", str(forks)]
            fleet_argv = [os.path.join(bindir, "ansible-playbook"), "-i", inventory, "-f", str(forks),
                          os.path.join(REPO, "playbooks", "fleet_report.yml"),
                          "-e", "fleet_report_dir=%s" % os.path.join(args.out, "report")]
            if strategy == args.strategy[0] and forks == args.forks[0]:
                # Untimed: the first run after a change compiles the controller's plugins and builds the
                # module's payload into Ansible's cache, which every later run (and a fleet's) reuses.
                timed(ping_argv, env)
                timed(fleet_argv, env)
            pings, fleets = [], []
            for _round in range(args.rounds):  # alternated, so a change in the machine's load hits both alike
                pings.append(timed(ping_argv, env))
                fleets.append(timed(fleet_argv, env))
            ping = [statistics.median(run[field] for run in pings) for field in (0, 1)]
            fleet = [statistics.median(run[field] for run in fleets) for field in (0, 1)]
            print("%-8s %-6d %12.3f %12.3f %12.3f %12.3f %7.2fx %7.2fx" % (
                strategy, forks, ping[0] / args.hosts, fleet[0] / args.hosts, ping[1] / args.hosts,
                fleet[1] / args.hosts, fleet[0] / ping[0], fleet[1] / ping[1]), flush=True)
    print("goal: fleet report <= 1.5x ping (wall); report: %s" % os.path.join(args.out, "report",
                                                                            "fleet_report.md"))


if __name__ == "__main__":
    main()
