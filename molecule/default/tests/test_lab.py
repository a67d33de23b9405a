"""The dual-socket lab guest after site.yml: every claim read back from the kernel.

Runs on the controller (molecule verify, testinfra over SSH). Placement is checked
through the guest's own /sys, /proc/<pid>/status and /proc/<pid>/numa_maps (the
stand-in server reports its numa_maps per node on /health), never through our
plan files.
"""

import json
import os
import subprocess
import sys
import time

import pytest

LABVM = os.path.join(os.environ.get("MOLECULE_PROJECT_DIRECTORY", "."), "lab", "labvm.py")
VM_NAME = "molecule-" + os.environ.get("MOLECULE_SCENARIO_NAME", "default")
INSTANCES = {"lab-cpu@0": 8080, "lab-cpu@1": 8081, "lab-big@0": 8090, "lab-gpu@0": 8095}


def node_cpus(host, node):
    return host.file("/sys/devices/system/node/node%d/cpulist" % node).content_string.strip()


def health(host, port):
    result = host.run("curl -sf --max-time 20 http://127.0.0.1:%d/health" % port)
    assert result.rc == 0, "no /health on port %d: %s" % (port, result.stderr)
    return json.loads(result.stdout)


def share(pages, node):
    total = sum(pages.values())
    return pages.get("N%d" % node, 0) / float(total) if total else 0.0


def wait_active(host, units, seconds=420):
    deadline = time.time() + seconds
    pending = list(units)
    while pending and time.time() < deadline:
        pending = [u for u in pending if host.run("systemctl is-active %s" % u).stdout.strip() != "active"]
        if pending:
            time.sleep(5)
    assert not pending, "not active: %s" % pending


def test_numa_balancing_off_and_persisted(host):
    assert host.sysctl("kernel.numa_balancing") == 0
    assert "kernel.numa_balancing = 0" in host.file("/etc/sysctl.d/60-inferops-numa.conf").content_string


def test_guest_has_two_nodes_and_no_numactl(host):
    assert (node_cpus(host, 0), node_cpus(host, 1)) == ("0-1", "2-3")
    assert not host.exists("numactl")


@pytest.mark.parametrize("node", [0, 1])
def test_per_node_instance_is_on_its_node(host, node):
    state = health(host, 8080 + node)
    assert state["cpus_allowed_list"] == node_cpus(host, node)
    assert state["numa_maps_policy"] == "bind:%d" % node
    assert share(state["pages_per_node"], node) >= 0.99, state["pages_per_node"]


def test_oversized_instance_is_interleaved_evenly(host):
    state = health(host, 8090)
    pages = state["weights_pages_per_node"]
    assert state["numa_maps_policy"].startswith("interleave:")
    for node in (0, 1):
        assert 0.40 <= share(pages, node) <= 0.60, pages


def test_gpu_instance_runs_next_to_the_display_device(host):
    assert host.file("/sys/bus/pci/devices/0000:81:00.0/numa_node").content_string.strip() == "1"
    state = health(host, 8095)
    assert state["cpus_allowed_list"] == node_cpus(host, 1)
    assert share(state["pages_per_node"], 1) >= 0.99, state["pages_per_node"]


@pytest.mark.parametrize("unit, port", sorted(INSTANCES.items()))
def test_server_pid_is_systemds_main_pid(host, unit, port):
    main_pid = int(host.run("systemctl show -p MainPID --value %s" % unit).stdout.strip())
    assert health(host, port)["pid"] == main_pid  # numa-pin exec'd the server, it did not fork


@pytest.mark.parametrize("unit", sorted(INSTANCES))
def test_units_verify_clean(host, unit):
    result = host.run("systemd-analyze verify %s.service" % unit)
    assert result.rc == 0 and not result.stderr.strip(), result.stderr


def test_audit_module_agrees(host):
    result = host.run("/usr/local/bin/numa-pin audit --unit lab-cpu@1.service "
                      "--plan-json /etc/inferops-numa/lab-cpu@1.plan.json --pages anon")
    assert result.rc == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["ok"] is True


def failed_start_journal(host, unit, properties, helper_args):
    """Start numa-pin as a transient unit that must fail; return its journal."""
    host.run("systemctl reset-failed %s.service" % unit)
    host.run("systemd-run --unit=%s --property=Type=exec %s /usr/local/bin/numa-pin exec %s -- /bin/sleep 600"
             % (unit, " ".join("--property=" + p for p in properties), helper_args))
    time.sleep(10)
    assert host.run("systemctl is-active %s.service" % unit).stdout.strip() != "active"
    return host.run("journalctl -u %s.service --no-pager" % unit).stdout


def test_unfit_model_with_on_unfit_fail_leaves_the_unit_failed(host):
    journal = failed_start_journal(host, "lab-fault-unfit", [], "--model-size 64G --on-unfit fail")
    assert "numa-pin:" in journal and "GiB" in journal, journal


def test_cpuset_without_the_node_is_a_clear_error(host):
    journal = failed_start_journal(host, "lab-fault-cpuset", ["AllowedMemoryNodes=0"], "--node 1")
    assert "numa-pin:" in journal and "node 1" in journal, journal


def test_after_reboot_balancing_stays_off_and_services_return(host):
    subprocess.run([sys.executable, LABVM, "reboot-wait", VM_NAME], check=True, timeout=900)
    assert host.sysctl("kernel.numa_balancing") == 0
    wait_active(host, ["%s.service" % unit for unit in INSTANCES])
    for node in (0, 1):
        state = health(host, 8080 + node)
        assert state["cpus_allowed_list"] == node_cpus(host, node)
        assert share(state["pages_per_node"], node) >= 0.99


def test_cost_report_measures_the_2x2_matrix_next_to_slit(tmp_path):
    """numa_cost in the guest through the fleet playbook; the report says which figures are measured."""
    project = os.environ["MOLECULE_PROJECT_DIRECTORY"]
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    subprocess.run([playbook, "-i", os.environ["MOLECULE_INVENTORY_FILE"],
                    os.path.join(project, "playbooks", "cost_report.yml"),
                    "-e", "numa_cost_report_dir=%s" % tmp_path, "-e", "numa_cost_max_seconds=240"],
                   check=True, timeout=900, cwd=project)
    markdown = (tmp_path / "cost_report.md").read_text()
    html = (tmp_path / "cost_report.html").read_text()
    assert "1 host(s), 1 host type(s)." in markdown  # the guest produced a result
    assert "### numa-lab" in markdown
    assert "Latency ratio (measured)" in markdown and "SLIT distance ratio (not measured)" in markdown
    assert "| **node 1** | 21 | 10 |" in markdown  # SLIT as the firmware claims it
    assert "<script" not in html and "Latency ratio" in html
