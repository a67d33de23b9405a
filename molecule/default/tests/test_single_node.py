"""The same disk booted as a one-node machine, then converged again: a host whose hardware changed.

labvm.py relayout powers the guest off and boots it without NUMA tables (one node, CPUs 0-3, the
display device's numa_node -1); converge.yml then re-plans every service for it.
"""

import json

import pytest

from conftest import NUMA_PIN, health, placement, unit_state

pytestmark = pytest.mark.usefixtures("one_node")


def test_facts_say_one_node(host):
    facts = json.loads(host.run("%s facts" % NUMA_PIN).stdout)
    assert facts["node_count"] == 1
    assert facts["nodes"][0]["cpulist"] == "0-3"
    assert [gpu["numa_node"] for gpu in facts["gpus"]] == [None, None]


def test_per_node_layout_gives_one_instance_on_all_cpus(host):
    assert unit_state(host, "llama@0.service") == "active"
    assert unit_state(host, "llama@1.service") != "active"
    assert host.run("systemctl is-enabled llama@1.service").stdout.strip() != "enabled"
    assert not host.file("/etc/inferops-numa/llama@1.plan.json").exists
    where = placement(host, "llama@0.service")
    assert where["cpus"] == "0-3" and where["policies"] == {"bind:0"}, where


def test_the_model_too_big_for_a_1_gib_node_fits_the_one_big_node(host):
    plan = json.loads(host.file("/etc/inferops-numa/llama-big@0.plan.json").content_string)
    assert plan["policy"] == "bind" and plan["mem_nodes"] == [0], plan
    assert placement(host, "llama-big@0.service")["policies"] == {"bind:0"}


def test_gpus_without_a_node_leave_their_services_on_node_zero(host):
    # lab-gpu@0 and @1 share the one node's cores; lab-span's two GPUs no longer span anything.
    for port, cpus in ((8095, "0-1"), (8096, "2-3"), (8097, "0-3")):
        state = health(host, port)
        assert state["cpus_allowed_list"] == cpus and state["numa_maps_policy"] == "bind:0", state
        assert set(state["pages_per_node"]) == {"N0"}, state


def test_balancing_is_off(host):
    assert host.sysctl("kernel.numa_balancing") == 0
