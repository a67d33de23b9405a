"""The real llama-server in the dual-socket lab guest: tokens, threads, and where the weights are.

llama-server mmaps its model, so the weights are page cache. The per-node service maps one
copy per node (page_cache replicate); the trap it avoids is shown on the shared file with
transient units: a second instance on the other node reads remote weights, numa-pin's evict
cannot help while the first instance maps them, and fixes them once nobody does.
Placement is read back from the guest's /proc by the lab's own parser (conftest.placement: numa_maps
and every thread's status), never by numa-pin's audit, which is what is being checked; tokens from
llama-server's own /completion timings.

One token reads every weight (and llama-server's start-up warm-up already did); each instance
is asked for two, because the first comes from the prompt's pass and only the second is timed
as generation, which gives tokens/s for the report.
"""

import json
import os
import statistics

import pytest

from conftest import (GATE, INTERLEAVED_MIN_SHARE, NUMA_PIN, PROJECT, budget, converge,
                      converge_failing, failed_task_result, gate_verdicts, journal, node_cpus, placement, read_polls,
                      service_entry, service_vars, share, start_poller, verdicts_since, wait_until)

pytestmark = pytest.mark.usefixtures("two_nodes")

SERVER = "/opt/llama.cpp/bin/llama-server"
SHARED_MODEL = "/srv/models/model.gguf"
BIG_MODEL = "/srv/models/big.gguf"
PER_NODE = {"llama@0": (8080, 0), "llama@1": (8081, 1)}
BIG = ("llama-big@0", 8100)
PORTS = {unit: port for unit, (port, _node) in PER_NODE.items()}
PORTS[BIG[0]] = BIG[1]
TOKENS = 2
# Reference durations (seconds on the reference machine).
READY_S = 30              # llama-server from start to /health ok, model mapped and warmed up
COMPLETION_S = 10         # one /completion of TOKENS tokens on the big model


def wait_ready(host, port):
    wait_until(lambda: host.run("curl -sf -o /dev/null --max-time 10 http://127.0.0.1:%d/health" % port).rc == 0,
               READY_S, "llama-server on port %d ready" % port)


def completion(host, port):
    """Ask for TOKENS tokens; returns llama-server's answer (content, tokens_predicted, timings)."""
    wait_ready(host, port)
    body = json.dumps({"prompt": "Hi", "n_predict": TOKENS, "ignore_eos": True, "cache_prompt": False})
    result = host.run("curl -sf --max-time %d http://127.0.0.1:%d/completion -d '%s'"
                      % (budget(COMPLETION_S), port, body))
    assert result.rc == 0, "no /completion on port %d (curl exit %d): %s" % (port, result.rc, result.stderr)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def answers(host):
    """Each deployed instance's answer to one completion, asked once for the whole module."""
    return {unit: completion(host, port) for unit, port in sorted(PORTS.items())}


def local_share(where, node, kind):
    """The share of the process's ``kind`` pages (anon, file, or all: both, the binary and libraries left out) on
    ``node``, from the lab's own parser."""
    pages = dict(where["anon"]) if kind != "file" else {}
    for key, size in (where["file"].items() if kind != "anon" else ()):
        pages[key] = pages.get(key, 0) + size
    return share(pages, node)


def model_size(host, path):
    return host.file(path).size


def maps_of(host, unit):
    pid = host.service(unit).systemd_properties["MainPID"]
    return host.file("/proc/%s/maps" % pid).content_string


@pytest.mark.parametrize("unit", sorted(PORTS))
def test_completion_returns_tokens(answers, unit):
    answer = answers[unit]
    assert answer["tokens_predicted"] == TOKENS and answer["content"], answer


@pytest.mark.parametrize("unit", sorted(PER_NODE))
def test_every_thread_is_on_its_node(host, answers, unit):
    where = placement(host, unit)
    cpus = node_cpus(host, PER_NODE[unit][1])
    assert where["cpus"] == cpus and len(where["threads"]) > 1, where["threads"]
    assert set(where["threads"].values()) == {cpus}, where["threads"]


@pytest.mark.parametrize("unit", sorted(PER_NODE))
def test_the_llama_cpp_recipe_leaves_numa_modes_out(host, answers, unit):
    """engine: llama.cpp adds no --numa: in every mode ggml resets the main thread's affinity to all CPUs
    after each graph (seen here: threads on 0-3 with --numa numactl). Every thread is checked."""
    pid = host.run("systemctl show -p MainPID --value %s" % unit).stdout.strip()
    argv = host.file("/proc/%s/cmdline" % pid).content_string.split("\0")
    assert argv[0] == SERVER and not any(arg.startswith("--numa") for arg in argv), argv


def test_a_llama_cpp_command_with_a_numa_mode_is_refused(host):
    result = host.run("%s exec --engine llama.cpp -- %s --numa numactl" % (NUMA_PIN, SERVER))
    assert result.rc == 2 and "resets its main thread's CPU affinity to all CPUs" in result.stderr, result.stderr


@pytest.mark.parametrize("unit", sorted(PER_NODE))
def test_each_instance_maps_its_own_local_copy_of_the_model(host, answers, unit):
    node = PER_NODE[unit][1]
    maps = maps_of(host, unit)
    assert "/var/lib/llama/node%d/" % node in maps and SHARED_MODEL not in maps
    where = placement(host, unit)
    # Anonymous and file pages alike, and the file pages are the whole model (read for the tokens).
    assert local_share(where, node, "all") >= 0.99 and local_share(where, node, "file") >= 0.99, where
    assert sum(where["file"].values()) >= 0.95 * model_size(host, SHARED_MODEL), where["file"]


def test_the_oversized_model_is_interleaved(host, answers):
    unit, _port = BIG
    plan = json.loads(host.file("/etc/inferops-numa/%s.plan.json" % unit).content_string)
    assert plan["policy"] == "interleave" and plan["mem_nodes"] == [0, 1]
    where = placement(host, unit)
    assert sum(where["file"].values()) >= 0.95 * model_size(host, BIG_MODEL), where["file"]
    for node in (0, 1):
        assert share(where["file"], node) >= INTERLEAVED_MIN_SHARE, where["file"]


def test_report_tokens_per_second(answers):
    rates = {unit: answer["timings"]["predicted_per_second"] for unit, answer in answers.items()}
    lines = ["%-12s %6.1f tokens/s" % (unit, rate) for unit, rate in sorted(rates.items())]
    report = "llama-server in the TCG lab guest (%d tokens each):\n%s\n" % (TOKENS, "\n".join(lines))
    print("\n" + report)
    out = os.path.join(PROJECT, "build", "reports")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "llama-tokens.txt"), "w") as handle:
        handle.write(report)
    assert set(rates) == set(PORTS) and all(rate > 0 for rate in rates.values()), rates


# --- the page-cache trap, on the shared model file -------------------------------------------------

TRAP_PORTS = {0: 8180, 1: 8181}


def start_on_node(host, node, page_cache):
    """llama-server on the shared model under numa-pin, as a transient unit, asked for a token."""
    unit = "llama-trap-%d" % node
    host.run("systemctl stop %s.service; systemctl reset-failed %s.service" % (unit, unit))
    request = "--node %d --gpus none --model %s --memory-headroom 64M" % (node, SHARED_MODEL)
    host.run("%s explain %s > /run/%s.plan.json" % (NUMA_PIN, request, unit))
    started = host.run("systemd-run --unit=%s --property=Type=exec %s exec %s --page-cache %s -- "
                       "%s --model %s -t 2 --host 127.0.0.1 --port %d"
                       % (unit, NUMA_PIN, request, page_cache, SERVER, SHARED_MODEL, TRAP_PORTS[node]))
    assert started.rc == 0, started.stderr
    completion(host, TRAP_PORTS[node])
    return unit


def file_local_percent(host, unit):
    """The share of the model's cached pages the instance maps that are on its plan's node, in percent."""
    (node,) = json.loads(host.file("/run/%s.plan.json" % unit).content_string)["mem_nodes"]
    where = placement(host, unit + ".service")
    assert sum(where["file"].values()) >= 0.95 * model_size(host, SHARED_MODEL), where["file"]
    return 100.0 * share(where["file"], node)


def stop(host, *units):
    for unit in units:
        host.run("systemctl stop %s.service" % unit)


def drop_shared_model_cache(host):
    host.run("dd if=%s iflag=nocache count=0 status=none" % SHARED_MODEL)


def test_a_second_node_mapping_the_shared_file_reads_remote_weights_and_evict_cannot_help(host):
    drop_shared_model_cache(host)
    first = start_on_node(host, 0, "evict")
    second = start_on_node(host, 1, "evict")
    try:
        assert file_local_percent(host, first) >= 99
        assert file_local_percent(host, second) <= 1
        first_pid = host.service(first).systemd_properties["MainPID"]
        assert "NOT evicted" in journal(host, second) and first_pid in journal(host, second)
    finally:
        stop(host, first, second)


def test_weights_cached_on_the_other_node_stay_remote_without_evict_and_come_local_with_it(host):
    # The whole model cached on node 0 and mapped by nobody: a node-0 instance read it, then stopped.
    drop_shared_model_cache(host)
    stop(host, start_on_node(host, 0, "evict"))
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


# --- a placement change: one instance at a time, and kept only where it is faster ---------------------------

def converge_llama(tmp_path, name, **changes):
    """converge.yml with the llama service alone, its entry changed by ``changes`` (conftest.service_vars)."""
    converge("-e", service_vars(tmp_path, name, "llama", **changes))


def squeezed():
    """The llama service's changes that make it slower: one CPU per instance (CPUs 1 and 3 reserved) and four
    threads on it (ggml's threads wait for each other spinning, so a CPU given four of them crawls)."""
    entry = service_entry("llama")
    return {"reserve_cpus": "1,3", "command": ["4" if arg == "{threads}" else arg for arg in entry["command"]]}


def invocations(host):
    return {unit: host.service(unit).systemd_properties["InvocationID"] for unit in sorted(PER_NODE)}


def test_a_placement_change_goes_one_instance_at_a_time_and_stays_only_where_it_is_faster(host, tmp_path):
    start_poller(host, "lab-poll.service", "/run/lab-poll.log", (8080, 8081))
    try:
        # Each instance squeezed onto one CPU, gated: slower, so the change goes back.
        gates_before = gate_verdicts(host)
        converge_llama(tmp_path, "slower", ab_gate=GATE, **squeezed())
        slower = verdicts_since(host, gates_before)
        for unit, (_port, node) in PER_NODE.items():
            assert placement(host, unit)["cpus"] == node_cpus(host, node), "%s not back on its node" % unit
        # The same change without the gate, then back to two CPUs and two threads, gated: faster, so it stays.
        converge_llama(tmp_path, "squeezed", **squeezed())
        assert {placement(host, unit)["cpus"] for unit in PER_NODE} == {"0", "2"}
        gates_before = gate_verdicts(host)
        converge_llama(tmp_path, "faster", ab_gate=GATE)
        faster = verdicts_since(host, gates_before)
        for unit, (_port, node) in PER_NODE.items():
            assert placement(host, unit)["cpus"] == node_cpus(host, node)
        # Nothing changed: nothing restarts, nothing is measured or rolled back.
        before = invocations(host)
        converge_llama(tmp_path, "same", ab_gate=GATE)
        assert invocations(host) == before
        # The change the gate rolled back is not tried again (its files' digests were kept in llama.rejected.json).
        converge_llama(tmp_path, "slower-again", ab_gate=GATE, **squeezed())
        assert invocations(host) == before
        for unit, (_port, node) in PER_NODE.items():
            assert placement(host, unit)["cpus"] == node_cpus(host, node), "%s squeezed again" % unit
    finally:
        polls = read_polls(host, "lab-poll.service", "/run/lab-poll.log")
    report({"squeezed": slower, "unsqueezed": faster}, polls)
    assert all(answered != ["0", "0"] for _time, *answered in polls), "both instances down at once"
    assert {tuple(answered) for _time, *answered in polls} >= {("0", "1"), ("1", "0")}, "a restart never seen"
    assert [verdict["kept"] for verdict in slower.values()] == [False], slower
    assert sorted(faster) == ["llama@0.service", "llama@1.service"], faster
    assert all(verdict["kept"] and verdict["gain_percent"] > 0 for verdict in faster.values()), faster


def test_a_first_deployment_measures_binding_against_the_unbound_default(host, tmp_path):
    # The pair forgotten (stopped, plan records gone): the next deployment is their first.
    forgot = host.run("systemctl stop %s && rm -f /etc/inferops-numa/llama@*.plan.json*" % " ".join(sorted(PER_NODE)))
    assert forgot.rc == 0, forgot.stderr
    since = host.run("date +%s").stdout.strip()
    gates_before = gate_verdicts(host)
    converge_llama(tmp_path, "first", ab_gate=GATE)
    first = verdicts_since(host, gates_before)
    report({"first, unbound -> bound": first}, append=True)
    assert sorted(first) == ["llama@0.service", "llama@1.service"], first
    assert all(verdict["kept"] and verdict["baseline"] == "unbound" for verdict in first.values()), first
    for unit, (_port, node) in PER_NODE.items():
        journal = host.run("journalctl -q -o cat -u %s --since @%s" % (unit, since)).stdout
        assert "A/B gate baseline: affinity and memory policy NOT set" in journal, journal[-2000:]
        assert placement(host, unit)["cpus"] == node_cpus(host, node), "%s not bound after its baseline" % unit
    assert not host.file("/run/systemd/system/llama@0.service.d").exists


def report(found_by_step, polls=None, append=False):
    """Each step's verdicts (and the health polls) in build/reports/ab-gate.txt (or added to it), and printed."""
    lines = ["A/B gate in the TCG lab guest (%d rounds of %d tokens, medians):" % (GATE["rounds"], GATE["max_tokens"])]
    for name, found in found_by_step.items():
        for unit, verdict in sorted(found.items()):
            lines.append("%-24s %-16s %s" % (name, unit, verdict.get("msg")))
    bands = [verdict["noise_percent"] for found in found_by_step.values() for verdict in found.values()
             if "noise_percent" in verdict]
    if bands:
        lines.append("noise band: median %.1f %%, widest %.1f %%" % (statistics.median(bands), max(bands)))
    if polls is not None:
        lines.append("health polls during the changes: %d, with one instance down: %d, with both down: %d" % (
            len(polls), sum(1 for _t, *seen in polls if "0" in seen),
            sum(1 for _t, *seen in polls if seen == ["0", "0"])))
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    out = os.path.join(PROJECT, "build", "reports")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "ab-gate.txt"), "a" if append else "w") as handle:
        handle.write(text)


# --- a change that fails: taken back whole, in seconds, with the reason ---------------------------------------

ROLLOUT_TASK = "Deploy the services' files and start or restart their instances behind their gates"
PENDING = "/etc/inferops-numa/rollout.pending.json"


def llama_entry(**changes):
    return service_entry("llama", **changes)


def converge_llama_failing(tmp_path, name, **changes):
    """converge_llama, expected to fail at the rollout; numa_rollout's result."""
    return failed_task_result(converge_failing("-e", service_vars(tmp_path, name, "llama", **changes)), ROLLOUT_TASK)


def test_a_crash_looping_server_fails_its_canary_in_seconds_with_its_journal_and_goes_back(host, tmp_path):
    """llama-server refuses an argument and exits at once; under Restart=on-failure its unit is never "failed",
    only restarted: the rollout sees the crash loop at its next look and quotes the journal's cause."""
    before = invocations(host)
    result = converge_llama_failing(tmp_path, "crash", command=llama_entry()["command"] + ["--bogus-flag"])
    first = result["instances"][0]
    report_line("crash loop: %s failed after %.1f s: %s" % (first["unit"], first["seconds"], first["msg"]))
    assert first["unit"] == "llama@0.service" and not first["ok"], result["instances"]
    # At its restarts, or after them if systemd's start limit came first on a loaded guest.
    assert "crash-looping" in first["msg"] and "--bogus-flag" in first["msg"], first["msg"]
    assert first["seconds"] < 60, first
    assert first["rolled_back"].startswith("back on its previous unit and plan, ready"), first
    assert result["instances"][1]["skipped"], result["instances"]
    # Back on the judged placement, the record gone; llama@1 never touched.
    assert not host.file(PENDING).exists
    assert invocations(host)["llama@1"] == before["llama@1"]
    for unit, (_port, node) in PER_NODE.items():
        assert placement(host, unit)["cpus"] == node_cpus(host, node)
        assert "--bogus-flag" not in host.file("/proc/%d/cmdline" % placement(host, unit)["pid"]).content_string


def test_a_pin_mode_systemd_change_rolled_back_restores_the_previous_affinity(host, tmp_path):
    """pin_mode systemd keeps the placement in each instance's drop-in: a rollback that put back the unit and
    the plan but not the drop-in would restart the instance on the rejected CPUAffinity=."""
    drop_in = "/etc/systemd/system/llama@0.service.d/50-inferops-numa.conf"
    # The shared model file (no per-node copy in this mode) may be cached on either node: the audit counts anon pages.
    systemd_mode = {"pin_mode": "systemd", "page_cache": "evict", "pages": "anon"}
    try:
        converge_llama(tmp_path, "systemd", **systemd_mode)
        kept = host.file(drop_in).content_string
        assert "CPUAffinity=%s" % node_cpus(host, 0) in kept, kept
        assert placement(host, "llama@0")["cpus"] == node_cpus(host, 0)
        # Instance 0 on CPU 0 alone, and a unit whose start fails: the change is taken back whole.
        result = converge_llama_failing(tmp_path, "systemd-failing", reserve_cpus="1,3",
                                        extra_settings={"ExecStartPre": "/bin/false"}, **systemd_mode)
        first = result["instances"][0]
        report_line("pin_mode systemd rollback: %s; %s" % (first["msg"], first["rolled_back"]))
        assert not first["ok"] and first["rolled_back"].startswith("back on its previous unit and plan, ready")
        assert host.file(drop_in).content_string == kept
        status = host.file("/proc/%d/status" % placement(host, "llama@0")["pid"]).content_string
        assert "Cpus_allowed_list:\t%s\n" % node_cpus(host, 0) in status, status
        assert not host.file(PENDING).exists
    finally:
        converge_llama(tmp_path, "wrapper-again")
    assert not host.file(drop_in).exists


def report_line(line):
    """One line added to build/reports/rollout.txt, and printed."""
    print("\n" + line)
    out = os.path.join(PROJECT, "build", "reports")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rollout.txt"), "a") as handle:
        handle.write(line + "\n")
