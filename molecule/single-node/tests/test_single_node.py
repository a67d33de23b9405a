"""The same guest without NUMA options: one node, a display device without a node."""

import json


def health(host, port):
    result = host.run("curl -sf --max-time 20 http://127.0.0.1:%d/health" % port)
    assert result.rc == 0, "no /health on port %d: %s" % (port, result.stderr)
    return json.loads(result.stdout)


def test_facts_say_one_node(host):
    facts = json.loads(host.run("/usr/local/bin/numa-pin facts").stdout)
    assert facts["node_count"] == 1
    assert facts["nodes"][0]["cpulist"] == "0-3"
    assert [gpu["numa_node"] for gpu in facts["gpus"]] == [None]


def test_per_node_layout_gives_one_instance_on_all_cpus(host):
    assert host.service("lab-cpu@0.service").is_running
    assert not host.run("systemctl cat lab-cpu@1.service").stdout.strip() or \
        host.run("systemctl is-enabled lab-cpu@1.service").stdout.strip() != "enabled"
    state = health(host, 8080)
    assert state["cpus_allowed_list"] == "0-3"
    assert state["numa_maps_policy"] == "bind:0"


def test_every_service_runs_bound_to_node_zero(host):
    for port in (8080, 8090, 8095):
        state = health(host, port)
        assert state["numa_maps_policy"] == "bind:0", (port, state)
        assert set(state["pages_per_node"]) == {"N0"}


def test_balancing_is_off(host):
    assert host.sysctl("kernel.numa_balancing") == 0
