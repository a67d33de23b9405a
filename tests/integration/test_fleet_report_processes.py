"""The fleet report playbook, for real: ansible-playbook over simulated fleets and every machine the project has."""

import json
import os
import re
import subprocess
import sys

import pytest

from ansible_collections.inferops.numa.plugins.plugin_utils import report_pages

from tests.fixtures import sysfs
from tests.tools import ansible_command, hwloc_dumps
from tests.unit.test_fleet_report import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import fleet_bench  # noqa: E402  (bench/ is not a package)


def run_report(tmp_path, inventory):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", inventory,
                           os.path.join(REPO, "playbooks", "fleet_report.yml"), "-e", "fleet_report_dir=report"],
                          cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    return (tmp_path / "report" / "fleet_report.md").read_text(), \
        (tmp_path / "report" / "fleet_report.html").read_text()


UNREACHABLE = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
               "ansible_ssh_common_args": "-o ConnectTimeout=5"}


@hwloc_dumps()
def test_a_simulated_fleet_gets_one_page_with_its_unreachable_and_failed_hosts(tmp_path):
    roots = fleet_bench.extract_machines(str(tmp_path / "machines"))
    chosen = [root for root in roots if os.path.basename(root) in ("16amd64-8n2c", "40intel64-2g2n4c+pci",
                                                                    "2arm-2c")]
    assert len(chosen) == 3
    inventory = fleet_bench.write_inventory(str(tmp_path / "inventory.yml"), chosen, 4, python=sys.executable,
                                            extra_hosts={"down": UNREACHABLE, "bad-root": {"numa_root": "/nonexistent"}})
    markdown, html = run_report(tmp_path, inventory)
    assert "6 host(s): 4 answered, 2 without a result;" in markdown
    assert "| fleet-0 | 8 | 16 | 0 |" in markdown and "| fleet-3 | 8 | 16 | 0 |" in markdown
    assert "| fleet-2 | 4 | 40 | 0 |" in markdown  # the machines in name order: 16amd64, 2arm, 40intel64
    assert "| `llama@3.service` | bind | 3 | 3,7,11,15,19,23,27,31,35,39 | 10 | `-` | 8083 |" in markdown
    assert "- **down**: `unreachable:" in markdown
    assert "- **bad-root**: `failed: topology root '/nonexistent' is not a directory" in markdown
    assert "<h2>fleet-1</h2>" in html


def test_a_fleet_with_no_reachable_host_still_gets_its_report(tmp_path):
    inventory = fleet_bench.write_inventory(str(tmp_path / "inventory.yml"), [], 0, python=sys.executable,
                                            extra_hosts={"down-1": UNREACHABLE, "down-2": UNREACHABLE})
    markdown, _html = run_report(tmp_path, inventory)
    assert "2 host(s): 0 answered, 2 without a result;" in markdown
    assert "- **down-1**: `unreachable:" in markdown and "- **down-2**: `unreachable:" in markdown


RECIPES = ("dual_socket_gpus", "amd_nps4", "grace_like", "cxl_memory_node", "vm_without_nodes", "cgroup_restricted",
           "dgx_like", "gh200_like", "memoryless_cpu_nodes")


# Each entry as the role would deploy it (the report plans with the role's own checked merge, which needs a command).
EVERY_LAYOUT = [{"name": "llama", "command": ["/usr/bin/llama-server"], "layout": "per_node", "model_size": "1G",
                 "port_base": 8080},
                {"name": "vllm", "command": ["/usr/bin/vllm", "serve"], "layout": "per_gpu", "model_size": "1G"},
                {"name": "big", "command": ["/usr/bin/llama-server"], "layout": "single", "model_size": "1G",
                 "gpus": "auto"}]


def gpu_addresses(root):
    """The display-class PCI functions of a machine, read here from the raw files (the oracle): class 0x03xxxx,
    and not the ASPEED or Matrox BMCs the reader leaves out."""
    base = os.path.join(root, "sys", "bus", "pci", "devices")
    found = []
    for address in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, address, "class")) as handle:
                device_class = int(handle.read().strip(), 16)
            with open(os.path.join(base, address, "vendor")) as handle:
                vendor = handle.read().strip().lower()
        except (OSError, ValueError):
            continue
        if device_class >> 16 == 0x03 and vendor not in ("0x1a03", "0x102b"):
            found.append(address)
    return found


def test_every_captured_and_constructed_machine_is_reported_whole(tmp_path):
    """numa_metrics and the fleet report over every machine the project has: the hwloc dumps and every recipe of
    tests/fixtures/sysfs.py (the GPU machines included), each with one service of every layout planned."""
    roots = {name: getattr(sysfs, name)().write(str(tmp_path / "recipes" / name)) for name in RECIPES}
    if os.path.isdir(fleet_bench.DUMPS):
        roots.update((os.path.basename(root), root) for root in fleet_bench.extract_machines(str(tmp_path / "dumps")))
    elif os.environ.get("CI"):
        pytest.fail("the captured machines of %s are missing" % fleet_bench.DUMPS)
    hosts = {name: {"numa_root": root, "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "inference_service_list": EVERY_LAYOUT} for name, root in roots.items()}
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    markdown, html = run_report(tmp_path, str(inventory))
    assert "%d host(s): %d answered, 0 without a result;" % (len(hosts), len(hosts)) in markdown
    for name, root in roots.items():
        row = re.search(r"^\| %s \| (\d+) \| (\d+) \| (\d+) \|" % re.escape(report_pages.markdown_value(name)),
                        markdown, re.MULTILINE)
        assert row, name
        assert int(row.group(3)) == len(gpu_addresses(root)), name
        assert "<h2>%s</h2>" % name.replace("&", "&amp;") in html
    assert "`0000:81:00.0`" in markdown  # dual_socket_gpus' H100 on node 1, by address
