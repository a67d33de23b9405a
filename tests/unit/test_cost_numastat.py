"""Remote-allocation counters, perf parsing and the service share, on fake /sys and /proc trees."""


import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.read import numastat
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError


def numastat_text(hit, miss, foreign, interleave, local, other):
    return ("numa_hit %d\nnuma_miss %d\nnuma_foreign %d\ninterleave_hit %d\nlocal_node %d\nother_node %d\n"
            % (hit, miss, foreign, interleave, local, other))


def vmstat_text(hit, miss, local, other):
    return ("nr_free_pages 1000\nnuma_hit %d\nnuma_miss %d\nnuma_foreign %d\nnuma_interleave 7\n"
            "numa_local %d\nnuma_other %d\nnuma_pte_updates 0\n" % (hit, miss, miss, local, other))


def write_host(root, node_counts, vmstat):
    for node, counts in node_counts.items():
        folder = root / "sys/devices/system/node" / ("node%d" % node)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "numastat").write_text(numastat_text(*counts))
    (root / "sys/devices/system/node/possible").write_text("0-1\n")
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/vmstat").write_text(vmstat)


def test_read_counters_per_node_and_host(tmp_path):
    write_host(tmp_path, {0: (10, 1, 2, 3, 9, 2), 1: (20, 0, 1, 0, 15, 5)}, vmstat_text(30, 1, 24, 7))
    counters = numastat.read_counters(str(tmp_path))
    assert counters["nodes"][1] == {"numa_hit": 20, "numa_miss": 0, "numa_foreign": 1, "interleave_hit": 0,
                                    "local_node": 15, "other_node": 5}
    assert counters["vmstat"]["numa_other"] == 7
    assert "nr_free_pages" not in counters["vmstat"]


def test_no_counters_at_all_is_an_error_naming_config_numa(tmp_path):
    with pytest.raises(NumaError, match="CONFIG_NUMA"):
        numastat.read_counters(str(tmp_path))


def test_window_shares_from_two_samples(tmp_path):
    write_host(tmp_path, {0: (100, 0, 0, 0, 100, 0), 1: (50, 0, 0, 0, 50, 0)}, vmstat_text(150, 0, 150, 0))
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        # During the window node 0 got 300 local + 100 remote pages, node 1 nothing.
        write_host(tmp_path, {0: (450, 50, 0, 0, 400, 100), 1: (50, 0, 50, 0, 50, 0)},
                   vmstat_text(500, 50, 450, 100))
    ticks = iter([10.0, 12.0])
    result = numastat.sample(str(tmp_path), 2.0, sleep=sleep, clock=lambda: next(ticks))
    assert sleeps == [2.0]
    assert result["window_seconds"] == 2.0
    node0, node1 = result["nodes"]
    assert node0["allocations"] == 400 and node0["remote_share"] == 0.25
    assert node0["miss_share"] == round(50 / 400, 4)
    assert node1["allocations"] == 0 and node1["remote_share"] is None and node1["numa_foreign"] == 50
    assert result["host"]["remote_share"] == 0.25
    assert "Allocations, not accesses" in result["definition"]


def test_counter_going_backwards_reads_zero_not_negative():
    before = {"nodes": {0: {"local_node": 100, "other_node": 9}}, "vmstat": {}}
    after = {"nodes": {0: {"local_node": 5, "other_node": 10}}, "vmstat": {}}
    entry = numastat.remote_ratio(before, after, 1.0)["nodes"][0]
    assert entry["local_node"] == 0 and entry["other_node"] == 1 and entry["remote_share"] == 1.0


@pytest.mark.parametrize("window", [0, -1, True, "1"])
def test_window_must_be_positive(tmp_path, window):
    write_host(tmp_path, {0: (1, 0, 0, 0, 1, 0)}, vmstat_text(1, 0, 1, 0))
    with pytest.raises(NumaError, match="window_seconds"):
        numastat.sample(str(tmp_path), window, sleep=lambda s: None)


# --- perf ---------------------------------------------------------------------------------------------

def test_perf_counts_give_the_remote_load_share():
    text = "1000,,node-loads,2000000,100.00,,\n250,,node-load-misses,2000000,100.00,,\n"
    assert numastat.parse_perf(text, 0) == {"available": True, "node_loads": 1000, "node_load_misses": 250,
                                            "remote_load_share": 0.25}


def test_perf_not_supported_in_a_vm_says_so():
    text = "<not supported>,,node-load-misses,0,100.00,,\n<not supported>,,node-loads,0,100.00,,\n"
    result = numastat.parse_perf(text, 0)
    assert result == {"available": False,
                      "reason": "perf reports <not supported> for node-load-misses here: this CPU or VM has "
                                "no such counter"}


def test_perf_refused_points_at_paranoid_setting():
    result = numastat.parse_perf("Error:\nNo permission to enable node-loads event.\n", 255)
    assert not result["available"]
    assert "perf_event_paranoid" in result["reason"] and "Error:" in result["reason"]


def test_perf_missing_is_unavailable_not_an_error():
    assert numastat.start_perf([1], 1.0, which=lambda name: None)["reason"].startswith("perf is not installed")


def test_perf_command_watches_every_pid_for_the_window():
    assert numastat.perf_command([10, 11], 2.5) == ["perf", "stat", "-x", ",", "-e", "node-loads,node-load-misses",
                                                    "-p", "10,11", "--", "sleep", "2.5"]


# --- the service --------------------------------------------------------------------------------------

def fake_audit(remote_percent, msg="PID(s) 42: 1 GiB resident, 75.00% on node(s) 0"):
    seen = []

    def audit_pids(root, pids, plan):
        seen.append((root, list(pids), plan))
        return {"remote_percent": remote_percent, "expected_mem_nodes": [0] if plan else None,
                "resident_bytes": 1 << 30, "nodes": {"0": {"anon_pages": 3}}, "msg": msg}
    return audit_pids, seen


def test_collect_window_service_share_and_perf_together(tmp_path):
    write_host(tmp_path, {0: (1, 0, 0, 0, 1, 0)}, vmstat_text(1, 0, 1, 0))
    (tmp_path / "proc/42").mkdir()
    audit_pids, seen = fake_audit(25.0)
    result = numastat.collect(str(tmp_path), 1.0, pids=[42], plan={"mem_nodes": [0]}, sleep=lambda s: None,
                              audit_pids=audit_pids)
    assert seen == [(str(tmp_path), [42], {"mem_nodes": [0]})]
    assert result["service"]["off_plan_share"] == 0.25
    assert result["service"]["plan_nodes"] == [0]
    # perf only watches live processes; a replayed tree says so.
    assert result["perf"] == {"available": False, "reason": "perf counts live processes; root is %s" % tmp_path}


def test_collect_by_unit_uses_the_units_pids_and_starts_perf_on_them(tmp_path, monkeypatch):
    write_host(tmp_path, {0: (1, 0, 0, 0, 1, 0)}, vmstat_text(1, 0, 1, 0))
    monkeypatch.setattr(numastat.systemctl, "unit_pids", lambda root, props: [7, 8] if props["MainPID"] == "7" else [])
    started = []

    def perf_start(pids, window):
        started.append((list(pids), window))
        return {"available": True, "node_loads": 10, "node_load_misses": 1, "remote_load_share": 0.1}
    audit_pids, seen = fake_audit(None)
    result = numastat.collect("/", 0.01, unit="llama.service", show_unit=lambda unit: {"MainPID": "7"},
                              perf_start=perf_start, audit_pids=audit_pids)
    assert started == [([7, 8], 0.01)]
    assert seen[0][1] == [7, 8]
    assert result["perf"]["remote_load_share"] == 0.1
    assert result["service"]["unit"] == "llama.service"
    assert result["service"]["summary"].startswith("unit llama.service: PID(s) 42")
    assert "pass the service's plan" in result["service"]["summary"]
    assert result["service"]["off_plan_share"] is None


def test_collect_without_a_service_says_perf_needs_one(tmp_path):
    write_host(tmp_path, {0: (1, 0, 0, 0, 1, 0)}, vmstat_text(1, 0, 1, 0))
    result = numastat.collect(str(tmp_path), 1.0, sleep=lambda s: None)
    assert "service" not in result
    assert "pass pids or unit" in result["perf"]["reason"]


def test_collect_refuses_unknown_pid_and_both_selectors(tmp_path):
    write_host(tmp_path, {0: (1, 0, 0, 0, 1, 0)}, vmstat_text(1, 0, 1, 0))
    with pytest.raises(NumaError, match="no process 99"):
        numastat.collect(str(tmp_path), 1.0, pids=[99], sleep=lambda s: None)
    with pytest.raises(NumaError, match="not both"):
        numastat.collect(str(tmp_path), 1.0, pids=[1], unit="x.service", sleep=lambda s: None)


def test_collect_unit_without_processes_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(numastat.systemctl, "unit_pids", lambda root, props: [])
    with pytest.raises(NumaError, match="no running process"):
        numastat.collect(str(tmp_path), 1.0, unit="dead.service", show_unit=lambda unit: {})
