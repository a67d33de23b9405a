"""The fleet report: services planned as the role plans them, the filter's model and both templates on fake
results, where the report may go, then playbooks/fleet_report.yml for real over a small simulated fleet."""

import json
import os
import re
import subprocess
import sys

import importlib

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa import fleet
from ansible_collections.inferops.numa.plugins.module_utils.numa.placement import Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.topology import read
from ansible_collections.inferops.numa.plugins.plugin_utils import fleet_report, report_pages

from tests.fixtures import sysfs
from tests.tools import ansible_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATES = os.path.join(REPO, "playbooks", "templates")
sys.path.insert(0, os.path.join(REPO, "bench"))
import fleet_bench  # noqa: E402  (bench/ is not a package)


def report_filter():
    """The filter plugin, imported when a test runs: it imports ansible.errors, and with that imported at
    collection time test_balancing_module's in-process module runs no longer return their warnings."""
    return importlib.import_module("ansible_collections.inferops.numa.plugins.filter.numa_fleet_report")


def report_model(hostvars, hosts):
    """The model as the numa_report action builds it (the filter returns the same, marked unsafe)."""
    return fleet_report.numa_fleet_report(hostvars, hosts)


@pytest.fixture(scope="module")
def gpu_host(tmp_path_factory):
    return read(sysfs.dual_socket_gpus().write(str(tmp_path_factory.mktemp("gpus"))))


def test_per_node_plans_one_instance_per_node_with_cpus_as_the_role_does(gpu_host):
    rows = fleet.plan_service(gpu_host, {"name": "llama", "layout": "per_node", "model_size": "14G",
                                         "port_base": 8080})
    assert [(row["unit"], row["nodes"], row["port"]) for row in rows] == [
        ("llama@0.service", "0", 8080), ("llama@1.service", "1", 8081)]
    direct = plan(gpu_host, Request(instances=2, instance=1, gpus="none", model_size="14G", port_base=8080,
                                    anchors=[0, 1])).to_dict()
    assert (rows[1]["cpulist"], rows[1]["policy"], rows[1]["gpus"]) == (direct["cpulist"], direct["policy"], [])


def test_per_gpu_gives_each_instance_its_gpu(gpu_host):
    rows = fleet.plan_service(gpu_host, {"name": "vllm", "layout": "per_gpu", "model_size": "30G"})
    assert [row["gpus"] for row in rows] == [["0000:81:00.0"], ["0000:c1:00.0"]]
    assert all(row["nodes"] == "1" and row["error"] is None for row in rows)


def test_a_service_that_cannot_be_placed_is_a_row_saying_why(gpu_host, tmp_path):
    too_big = fleet.plan_service(gpu_host, {"name": "huge", "model_size": "4T", "on_unfit": "fail"})
    assert len(too_big) == 1 and too_big[0]["policy"] is None and "GiB" in too_big[0]["error"]
    no_gpu = read(sysfs.amd_nps4().write(str(tmp_path)))
    assert "layout per_gpu gives no instance here (0 GPUs" in fleet.plan_service(
        no_gpu, {"name": "v", "layout": "per_gpu"})[0]["error"]
    assert "layout 'sideways' is none of" in fleet.plan_service(no_gpu, {"name": "v", "layout": "sideways"})[0]["error"]


def result(balancing=0, drift=False):
    instance = {"unit": "llama@1.service", "policy": "bind", "nodes": "1", "cpulist": "2-3", "up": True,
                "local_ratio": {"anon": 1.0, "file": 0.5 if drift else 1.0, "judged": 0.9 if drift else 1.0},
                "min_local_percent": 99.0, "drift": drift, "affinity_match": not drift, "message": "ok"}
    return {"host": {"numa_balancing": balancing, "node_count": 2, "cpu_count": 4, "gpu_count": 1,
                     "nodes": [{"id": 0, "memory_free_bytes": 2 << 30}, {"id": 1, "memory_free_bytes": 1 << 30}]},
            "topology": {"nodes": [{"id": 0, "cpus": 2, "cpulist": "0-1", "memory_total_bytes": 4 << 30, "gpus": []},
                                   {"id": 1, "cpus": 2, "cpulist": "2-3", "memory_total_bytes": 4 << 30,
                                    "gpus": ["0000:81:00.0"]}]},
            "instances": [instance], "read_warnings": ["node 3 has no\nmeminfo"],
            "planned": [{"unit": "llama@0.service", "policy": "bind", "nodes": "0", "cpulist": "0-1", "threads": 2,
                         "gpus": [], "port": 8080, "error": None}]}


HOSTVARS = {"good": {"fleet_report_result": result()},
            "drifting": {"fleet_report_result": result(balancing=1, drift=True)},
            "gone": {"fleet_report_result": {"unreachable": True, "msg": "Failed to connect\nto the host"}},
            "broken": {"fleet_report_result": {"failed": True, "msg": "topology root '/x' is not a directory"}},
            "skipped": {"fleet_report_result": {"skipped": True, "skip_reason": "Conditional result was False"}},
            "<script>": {}}
HOSTS = ["good", "drifting", "gone", "broken", "skipped", "<script>"]


def test_the_model_lists_every_host_and_why_some_have_no_result():
    model = report_model(HOSTVARS, HOSTS)
    assert [host["name"] for host in model["answered"]] == ["good", "drifting"]
    assert model["missing"] == [
        {"name": "gone", "error": "unreachable: Failed to connect to the host"},
        {"name": "broken", "error": "failed: topology root '/x' is not a directory"},
        {"name": "skipped", "error": "skipped: Conditional result was False"},
        {"name": "<script>", "error": "no result: the host was not reached or was skipped"}]
    assert (model["host_count"], model["instance_count"], model["drifted"], model["balancing_on"]) == (6, 2, 1, 1)
    drifting = model["answered"][1]
    assert drifting["balancing"].startswith("ON") and drifting["nodes"][1]["gpus"] == "0000:81:00.0"
    assert drifting["instances"][0]["judged"] == "90.00 %" and drifting["instances"][0]["affinity"] == "NO"
    assert drifting["warnings"][:3] == [
        "automatic NUMA balancing is on: the kernel moves pinned services' pages (numa_host turns it off)",
        "llama@1.service drifted: 90.00 % of its pages on node(s) 1, below 99 %",
        "llama@1.service: a thread may run outside the plan's CPUs 2-3"]
    assert drifting["warnings"][3] == "node 3 has no meminfo"


def test_no_host_at_all_is_a_report_too():
    model = report_model({}, [])
    assert model["host_count"] == 0 and render("fleet_report.md.j2", model).startswith("# NUMA fleet report")


def render(name, model):
    """A page as the numa_report action renders it: report_pages' own escaping environments."""
    kind, fmt = name[:-len(".j2")].rsplit(".", 1)
    return report_pages.render(kind, model)[fmt]


def test_both_pages_show_the_hosts_their_nodes_services_and_warnings():
    model = report_model(HOSTVARS, HOSTS)
    markdown = render("fleet_report.md.j2", model)
    html = render("fleet_report.html.j2", model)
    assert "| drifting | 2 | 4 | 1 | `ON (NUMA hinting faults migrate pages)` | 1 | 1 | 4 |" in markdown
    assert "| `llama@1.service` | up | bind | 1 | 2-3 | 100.00 % | 50.00 % | 90.00 % | 99 % | DRIFT | NO |" in markdown
    assert "| `llama@0.service` | bind | 0 | 0-1 | 2 | `-` | 8080 |" in markdown
    assert "| 1 | 2 | 2-3 | 4.0 | 1.0 | `0000:81:00.0` |" in markdown
    assert "- **gone**: `unreachable: Failed to connect to the host`" in markdown
    assert "<script>" not in html and "&lt;script&gt;" in html and 'class="bad">DRIFT' in html


def test_the_report_goes_to_the_current_or_given_directory_never_into_an_installed_collection(tmp_path, monkeypatch):
    monkeypatch.chdir(str(tmp_path))
    assert report_filter().numa_fleet_report_dir(None) == str(tmp_path)
    assert report_filter().numa_fleet_report_dir("out") == str(tmp_path / "out")
    installed = tmp_path / "ansible_collections" / "inferops" / "numa"
    (installed / "plugins").mkdir(parents=True)
    (installed / "MANIFEST.json").write_text("{}")
    with pytest.raises(report_filter().AnsibleFilterError, match="inside the installed collection"):
        report_filter().numa_fleet_report_dir(str(installed / "playbooks"))
    monkeypatch.chdir(str(installed))
    with pytest.raises(report_filter().AnsibleFilterError, match="write the report elsewhere"):
        report_filter().numa_fleet_report_dir("")


# --- the playbook, for real ------------------------------------------------------------------------


def run_report(tmp_path, inventory):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([ansible_command("ansible-playbook"), "-i", inventory,
                           os.path.join(REPO, "playbooks", "fleet_report.yml"), "-e", "fleet_report_dir=report"],
                          cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    return (tmp_path / "report" / "numa_fleet_report.md").read_text(), \
        (tmp_path / "report" / "numa_fleet_report.html").read_text()


UNREACHABLE = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1,
               "ansible_ssh_common_args": "-o ConnectTimeout=5"}


def test_a_simulated_fleet_gets_one_page_with_its_unreachable_and_failed_hosts(tmp_path):
    if not os.path.isdir(fleet_bench.DUMPS):
        pytest.skip("no captured machines in %s" % fleet_bench.DUMPS)
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
EVERY_LAYOUT = [{"name": "llama", "layout": "per_node", "model_size": "1G", "port_base": 8080},
                {"name": "vllm", "layout": "per_gpu", "model_size": "1G"},
                {"name": "big", "layout": "single", "model_size": "1G", "gpus": "auto"}]


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
