"""The real llama-server in the dual-socket lab guest: tokens, threads, and where the weights are.

llama-server mmaps its model, so the weights are page cache. The per-node service maps one
copy per node (page_cache replicate); the trap it avoids is shown on the shared file with
transient units: a second instance on the other node reads remote weights, numa-pin's evict
cannot help while the first instance maps them, and fixes them once nobody does.
Placement is read back from the guest's /proc (numa-pin audit reads numa_maps and every
thread's status), tokens from llama-server's own /completion timings.
"""

import json
import os
import time

import pytest

NUMA_PIN = "/usr/local/bin/numa-pin"
SERVER = "/opt/llama.cpp/bin/llama-server"
SHARED_MODEL = "/srv/models/model.gguf"
BIG_MODEL = "/srv/models/big.gguf"
PER_NODE = {"llama@0": (8080, 0), "llama@1": (8081, 1)}
BIG = ("llama-big@0", 8090)
TOKENS = 8
TOKENS_PER_SECOND = {}


def node_cpus(host, node):
    return host.file("/sys/devices/system/node/node%d/cpulist" % node).content_string.strip()


def wait_ready(host, port, seconds=300):
    result = host.run("for i in $(seq %d); do curl -sf -o /dev/null http://127.0.0.1:%d/health && exit 0; sleep 1; "
                      "done; exit 1" % (seconds, port))
    assert result.rc == 0, "llama-server on port %d never became ready" % port


def completion(host, port):
    """Ask for TOKENS tokens; every weight is read to make them, so afterwards the model is resident."""
    body = json.dumps({"prompt": "The socket link costs", "n_predict": TOKENS, "ignore_eos": True,
                       "cache_prompt": False})
    result = host.run("curl -sf --max-time 600 http://127.0.0.1:%d/completion -d %s" % (port, "'%s'" % body))
    assert result.rc == 0, "no /completion on port %d: %s" % (port, result.stderr)
    answer = json.loads(result.stdout)
    assert answer["tokens_predicted"] == TOKENS and answer["content"], answer
    return answer["timings"]["predicted_per_second"]


def audit(host, unit, plan_json, pages):
    result = host.run("%s audit --unit %s --plan-json %s --pages %s" % (NUMA_PIN, unit, plan_json, pages))
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout)


def file_bytes(report, nodes=None):
    return sum(entry["file_bytes"] for node, entry in report["nodes"].items() if nodes is None or int(node) in nodes)


def model_size(host, path):
    return int(host.run("stat -c %%s %s" % path).stdout)


def maps_of(host, unit):
    pid = host.run("systemctl show -p MainPID --value %s" % unit).stdout.strip()
    return host.file("/proc/%s/maps" % pid).content_string


@pytest.mark.parametrize("unit", sorted(PER_NODE) + [BIG[0]])
def test_completion_returns_tokens(host, unit):
    port = PER_NODE[unit][0] if unit in PER_NODE else BIG[1]
    wait_ready(host, port)
    TOKENS_PER_SECOND[unit] = completion(host, port)


@pytest.mark.parametrize("unit", sorted(PER_NODE))
def test_every_thread_is_on_its_node(host, unit):
    report = audit(host, unit, "/etc/inferops-numa/%s.plan.json" % unit, "all")
    cpus = node_cpus(host, PER_NODE[unit][1])
    process = report["processes"][0]
    assert process["cpus_allowed"] == cpus and process["thread_count"] > 1
    assert not process["threads_outside"], process["threads_outside"]


@pytest.mark.parametrize("unit", sorted(PER_NODE))
def test_each_instance_maps_its_own_local_copy_of_the_model(host, unit):
    node = PER_NODE[unit][1]
    maps = maps_of(host, unit)
    assert "/var/lib/llama/node%d/" % node in maps and SHARED_MODEL not in maps
    report = audit(host, unit, "/etc/inferops-numa/%s.plan.json" % unit, "all")
    assert report["ok"], report["msg"]
    # Anonymous and file pages alike, and the file pages are the whole model (read for the tokens).
    assert report["local_percent"] >= 99 and report["file_local_percent"] >= 99, report["msg"]
    assert file_bytes(report) >= 0.95 * model_size(host, SHARED_MODEL), report["nodes"]


def test_the_oversized_model_is_interleaved(host):
    unit, _port = BIG
    plan = json.loads(host.file("/etc/inferops-numa/%s.plan.json" % unit).content_string)
    assert plan["policy"] == "interleave" and plan["mem_nodes"] == [0, 1]
    report = audit(host, unit, "/etc/inferops-numa/%s.plan.json" % unit, "file")
    assert file_bytes(report) >= 0.95 * model_size(host, BIG_MODEL), report["nodes"]
    for node in (0, 1):
        assert 0.40 <= file_bytes(report, {node}) / float(file_bytes(report)) <= 0.60, report["nodes"]


# --- the page-cache trap, on the shared model file -------------------------------------------------

TRAP_PORTS = {0: 8180, 1: 8181}


def start_on_node(host, node, page_cache):
    """llama-server on the shared model under numa-pin, as a transient unit; its journal and audit."""
    unit = "llama-trap-%d" % node
    host.run("systemctl stop %s.service; systemctl reset-failed %s.service" % (unit, unit))
    request = "--node %d --gpus none --model %s --memory-headroom 64M" % (node, SHARED_MODEL)
    host.run("%s explain %s > /run/%s.plan.json" % (NUMA_PIN, request, unit))
    started = host.run("systemd-run --unit=%s --property=Type=exec %s exec %s --page-cache %s -- "
                       "%s --model %s -t 2 --host 127.0.0.1 --port %d"
                       % (unit, NUMA_PIN, request, page_cache, SERVER, SHARED_MODEL, TRAP_PORTS[node]))
    assert started.rc == 0, started.stderr
    wait_ready(host, TRAP_PORTS[node])
    completion(host, TRAP_PORTS[node])
    return unit


def journal(host, unit):
    return host.run("journalctl -u %s.service --no-pager -o cat" % unit).stdout


def file_local_percent(host, unit):
    report = audit(host, unit + ".service", "/run/%s.plan.json" % unit, "file")
    assert file_bytes(report) >= 0.95 * model_size(host, SHARED_MODEL), report["nodes"]
    return report["file_local_percent"]


def stop(host, *units):
    for unit in units:
        host.run("systemctl stop %s.service" % unit)


def test_a_second_node_mapping_the_shared_file_reads_remote_weights_and_evict_cannot_help(host):
    host.run("dd if=%s iflag=nocache count=0 status=none" % SHARED_MODEL)
    first = start_on_node(host, 0, "evict")
    second = start_on_node(host, 1, "evict")
    try:
        assert file_local_percent(host, first) >= 99
        assert file_local_percent(host, second) <= 1
        first_pid = host.run("systemctl show -p MainPID --value %s" % first).stdout.strip()
        assert "NOT evicted" in journal(host, second) and first_pid in journal(host, second)
    finally:
        stop(host, first, second)


def test_weights_cached_on_the_other_node_stay_remote_without_evict_and_come_local_with_it(host):
    # The previous test left the whole model cached on node 0, unmapped.
    second = start_on_node(host, 1, "ignore")
    try:
        assert file_local_percent(host, second) <= 1
    finally:
        stop(host, second)
    second = start_on_node(host, 1, "evict")
    try:
        assert "dropped" in journal(host, second)
        assert file_local_percent(host, second) >= 99
    finally:
        stop(host, second)


def test_report_tokens_per_second(host):
    assert set(TOKENS_PER_SECOND) == set(PER_NODE) | {BIG[0]}
    lines = ["%-12s %6.1f tokens/s" % (unit, rate) for unit, rate in sorted(TOKENS_PER_SECOND.items())]
    report = "llama-server in the TCG lab guest (%d tokens each):\n%s\n" % (TOKENS, "\n".join(lines))
    print("\n" + report)
    out = os.path.join(os.environ.get("MOLECULE_PROJECT_DIRECTORY", "."), "build", "reports")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "llama-tokens.txt"), "w") as handle:
        handle.write(report)
    assert all(rate > 0 for rate in TOKENS_PER_SECOND.values())
