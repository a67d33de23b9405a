"""Engine recipes: each engine's switches from the plan's map, and numa-pin exec handing them over.

The flags are the ones docs/engines.md records with the engine versions they were checked against.
"""

import json
import os
import stat

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import ab_gate
from ansible_collections.inferops.numa.plugins.module_utils.numa.base import engines
from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import request
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.engines import (
    ENGINES, missing_programs, recipe, with_engine_args)
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import Request, plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.tokens import server_command
from ansible_collections.inferops.numa.plugins.module_utils.numa.act.unit_text import plan_record

from tests.unit import topo_factory as tf

PACKAGE_PARENT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "plugins", "module_utils")


def spanning(engine, **options):
    return plan(tf.dgx_like(), Request(gpus=8, engine=engine, **options))


def one_node(engine):
    return plan(tf.dgx_like(), Request(gpus=4, instances=2, instance=1, engine=engine))


def test_vllm_spanning_binds_each_worker_by_the_map():
    result = spanning("vllm")
    nodes = [str(entry["mem_nodes"][0]) for entry in result.gpu_map]
    cpus = [entry["cpulist"] for entry in result.gpu_map]
    assert result.engine["args"] == ["--numa-bind", "--numa-bind-nodes"] + nodes + ["--numa-bind-cpus"] + cpus
    assert nodes == ["0"] * 4 + ["1"] * 4
    assert result.engine["requires"] == ["numactl"]
    assert result.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_vllm_binds_memory_less_cpu_nodes_workers_to_their_memory_node():
    result = plan(tf.memoryless_cpu_nodes(), Request(gpus=2, engine="vllm"))
    assert result.engine["args"] == ["--numa-bind", "--numa-bind-nodes", "2", "3", "--numa-bind-cpus", "0-15", "16-31"]


def test_sglang_spanning_names_each_gpus_node():
    result = spanning("sglang")
    assert result.engine["args"] == ["--numa-node"] + [str(entry["node"]) for entry in result.gpu_map]
    assert result.engine["requires"] == ["numactl"] and result.env["SGLANG_NUMA_BIND_V2"] == "1"


def test_trtllm_spanning_turns_its_per_rank_affinity_on():
    result = spanning("trtllm")
    assert result.engine["args"] == [] and result.env["TLLM_NUMA_AWARE_WORKER_AFFINITY"] == "1"


@pytest.mark.parametrize("engine, env", [("vllm", {}), ("sglang", {"SGLANG_AUTO_NUMA_BIND": "0"}),
                                         ("trtllm", {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "0"}), ("generic", {})])
def test_on_one_node_the_engines_own_binder_stays_off(engine, env):
    result = one_node(engine)
    if ENGINES[engine].nccl:  # and NCCL is told the RDMA NICs of the GPUs' node (dgx_like: no switches known)
        nodes = {entry["node"] for entry in result.gpu_map}
        names = [nic["rdma_name"] for nic in tf.dgx_like()["nics"] if nic["numa_node"] in nodes]
        env = dict(env, NCCL_IB_HCA="=" + ",".join(names), UCX_NET_DEVICES=",".join(name + ":1" for name in names))
    assert result.engine["args"] == [] and result.engine["requires"] == [] and result.engine["env"] == env
    assert all(result.env[name] == value for name, value in env.items())


def test_llama_cpp_gets_no_numa_mode_and_names_it_a_conflict():
    for result in (one_node("llama.cpp"), spanning("llama.cpp")):
        assert result.engine["args"] == [] and result.engine["conflicts"] == ["--numa"]


@pytest.mark.parametrize("argv, conflicts", [(["llama-server", "--numa", "numactl"], 1),
                                             (["llama-server", "--numa=isolate"], 1),
                                             (["llama-server", "-m", "--numa"], 1),
                                             (["llama-server", "--numactl"], 0), (["--numa"], 0)])
def test_a_llama_cpp_command_with_numa_is_refused_naming_why(argv, conflicts):
    placement = one_node("llama.cpp")
    if conflicts:
        with pytest.raises(NumaError, match="resets its main thread's CPU affinity to all CPUs"):
            numa_pin._check_engine(placement, argv, best_effort=False)
        assert "kept" in numa_pin._check_engine(placement, argv, best_effort=True)[0]
    else:
        assert numa_pin._check_engine(placement, argv, best_effort=False) == []


def test_every_engine_explains_itself_when_it_spans():
    for engine in ENGINES:
        assert spanning(engine).engine["reasons"], engine


def test_recipe_is_part_of_the_plan_and_its_reasons():
    result = spanning("vllm").to_dict()
    assert result["engine"]["engine"] == "vllm"
    assert set(result["engine"]["reasons"]) <= set(result["reasons"])
    json.dumps(result)


def test_an_unknown_engine_is_refused_with_the_choices():
    with pytest.raises(NumaError, match="unknown engine 'tgi': choose one of generic, llama.cpp, vllm, sglang, trtllm"):
        Request(engine="tgi")


def test_recipe_of_an_empty_map_adds_nothing():
    assert all(recipe(engine, [], False)["args"] == [] for engine in ENGINES)


# ------------------------------------------------------------- the command ---

def test_engine_args_go_after_the_servers_own():
    assert with_engine_args(["vllm", "serve", "m"], ["--numa-bind", "--numa-bind-nodes", "0", "1"]) == (
        ["vllm", "serve", "m", "--numa-bind", "--numa-bind-nodes", "0", "1"], [])


@pytest.mark.parametrize("given", [["--numa-bind-nodes", "1", "1"], ["--numa-bind-nodes=1"]])
def test_a_flag_the_command_gives_is_kept_with_its_values(given):
    argv, kept = with_engine_args(["vllm", "serve", "m"] + given,
                                  ["--numa-bind", "--numa-bind-nodes", "0", "1", "--numa-bind-cpus", "0-3", "4-7"])
    assert argv == ["vllm", "serve", "m"] + given + ["--numa-bind", "--numa-bind-cpus", "0-3", "4-7"]
    assert kept == ["--numa-bind-nodes"]


def test_the_command_is_tokens_then_engine_args():
    result = spanning("sglang", port_base=9000)
    argv, kept = server_command(["sglang", "--port", "{port}", "--numa-node", "1"], result.to_dict())
    assert argv == ["sglang", "--port", "9000", "--numa-node", "1"] and kept == ["--numa-node"]
    argv, kept = server_command(["sglang", "-t", "{threads}"], result.to_dict())
    assert argv == ["sglang", "-t", str(result.threads)] + result.engine["args"] and kept == []


def test_missing_programs_are_looked_up_on_the_path(tmp_path):
    tool = tmp_path / "numactl"
    tool.write_text("#!/bin/sh\n")
    assert missing_programs(["numactl"], str(tmp_path)) == ["numactl"]  # not executable
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert missing_programs(["numactl", "taskset"], "%s:/nonexistent" % tmp_path) == ["taskset"]


def test_exec_refuses_an_engine_whose_binder_is_missing(monkeypatch):
    placement = spanning("vllm")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(NumaError, match="engine vllm binds each worker with numactl, which is not on PATH"):
        numa_pin._check_engine(placement, ["vllm", "serve"], best_effort=False)
    notes = numa_pin._check_engine(placement, ["vllm", "serve"], best_effort=True)
    assert placement.engine["args"] == [] and "its arguments NOT added" in notes[0]


# ------------------------------------------------------------- one record per engine ---

def _bind_self(gpu_map, spanning):
    return ["--bind-self", str(len(gpu_map))], {"TEST_WORKERS": "1"}, [], ["engine testengine: its own switch"]


TEST_ENGINE = engines.Engine("testengine", _bind_self, (("--self-numa", "TEST_SELF_NUMA", "it rebinds itself"),),
                             "/ready", engines.LLAMA_CPP_API)


@pytest.fixture
def test_engine(monkeypatch):
    """A newcomer's engine: its one record in the table, nothing else edited."""
    monkeypatch.setitem(engines.ENGINES, TEST_ENGINE.name, TEST_ENGINE)
    return TEST_ENGINE.name


def test_an_engine_added_as_one_record_is_a_choice_of_the_request_everywhere(test_engine):
    assert test_engine in request.argument_spec()["engine"]["choices"]
    assert request.build_request({"engine": test_engine}).engine == test_engine
    args, _ = numa_pin._parse(["explain", "--engine", test_engine])
    assert args.engine == test_engine


def test_an_engine_added_as_one_record_is_planned_refused_probed_and_gated_by_it(test_engine):
    placement = spanning(test_engine)
    assert placement.engine["args"] == ["--bind-self", "8"] and placement.env["TEST_WORKERS"] == "1"
    assert placement.engine["conflicts"] == ["--self-numa"]
    with pytest.raises(NumaError, match=r"refusing engine testengine's --self-numa \(it rebinds itself\)"):
        numa_pin._check_engine(placement, ["server", "--self-numa"], best_effort=False)
    assert engines.conflicting_flags(test_engine, ["server"], {"TEST_SELF_NUMA": ""}) == [
        "TEST_SELF_NUMA in the environment, which testengine reads as --self-numa (it rebinds itself; unset it: drop "
        "it from the service's environment)"]
    assert engines.health_url(test_engine, 8000) == "http://127.0.0.1:8000/ready"
    assert ab_gate.gate_from(None, 8000, test_engine).api == engines.LLAMA_CPP_API


@pytest.mark.parametrize("name", list(engines.ENGINES))
def test_each_record_is_whole(name):
    record = engines.ENGINES[name]
    assert record.name == name and record.api in engines.APIS
    assert record.health_path is None or record.health_path.startswith("/")
    assert all(flag.startswith("--") and variable and why for flag, variable, why in record.conflicts)


# --- the NICs NCCL is told: nearest each GPU ----------------------------------------------------------------------

def test_each_gpus_nics_are_listed_nearest_first_and_nccl_gets_the_nearest_rdma_ones():
    topology = tf.dgx_switches()
    first = plan(topology, Request(gpus="0000:12:00.0", engine="vllm"))
    assert [(nic["rdma_name"], nic["near"]) for nic in first.gpu_map[0]["nics"]] == [
        ("mlx5_0", "pcie_switch"), ("mlx5_1", "host_bridge")]
    assert first.env["NCCL_IB_HCA"] == "=mlx5_0" and first.env["UCX_NET_DEVICES"] == "mlx5_0:1"
    # Socket 1's four GPUs: each switch's NIC, once; the Ethernet NIC beside two of them has no RDMA device.
    four = plan(topology, Request(gpus="0000:92:00.0,0000:93:00.0,0000:b2:00.0,0000:b3:00.0", engine="sglang"))
    assert [nic["name"] for nic in four.gpu_map[2]["nics"]] == ["ibp11", "eth0", "ibp10"]
    assert four.env["NCCL_IB_HCA"] == "=mlx5_2,mlx5_3" and four.env["UCX_NET_DEVICES"] == "mlx5_2:1,mlx5_3:1"
    assert "NCCL_IB_HCA==mlx5_2,mlx5_3: the RDMA NIC(s) nearest each GPU" in "\n".join(four.reasons)
    assert "UCX_NET_DEVICES=mlx5_2:1,mlx5_3:1: the RDMA NIC(s) nearest each GPU (0000:92:00.0: mlx5_2:1; " \
           "0000:93:00.0: mlx5_2:1; 0000:b2:00.0: mlx5_3:1; 0000:b3:00.0: mlx5_3:1)" in four.reasons


def test_a_gpu_without_an_rdma_nic_near_it_leaves_nccl_to_choose_and_says_so():
    topology = tf.dgx_switches()
    topology["nics"] = [nic for nic in topology["nics"] if nic["numa_node"] == 0]
    result = plan(topology, Request(gpus="0000:12:00.0,0000:92:00.0", engine="trtllm"))
    assert "NCCL_IB_HCA" not in result.env and "UCX_NET_DEVICES" not in result.env
    assert ("NCCL_IB_HCA and UCX_NET_DEVICES left to NCCL and UCX: GPU(s) 0000:92:00.0 have no RDMA NIC on their "
            "node") in "\n".join(result.reasons)


def test_engines_without_nccl_and_hosts_without_rdma_nics_get_no_nic_variable():
    for result in (plan(tf.dgx_switches(), Request(gpus=2, engine="llama.cpp")), plan(tf.dgx_switches(),
                                                                                      Request(gpus=2))):
        assert not {"NCCL_IB_HCA", "UCX_NET_DEVICES"} & set(result.env)
    plain = tf.dgx_switches()
    plain["nics"] = [nic for nic in plain["nics"] if not nic["rdma_name"]]
    result = plan(plain, Request(gpus=2, engine="vllm"))
    assert not {"NCCL_IB_HCA", "UCX_NET_DEVICES"} & set(result.env)
    assert not [reason for reason in result.reasons if "NCCL" in reason or "UCX" in reason]


def test_a_plan_whose_nics_have_no_rdma_device_records_what_it_recorded_before_ports_were_read():
    """No restart on upgrade: the map's NIC entries and the env of such a plan are as they were (no ports key)."""
    plain = tf.dgx_switches()
    plain["nics"] = [nic for nic in plain["nics"] if not nic["rdma_name"]]
    record = plan_record(plan(plain, Request(gpus="0000:b2:00.0", engine="vllm")).to_dict())
    assert record["gpu_map"][0]["nics"] == [
        {"address": "0000:b5:00.0", "name": "eth0", "rdma_name": None, "near": "pcie_switch"}]
    assert not [name for name in record["env"] if name.startswith(("NCCL", "UCX"))]


def test_ucx_names_every_port_of_the_nearest_devices_and_is_left_alone_where_none_shows():
    topology = tf.dgx_switches()
    topology["nics"][0] = tf.make_nic("0000:14:00.0", 0, "ibp00", "mlx5_0", topology["nics"][0]["pci_path"],
                                      port_states=("ACTIVE", "DOWN"))
    result = plan(topology, Request(gpus="0000:12:00.0", engine="vllm"))
    assert result.gpu_map[0]["nics"][0]["ports"] == [1, 2]
    assert result.env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_0:2"  # UCX skips the port that is down
    assert not [reason for reason in result.reasons if "no active port" in reason]
    topology["nics"][0]["rdma_ports"] = []  # an RDMA device whose ports sysfs does not show
    result = plan(topology, Request(gpus="0000:12:00.0", engine="sglang"))
    assert result.env["NCCL_IB_HCA"] == "=mlx5_0" and "UCX_NET_DEVICES" not in result.env
    assert "UCX_NET_DEVICES left to UCX: the RDMA NIC(s) nearest GPU(s) 0000:12:00.0 show no port in sysfs" \
        in result.reasons


@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_a_nearest_rdma_nic_without_an_active_port_is_named_in_a_reason(engine):
    topology = tf.dgx_switches()
    topology["nics"][0] = tf.make_nic("0000:14:00.0", 0, "ibp00", "mlx5_0", topology["nics"][0]["pci_path"],
                                      port_states=("DOWN", "INIT"))
    result = plan(topology, Request(gpus="0000:12:00.0,0000:13:00.0", engine=engine))
    assert ("RDMA NIC mlx5_0 (port 1 DOWN, port 2 INIT), the nearest to GPU(s) 0000:12:00.0, 0000:13:00.0, has no "
            "active port: NCCL and UCX skip it, so their traffic to other hosts takes a farther NIC or none; bring "
            "its link up") in result.reasons
    assert result.env.get("UCX_NET_DEVICES", "mlx5_0:1,mlx5_0:2") == "mlx5_0:1,mlx5_0:2"  # the record stays
    topology["nics"][0]["rdma_ports"][0]["state"] = None  # a state unread: the NIC is not said to be down
    assert not [reason for reason in plan(topology, Request(gpus="0000:12:00.0", engine=engine)).reasons
                if "no active port" in reason]


@pytest.mark.parametrize("ports", [None, "1", [{"port": True}, {"port": "1"}, {"port": 0}, 7]])
def test_facts_ports_of_another_shape_give_ucx_no_name(ports):
    topology = tf.dgx_switches()
    topology["nics"][0]["rdma_ports"] = ports
    result = plan(topology, Request(gpus="0000:12:00.0", engine="trtllm"))
    assert result.gpu_map[0]["nics"][0]["ports"] == [] and "UCX_NET_DEVICES" not in result.env


