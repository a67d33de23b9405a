"""The same disk booted as a sub-NUMA machine with far memory, then converged with two llama services.

labvm.py relayout --numa 5 boots it as two sockets each split in two (SNC2: nodes 0-1 on socket 0, 2-3 on socket 1,
one CPU each) and a CPU-less CXL-like node 4 beside socket 0, with HMAT figures (DRAM 20000 MB/s, node 4 10000 MB/s):
labvm.SUB_NUMA_*. Its kernel (bookworm-backports 6.12) has weighted interleave. The services deployed before are
stopped; converge.yml then deploys
- llama-socket, layout per_socket: one llama-server per socket over that socket's two nodes;
- llama-spill, one llama-server on node 0 whose model and headroom need more than socket 0's two nodes hold, so it
  spills to node 4 before the other socket, weighted by the weights numa_host set from HMAT.
Placement is read back from /proc by the lab's own parser (conftest.placement), as elsewhere.
"""

import json
import os

import pytest

from conftest import (INTERLEAVED_MIN_SHARE, NUMA_PIN, PROJECT, VM_NAME, converge, labvm, placement, share,
                      wait_until)

SERVER = "/opt/llama.cpp/bin/llama-server"
SOCKET_MODEL = "/srv/models/model.gguf"
SPILL_MODEL = "/srv/models/big.gguf"
RUN_VARS = os.path.join(PROJECT, "build", "reports", "lab-run-vars.json")
SUB_NUMA_VARS = os.path.join(PROJECT, "build", "reports", "sub-numa-vars.json")
WEIGHTS = "/sys/kernel/mm/mempolicy/weighted_interleave"
# How far above socket 0's available memory llama-spill's need is set: the memory the plan sees moves by less than
# this between the facts read here and the role's plan, and node 4's 512 MiB hold it with room to spare.
SPILL_MARGIN = 96 << 20
# The audit's band (read/audit.py WEIGHT_BAND_PERCENT), as a share.
WEIGHT_BAND = 0.10
READY_S = 30


def llama(name, layout, model, port_base, **extra):
    command = [SERVER, "--model", model, "-t", "{threads}", "--host", "127.0.0.1", "--port", "{port}"]
    return dict({"name": name, "layout": layout, "command": command, "port_base": port_base, "model": model,
                 "page_cache": "replicate", "engine": "llama.cpp", "user": "llama", "gpus": "none"}, **extra)


def guest(command):
    result = labvm.run_ssh(VM_NAME, command)
    assert result.returncode == 0, "%s: %s" % (command, result.stderr)
    return result.stdout


def spill_headroom():
    """The headroom that makes llama-spill need SPILL_MARGIN more than nodes 0 and 1 have available now."""
    facts = json.loads(guest(NUMA_PIN + " facts"))
    available = sum(node["memory_available_kb"] * 1024 for node in facts["nodes"] if node["id"] in (0, 1))
    return "%dK" % ((available + SPILL_MARGIN - int(guest("stat -c %%s %s" % SPILL_MODEL))) // 1024)


@pytest.fixture(scope="module")
def sub_numa():
    if labvm.instance(VM_NAME).get("numa") == 5:
        return
    labvm.relayout(VM_NAME, 5)
    # What earlier layouts deployed would share the nodes' memory with these services: stopped, not removed.
    guest("systemctl stop 'llama@*' 'llama-big@*' 'lab-*'")
    with open(RUN_VARS) as handle:
        variables = json.load(handle)
    variables["inference_service_list"] = [
        llama("llama-socket", "per_socket", SOCKET_MODEL, 8200),
        llama("llama-spill", "single", SPILL_MODEL, 8210, node=0, memory_headroom=spill_headroom()),
    ]
    with open(SUB_NUMA_VARS, "w") as handle:
        json.dump(variables, handle)
    converge("-e", "@%s" % SUB_NUMA_VARS)


pytestmark = pytest.mark.usefixtures("sub_numa")


def wait_ready(host, port):
    wait_until(lambda: host.run("curl -sf -o /dev/null --max-time 10 http://127.0.0.1:%d/health" % port).rc == 0,
               READY_S, "llama-server on port %d ready" % port)


def plan_of(host, unit):
    return json.loads(host.file("/etc/inferops-numa/%s.plan.json" % unit).content_string)


def all_pages(where):
    pages = dict(where["anon"])
    for node, size in where["file"].items():
        pages[node] = pages.get(node, 0) + size
    return pages


def test_facts_say_two_sockets_of_two_nodes_and_far_memory_beside_socket_0(host):
    facts = json.loads(host.run("%s facts" % NUMA_PIN).stdout)
    assert facts["shape"] == {"packages": 2, "cpu_nodes_per_package": 2, "sub_numa": True, "memory_only_nodes": [4]}
    far = facts["nodes"][4]
    assert (far["kind"], far["memory_class"], far["home_package"]) == ("memory_only", "far", 0)
    assert far["hmat"]["read_bandwidth"] == 10000 and facts["nodes"][0]["hmat"]["read_bandwidth"] == 20000
    assert [tier["nodes"] for tier in facts["memory_tiers"]] == [[0, 1, 2, 3], [4]]
    assert facts["kernel"]["features"]["weighted_interleave"] is True


def test_the_weights_come_from_hmat_and_are_kept_for_the_next_boot(host):
    weights = {node: int(host.file("%s/node%d" % (WEIGHTS, node)).content_string) for node in range(5)}
    assert weights == {0: 2, 1: 2, 2: 2, 3: 2, 4: 1}
    dropin = host.file("/etc/tmpfiles.d/60-inferops-numa-weights.conf").content_string
    assert "(numa_weights, from hmat)" in dropin and "%s/node4 - - - - 1" % WEIGHTS in dropin


def test_balancing_on_a_tiered_host_keeps_promotion_only(host):
    assert host.sysctl("kernel.numa_balancing") == 2


@pytest.mark.parametrize("instance, nodes, cpus", [(0, (0, 1), "0-1"), (1, (2, 3), "2-3")])
def test_per_socket_runs_one_server_per_socket_over_its_two_nodes(host, instance, nodes, cpus):
    unit = "llama-socket@%d.service" % instance
    wait_ready(host, 8200 + instance)
    where = placement(host, unit)
    assert where["cpus"] == cpus and all(allowed == cpus for allowed in where["threads"].values()), where
    interleave = "interleave:%d-%d" % nodes
    assert interleave in where["policies"], where["policies"]
    pages = all_pages(where)
    assert set(pages) <= {"N%d" % node for node in nodes}, pages
    # Both nodes of the socket hold a good part, never one alone.
    assert all(share(pages, node) >= INTERLEAVED_MIN_SHARE for node in nodes), pages


def test_the_oversized_server_spills_to_its_sockets_far_memory_by_the_weights(host):
    plan = plan_of(host, "llama-spill@0")
    assert (plan["policy"], plan["mem_nodes"], plan["cpu_nodes"]) == ("weighted-interleave", [0, 1, 4], [0, 1]), plan
    wait_ready(host, 8210)
    where = placement(host, "llama-spill@0.service")
    assert "weighted interleave:0-1,4" in where["policies"], where["policies"]
    pages = all_pages(where)
    assert set(pages) <= {"N0", "N1", "N4"}, pages
    for node, wanted in ((0, 0.4), (1, 0.4), (4, 0.2)):
        assert abs(share(pages, node) - wanted) <= WEIGHT_BAND, (node, pages)
    audit = json.loads(host.run("%s audit --unit llama-spill@0.service --plan-file /etc/inferops-numa/llama-spill@0.plan.json"
                                % NUMA_PIN).stdout)
    assert audit["ok"] and audit["interleave_weight_percent"] == {"0": 40.0, "1": 40.0, "4": 20.0}, audit["msg"]
