"""An instance whose two "GPUs" hang off both nodes of the lab guest, read back from the kernel.

lab-span (vars/lab_services.yml) has both display devices, one on each node, and engine trtllm.
The plan must give it the CPUs and memory of both nodes, never one node's, and hand each worker's
binding to the engine: TensorRT-LLM's per-rank affinity switched on, no argument added. What the
process runs with is read from the guest's /proc here and from the stand-in's own report of the
argv and environment it was started with, then compared with the plan the deploy recorded.
"""

import json

import pytest

from conftest import INTERLEAVED_MIN_SHARE, NUMA_PIN, health, placement, share

pytestmark = pytest.mark.usefixtures("two_nodes")

UNIT, PORT = "lab-span@0", 8097
COMMAND = ["--port", str(PORT), "--weights-mb", "64"]
GPUS = ["0000:41:00.0", "0000:81:00.0"]


@pytest.fixture(scope="module")
def recorded(host):
    return json.loads(host.file("/etc/inferops-numa/%s.plan.json" % UNIT).content_string)


def test_the_plan_spans_both_nodes_with_a_worker_per_gpu(recorded):
    assert recorded["gpus"] == GPUS
    assert recorded["cpu_nodes"] == [0, 1] and recorded["mem_nodes"] == [0, 1]
    assert recorded["policy"] == "interleave"
    assert [(entry["gpu"], entry["node"]) for entry in recorded["gpu_map"]] == list(zip(GPUS, [0, 1]))


def test_cpu_affinity_and_memory_policy_are_the_plans(host, recorded):
    where = placement(host, UNIT + ".service")
    assert where["cpus"] == recorded["cpulist"] == "0-3"
    assert where["policies"] == {"interleave:0-1"}, where["policies"]
    for node in (0, 1):
        assert share(where["anon"], node) >= INTERLEAVED_MIN_SHARE, where["anon"]


def test_each_workers_cpus_in_the_map_are_its_gpus_node(host, recorded):
    for entry in recorded["gpu_map"]:
        node = host.file("/sys/bus/pci/devices/%s/numa_node" % entry["gpu"]).content_string.strip()
        assert str(entry["node"]) == node
        assert entry["cpulist"] == host.file("/sys/devices/system/node/node%s/cpulist" % node).content_string.strip()


def test_the_server_got_exactly_the_recipes_argv_and_environment(host, recorded):
    seen = health(host, PORT)
    assert recorded["engine"]["engine"] == "trtllm" and recorded["engine"]["args"] == []
    assert seen["argv"] == COMMAND + recorded["engine"]["args"]
    assert seen["environment"]["TLLM_NUMA_AWARE_WORKER_AFFINITY"] == "1"
    assert {name: seen["environment"].get(name) for name in recorded["env"]} == recorded["env"]


def test_explain_shows_the_map_and_the_union_plan_with_its_reasons(host):
    result = host.run("%s explain --gpus 2 --engine vllm" % NUMA_PIN)
    assert result.rc == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [entry["node"] for entry in plan["gpu_map"]] == [0, 1] and plan["cpu_nodes"] == [0, 1]
    assert plan["engine"]["args"] == ["--numa-bind", "--numa-bind-nodes", "0", "1", "--numa-bind-cpus", "0-1", "2-3"]
    assert plan["engine"]["missing"] == ["numactl"]  # the guest has none: the plan says so
    assert any("span nodes 0-1" in reason for reason in plan["reasons"])


def test_an_engine_binder_missing_on_the_host_stops_the_start_with_its_name(host):
    """vLLM's per-worker binding runs numactl, which the lab guest lacks on purpose."""
    result = host.run("%s exec --gpus 2 --engine vllm -- /bin/true" % NUMA_PIN)
    assert result.rc == 2, result.stdout + result.stderr
    assert "engine vllm binds each worker with numactl, which is not on PATH" in result.stderr
