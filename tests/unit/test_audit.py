"""numa_audit: numa_maps parsing, fake /proc trees, unit lookup and waiting, the module, and this process."""

import json
import math
import os
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.read import audit, systemctl
from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import judging
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.modules import numa_audit

from tests.ansible_compat import patch_module_args

PAGE = 4096
MIB = 1024 * 1024

# Captured-looking numa_maps of a llama-server bound to node 1 whose model file
# was first read by the node-0 instance (the page-cache trap).
TRAPPED_MAPS = """\
55d4c1a00000 bind:1 file=/opt/llama/bin/llama-server mapped=120 mapmax=2 N1=120 kernelpagesize_kB=4
55d4c1b78000 bind:1 file=/opt/llama/bin/llama-server anon=3 dirty=3 mapped=10 N1=10 kernelpagesize_kB=4
55d4c3c2e000 bind:1 heap anon=2048 dirty=2048 active=0 N1=2048 kernelpagesize_kB=4
7f3a10000000 bind:1 anon=65536 dirty=65536 active=0 N1=65536 kernelpagesize_kB=4
7f3a20000000 bind:1 file=/models/m.gguf mapped=8455 mapmax=2 N0=8455 kernelpagesize_kB=4
7f3a30000000 bind:1 file=/anon_hugepage\\040(deleted) huge anon=4 dirty=4 N1=4 kernelpagesize_kB=2048
7f3a40000000 bind:1
7f3a50000000 bind:1 file=/usr/lib/x86_64-linux-gnu/libc.so.6
7ffc8a1e0000 bind:1 stack anon=33 dirty=33 N1=33 kernelpagesize_kB=4
"""


# /proc/<pid>/maps of the same process: only the program text is executable.
TRAPPED_EXEC = "55d4c1a00000-55d4c1b78000 r-xp 00000000 08:01 1234 /opt/llama/bin/llama-server\n"
TRAPPED_MAPS_TEXT = TRAPPED_EXEC + (
    "55d4c1b78000-55d4c1b82000 rw-p 00178000 08:01 1234 /opt/llama/bin/llama-server\n"
    "7f3a20000000-7f3a22105000 r--s 00000000 08:01 99 /models/m.gguf\n")


def stat_line(tid, name, cpu):
    # Fields 3.. of /proc/<pid>/stat: state, then 35 numbers up to "processor" (field 39), then a few more.
    rest = ["S"] + ["0"] * 35 + [str(cpu)] + ["0"] * 13
    return "%d (%s) %s\n" % (tid, name, " ".join(rest))


def write_process(root, pid, maps, threads, name="llama-server", rss_kb=1000, maps_text=TRAPPED_MAPS_TEXT):
    """threads: [(tid, cpus_allowed_list, last_cpu)]; maps: numa_maps text; maps_text: maps text."""
    base = os.path.join(str(root), "proc", str(pid))
    os.makedirs(base, exist_ok=True)
    first = threads[0][1]
    with open(os.path.join(base, "status"), "w") as handle:
        handle.write("Name:\t%s\nPid:\t%d\nVmRSS:\t   %d kB\nCpus_allowed_list:\t%s\nMems_allowed_list:\t0-1\n"
                     % (name, pid, rss_kb, first))
    with open(os.path.join(base, "numa_maps"), "w") as handle:
        handle.write(maps)
    with open(os.path.join(base, "maps"), "w") as handle:
        handle.write(maps_text)
    for tid, cpus, cpu in threads:
        task = os.path.join(base, "task", str(tid))
        os.makedirs(task, exist_ok=True)
        with open(os.path.join(task, "status"), "w") as handle:
            handle.write("Name:\t%s\nCpus_allowed_list:\t%s\nMems_allowed_list:\t0-1\n" % (name, cpus))
        with open(os.path.join(task, "stat"), "w") as handle:
            handle.write(stat_line(tid, name, cpu))


BIND1 = {"policy": "bind", "mem_nodes": [1], "cpulist": "2-3"}


# --- numa_maps lines ----------------------------------------------------------------------------

def test_anonymous_bound_line():
    line = audit.parse_numa_maps_line(
        "7f3a10000000 bind:1 anon=2048 dirty=2048 active=0 N1=2048 kernelpagesize_kB=4")
    assert line == audit.MapsLine("bind:1", "anon", 4096, {1: 2048})


def test_file_line_counts_as_file():
    line = audit.parse_numa_maps_line("7f3a2 bind:1 file=/models/m.gguf mapped=8455 N0=8455 kernelpagesize_kB=4")
    assert line.kind == "file"
    assert line.pages == {0: 8455}


def test_hugetlb_pages_are_counted_in_their_own_size():
    line = audit.parse_numa_maps_line(
        "7f3a3 default file=/anon_hugepage\\040(deleted) huge anon=4 dirty=4 N0=3 N1=1 kernelpagesize_kB=2048")
    assert line.kind == "anon"  # every resident page is anonymous
    assert line.page_bytes == 2 * MIB
    assert audit.node_bytes([line]) == {0: {"anon": 6 * MIB, "file": 0, "code": 0},
                                        1: {"anon": 2 * MIB, "file": 0, "code": 0}}


def test_heap_and_stack_are_anonymous():
    heap = audit.parse_numa_maps_line("55d4 default heap anon=7 dirty=7 N0=7 kernelpagesize_kB=4")
    stack = audit.parse_numa_maps_line("7ffc default stack anon=3 dirty=3 N0=3 kernelpagesize_kB=4")
    assert (heap.kind, heap.policy, stack.kind) == ("anon", "default", "anon")


def test_line_without_resident_pages_is_skipped():
    assert audit.parse_numa_maps_line("7f3a4 bind:1") is None
    assert audit.parse_numa_maps_line("7f3a5 default file=/usr/lib/libc.so.6") is None
    assert audit.parse_numa_maps_line("") is None


def test_private_file_mapping_with_some_cow_pages_stays_file():
    line = audit.parse_numa_maps_line("55d4 default file=/bin/x anon=3 dirty=3 mapped=10 N1=10 kernelpagesize_kB=4")
    assert line.kind == "file"


def test_policy_with_spaces_and_flags_is_kept_whole():
    many = audit.parse_numa_maps_line("7f00 prefer (many):0-1 anon=5 dirty=5 N0=5 kernelpagesize_kB=4")
    weighted = audit.parse_numa_maps_line("7f01 weighted interleave:0-1 anon=4 N0=2 N1=2 kernelpagesize_kB=4")
    static = audit.parse_numa_maps_line("7f02 bind=static:1 anon=1 N1=1 kernelpagesize_kB=4")
    assert (many.policy, weighted.policy, static.policy) == (
        "prefer (many):0-1", "weighted interleave:0-1", "bind=static:1")


def test_resident_line_without_page_size_is_an_error():
    with pytest.raises(NumaError, match="kernelpagesize_kB"):
        audit.parse_numa_maps_line("7f00 default anon=1 N0=1")


def test_every_mapping_of_a_program_image_is_code_a_model_is_file():
    starts = audit.executable_starts(TRAPPED_MAPS_TEXT)
    assert starts == {0x55d4c1a00000, 0x55d4c1b78000}
    text = audit.parse_numa_maps_line(TRAPPED_MAPS.splitlines()[0], starts)
    data = audit.parse_numa_maps_line(TRAPPED_MAPS.splitlines()[1], starts)
    model = audit.parse_numa_maps_line(TRAPPED_MAPS.splitlines()[4], starts)
    jit = audit.parse_numa_maps_line("55d4c1a00000 default anon=3 N0=3 kernelpagesize_kB=4", starts)
    assert (text.kind, data.kind, model.kind, jit.kind) == ("code", "code", "file", "anon")


def test_whole_trapped_file_sums_per_node_and_kind():
    lines = audit.parse_numa_maps(TRAPPED_MAPS, audit.executable_starts(TRAPPED_MAPS_TEXT))
    assert len(lines) == 7
    assert audit.node_bytes(lines) == {
        0: {"anon": 0, "file": 8455 * PAGE, "code": 0},
        1: {"anon": (2048 + 65536 + 33) * PAGE + 4 * 2 * MIB, "file": 0, "code": 130 * PAGE},
    }
    assert audit.policy_bytes(lines) == {"bind:1": (120 + 10 + 2048 + 65536 + 8455 + 33) * PAGE + 8 * MIB}


def test_last_cpu_survives_a_name_with_spaces_and_parens():
    assert audit.last_cpu(stat_line(7, "llama (srv) x", 5)) == 5
    assert audit.last_cpu("garbage") is None


# --- judging a fake /proc tree -----------------------------------------------------------------

def test_page_cache_trap_fails_with_the_numbers(tmp_path):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2), (4243, "2-3", 3)])
    report = audit.audit_pids(str(tmp_path), [4242], BIND1, page_size=PAGE)
    local = (2048 + 65536 + 33) * PAGE + 8 * MIB  # anonymous; the binary's 130 pages are code
    expected = round(100.0 * local / (local + 8455 * PAGE), 2)
    assert report["ok"] is False
    assert report["local_percent"] == expected
    assert report["remote_percent"] == round(100 - expected, 2)
    assert report["anon_local_percent"] == 100.0
    assert report["file_local_percent"] == 0.0  # the whole model sits on node 0
    assert report["code_local_percent"] == 100.0
    assert report["nodes"]["0"] == {"anon_bytes": 0, "file_bytes": 8455 * PAGE, "code_bytes": 0,
                                    "anon_pages": 0, "file_pages": 8455, "code_pages": 0}
    assert report["nodes"]["1"]["anon_pages"] == (2048 + 65536 + 33) + 4 * 512
    assert report["resident_bytes"] == local + 130 * PAGE + 8455 * PAGE
    assert "%.2f%% of anon + file on node(s) 1" % expected in report["msg"]
    assert "33.03 MiB on node 0 (anon 0 B, file 33.03 MiB)" in report["msg"]  # 8455 pages
    assert "below min_local_percent 99" in report["msg"]


def test_shared_program_text_on_another_node_does_not_fail_the_instance(tmp_path):
    # The second instance maps the binary the first one loaded on node 0.
    maps = ("55d4c1a00000 bind:1 file=/opt/llama/bin/llama-server mapped=5000 mapmax=2 N0=5000 kernelpagesize_kB=4\n"
            "7f3a10000000 bind:1 anon=65536 dirty=65536 N1=65536 kernelpagesize_kB=4\n")
    write_process(tmp_path, 4242, maps, [(4242, "2-3", 2)])
    report = audit.audit_pids(str(tmp_path), [4242], BIND1, page_size=PAGE)
    assert report["ok"] is True
    assert report["local_percent"] == 100.0
    assert report["code_local_percent"] == 0.0
    assert report["nodes"]["0"]["code_pages"] == 5000
    assert "code 0.00%, not counted" in report["msg"]
    assert report["processes"][0]["threads_outside"] == []


def test_anon_only_selection_accepts_remote_page_cache(tmp_path):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    report = audit.audit_pids(str(tmp_path), [4242], BIND1, pages="anon", page_size=PAGE)
    assert report["ok"] is True
    assert report["local_percent"] == 100.0


def test_threshold_is_configurable(tmp_path):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    assert audit.audit_pids(str(tmp_path), [4242], BIND1, min_local_percent=50, page_size=PAGE)["ok"] is True


def test_thread_allowed_outside_its_cpus_fails(tmp_path):
    maps = "7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n"
    write_process(tmp_path, 4242, maps, [(4242, "2-3", 2), (4250, "0-3", 3), (4251, "2-3", 0)])
    report = audit.audit_pids(str(tmp_path), [4242], BIND1, page_size=PAGE)
    outside = report["processes"][0]["threads_outside"]
    assert [t["tid"] for t in outside] == [4250, 4251]  # mask too wide; last ran on CPU 0
    assert report["ok"] is False
    assert "thread 4250 (llama-server) may run on CPUs 0-3" in report["msg"]
    assert "last on CPU 0" in report["msg"]


def test_threads_last_seen_off_the_plans_cpus_are_counted_and_the_metrics_share_is_theirs(tmp_path):
    """Of four threads one last ran on CPU 0 (its mask too wide, as a straggler's is) and one on CPU 1 within a mask
    of the plan's CPUs (a race after its mask was narrowed): two of four off the plan; none without a plan."""
    from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import metrics

    maps = "7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n"
    write_process(tmp_path, 4242, maps, [(4242, "2-3", 2), (4250, "0-3", 0), (4251, "2-3", 1), (4252, "2-3", 3)])
    report = audit.audit_pids(str(tmp_path), [4242], BIND1, page_size=PAGE)
    assert report["processes"][0]["threads_off_plan"] == 2
    assert metrics.off_plan_ratio(report["processes"]) == 0.5
    unplanned = audit.audit_pids(str(tmp_path), [4242], None, page_size=PAGE)
    assert unplanned["processes"][0]["threads_off_plan"] is None
    assert metrics.off_plan_ratio(unplanned["processes"]) is None


def test_preferred_plan_reports_without_failing(tmp_path):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    report = audit.audit_pids(str(tmp_path), [4242], dict(BIND1, policy="preferred"), page_size=PAGE)
    assert report["ok"] is True
    assert report["local_percent"] < 99


def test_interleave_reports_the_spread_over_its_set(tmp_path):
    maps = "7f00 interleave:0-1 anon=400 N0=300 N1=100 kernelpagesize_kB=4\n"
    write_process(tmp_path, 9, maps, [(9, "0-3", 1)])
    plan = {"policy": "interleave", "mem_nodes": [0, 1], "cpus": [0, 1, 2, 3]}
    report = audit.audit_pids(str(tmp_path), [9], plan, page_size=PAGE)
    assert report["interleave_percent"] == {"0": 75.0, "1": 25.0}
    assert report["local_percent"] == 100.0
    assert "node 0 75.00%" in report["msg"]


def test_without_a_plan_it_only_reports(tmp_path):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "0-3", 0)])
    report = audit.audit_pids(str(tmp_path), [4242], None, page_size=PAGE)
    assert report["ok"] is True
    assert report["local_percent"] is None
    assert report["expected_mem_nodes"] is None
    assert report["resident_bytes"] == sum(
        n["anon_bytes"] + n["file_bytes"] + n["code_bytes"] for n in report["nodes"].values())


def test_several_processes_add_up(tmp_path):
    write_process(tmp_path, 10, "7f00 bind:1 anon=100 N1=100 kernelpagesize_kB=4\n", [(10, "2-3", 2)])
    write_process(tmp_path, 11, "7f00 bind:1 anon=5 N0=5 kernelpagesize_kB=4\n", [(11, "2-3", 3)])
    report = audit.audit_pids(str(tmp_path), [10, 11], BIND1, page_size=PAGE)
    assert report["local_percent"] == round(100 * 100 / 105, 2)
    assert [p["local_percent"] for p in report["processes"]] == [100.0, 0.0]
    assert report["ok"] is False


def test_missing_pid_is_an_error(tmp_path):
    with pytest.raises(NumaError, match="no process 77"):
        audit.audit_pids(str(tmp_path), [77], BIND1)


def test_plan_with_cpu_list_or_cpus():
    assert audit.expectation({"policy": "bind", "mem_nodes": [1], "cpulist": "2-3,8"}).cpus == [2, 3, 8]
    assert audit.expectation({"policy": "bind", "mem_nodes": ["1"], "cpus": [3, 2]}) == audit.Expectation(
        "bind", [1], [2, 3])
    with pytest.raises(NumaError, match="not a mapping"):
        audit.expectation("bind:1")


# --- nothing to audit never passes ------------------------------------------------------------------

def write_memoryless(root, pid, state="S", flags=0x208040, name="kworker/0:1", rss=False):
    """A process as procfs shows one without memory: no VmRSS, empty maps; stat with state and flags."""
    base = os.path.join(str(root), "proc", str(pid))
    os.makedirs(os.path.join(base, "task", str(pid)), exist_ok=True)
    status = "Name:\t%s\nPid:\t%d\n%sCpus_allowed_list:\t2-3\nMems_allowed_list:\t0-1\n" % (
        name, pid, "VmRSS:\t  0 kB\n" if rss else "")
    stat = "%d (%s) %s %s\n" % (pid, name, state, " ".join(["0"] * 5 + [str(flags)] + ["0"] * 43))
    for folder in (base, os.path.join(base, "task", str(pid))):
        for file_name, text in (("status", status), ("stat", stat)):
            with open(os.path.join(folder, file_name), "w") as handle:
                handle.write(text)
    for file_name in ("numa_maps", "maps"):
        with open(os.path.join(base, file_name), "w") as handle:
            handle.write("")


@pytest.mark.parametrize("plan", [None, BIND1], ids=["without a plan", "bind plan"])
@pytest.mark.parametrize("state, flags, rss, reason", [
    ("S", 0x208040, False, "PID 77 (kworker/0:1) is a kernel thread (PF_KTHREAD in /proc/77/stat)"),
    ("Z", 0x400000, False, "PID 77 (kworker/0:1) is a zombie (state Z in /proc/77/stat)"),
    ("X", 0x400000, False, "is a zombie (state X"),
    ("S", 0x400000, False, "PID 77 (kworker/0:1) has no memory map (no VmRSS in /proc/77/status)"),
])
def test_a_process_without_memory_fails_the_audit_naming_why(tmp_path, plan, state, flags, rss, reason):
    write_memoryless(tmp_path, 77, state, flags, rss=rss)
    report = audit.audit_pids(str(tmp_path), [77], plan, page_size=PAGE)
    assert report["ok"] is False
    assert reason in report["msg"] and reason in report["processes"][0]["without_memory"]
    assert report["resident_bytes"] == 0


def test_a_live_process_has_memory_of_its_own(tmp_path):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    assert audit.audit_pids(str(tmp_path), [4242], None, page_size=PAGE)["processes"][0]["without_memory"] is None


def test_a_bind_plan_with_nothing_resident_fails(tmp_path):
    write_process(tmp_path, 4242, "7f00 bind:1\n", [(4242, "2-3", 2)])
    report = audit.audit_pids(str(tmp_path), [4242], BIND1, page_size=PAGE)
    assert report["ok"] is False and report["local_percent"] is None
    assert "no anon + file memory is resident: nothing to hold to the bind plan" in report["msg"]


def test_a_page_selection_with_nothing_in_it_fails_a_bind_plan(tmp_path):
    write_process(tmp_path, 4242, "7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n", [(4242, "2-3", 2)])
    report = audit.audit_pids(str(tmp_path), [4242], BIND1, pages="file", page_size=PAGE)
    assert report["ok"] is False and "no file memory is resident" in report["msg"]
    assert audit.audit_pids(str(tmp_path), [4242], BIND1, pages="anon", page_size=PAGE)["ok"] is True


def test_an_unreaped_child_in_a_unit_is_left_out_with_a_warning(tmp_path):
    write_cgroup(tmp_path, {"": [4242, 4300]})
    write_process(tmp_path, 4242, "7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n", [(4242, "2-3", 2)])
    write_memoryless(tmp_path, 4300, "Z", name="worker")
    clock = FakeClock()
    report = audit.audit_unit(str(tmp_path), "llama@1.service", BIND1, run=FakeSystemd(props()), page_size=PAGE,
                              settle_seconds=0, clock=clock, sleep=clock.sleep)
    assert report["ok"] is True and [p["pid"] for p in report["processes"]] == [4242]
    assert report["warnings"] == ["llama@1.service: left out of the audit: PID 4300 (worker) is a zombie (state Z "
                                  "in /proc/4300/stat): it has exited and its memory is freed; audit a running "
                                  "process of the service"]


def test_a_unit_with_only_a_zombie_fails(tmp_path):
    write_cgroup(tmp_path, {"": [4300]})
    write_memoryless(tmp_path, 4300, "Z", name="llama-server")
    clock = FakeClock()
    with pytest.raises(NumaError, match="unit llama@1.service has no running process to audit"):
        audit.audit_unit(str(tmp_path), "llama@1.service", BIND1, run=FakeSystemd(props(pid=4300)), page_size=PAGE,
                         clock=clock, sleep=clock.sleep)


def test_a_real_kernel_thread_fails_the_audit():
    try:
        with open("/proc/2/stat") as handle:
            flags = int(handle.read().rpartition(")")[2].split()[6])
    except (OSError, ValueError, IndexError):
        flags = 0
    if not flags & audit.PF_KTHREAD:
        pytest.skip("PID 2 is not a kernel thread here (a PID namespace)")
    report = audit.audit_pids("/", [2], {"policy": "bind", "mem_nodes": [0], "cpus": [0]})
    assert report["ok"] is False and "is a kernel thread (PF_KTHREAD in /proc/2/stat)" in report["msg"]


# --- every number is range-checked ------------------------------------------------------------------

@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), -0.5, 100.5, 200, "99", True, None],
                         ids=repr)
def test_min_local_percent_must_be_a_finite_percentage(tmp_path, threshold):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    with pytest.raises(NumaError, match="min_local_percent .* is not a percentage from 0 to 100"):
        audit.audit_pids(str(tmp_path), [4242], BIND1, min_local_percent=threshold, page_size=PAGE)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.one_of(st.floats(), st.integers()))
def test_a_threshold_is_taken_exactly_when_it_is_a_finite_percentage(threshold):
    valid = not math.isnan(threshold) and 0 <= threshold <= 100
    try:
        judging.check(threshold, "all")
    except NumaError as error:
        assert not valid and "\n" not in str(error)
        return
    assert valid


@pytest.mark.parametrize("name, seconds", [
    ("wait_seconds", float("nan")), ("wait_seconds", float("inf")), ("wait_seconds", -1),
    ("wait_seconds", 86401), ("wait_seconds", 10 ** 400), ("settle_seconds", float("nan")), ("settle_seconds", -3),
], ids=repr)
def test_a_wait_that_could_never_end_is_refused_before_any_look(tmp_path, name, seconds):
    clock = FakeClock()
    systemd = FakeSystemd(props())
    with pytest.raises(NumaError, match="%s .* is not a number of seconds from 0 to 86400" % name):
        audit.audit_unit(str(tmp_path), "llama@1.service", BIND1, run=systemd, clock=clock, sleep=clock.sleep,
                         **{name: seconds})
    assert systemd.calls == [] and clock.now == 0


@pytest.mark.parametrize("pids, message", [
    ([0], "PID 0 is not a process ID (1 to 4194304)"),
    ([-4242], "PID -4242 is not a process ID"),
    ([4194305], "PID 4194305 is not a process ID"),
    ([10 ** 5000], "PID (a 16610-bit number) is not a process ID"),
    (["4242"], "PID '4242' is not a process ID"),
    ([True], "PID True is not a process ID"),
    ([4242, 4242], "PID 4242 is given twice: list each process once"),
], ids=["zero", "negative", "past PID_MAX_LIMIT", "huge", "text", "bool", "twice"])
def test_pids_must_be_process_ids_given_once(tmp_path, pids, message):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    with pytest.raises(NumaError) as error:
        audit.audit_pids(str(tmp_path), pids, BIND1, page_size=PAGE)
    assert message in str(error.value)


def test_numa_pin_audit_refuses_nonsense_numbers_in_one_line(capsys):
    for argv in (["audit", "--pid", "1", "--min-local-percent", "nan"], ["audit", "--pid", "0"],
                 ["audit", "--unit", "x.service", "--wait-seconds", "inf"]):
        assert numa_pin.main(argv) == numa_pin.EXIT_BAD_REQUEST
        err = capsys.readouterr().err
        assert err.startswith("numa-pin: ") and err.count("\n") == 1 and "Traceback" not in err


# --- a systemd unit --------------------------------------------------------------------------------

class FakeSystemd:
    """Answers `systemctl show` from a list of property snapshots, one per call (the last repeats)."""

    def __init__(self, *snapshots):
        self.snapshots = list(snapshots)
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        props = self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]
        return 0, "".join("%s=%s\n" % item for item in props.items()), ""


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def props(state="active", pid=4242, load="loaded"):
    return {"LoadState": load, "ActiveState": state, "SubState": "running" if state == "active" else "start",
            "Result": "success", "MainPID": str(pid), "ControlGroup": "/system.slice/system-llama.slice/llama@1.service"}


def write_cgroup(root, pids_by_dir):
    base = os.path.join(str(root), "sys", "fs", "cgroup", "system.slice", "system-llama.slice", "llama@1.service")
    for sub, pids in pids_by_dir.items():
        directory = os.path.join(base, sub)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "cgroup.procs"), "w") as handle:
            handle.write("".join("%d\n" % pid for pid in pids))


def test_unit_pids_come_from_the_cgroup_and_its_children(tmp_path):
    write_cgroup(tmp_path, {"": [4242], "worker": [4300, 4301]})
    assert systemctl.unit_pids(str(tmp_path), props()) == [4242, 4300, 4301]


def test_unit_pids_fall_back_to_main_pid(tmp_path):
    assert systemctl.unit_pids(str(tmp_path), props(pid=55)) == [55]
    assert systemctl.unit_pids(str(tmp_path), props(pid=0)) == []


def test_unit_audit_waits_for_active_and_settled_memory(tmp_path):
    write_cgroup(tmp_path, {"": [4242]})
    write_process(tmp_path, 4242, "7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n", [(4242, "2-3", 2)])
    clock = FakeClock()
    systemd = FakeSystemd(props("activating", 0), props("activating", 0), props())
    report = audit.audit_unit(str(tmp_path), "llama@1.service", BIND1, wait_seconds=60, settle_seconds=3,
                              run=systemd, page_size=PAGE, clock=clock, sleep=clock.sleep)
    assert report["ok"] is True
    assert report["unit"] == "llama@1.service"
    assert report["msg"].startswith("llama@1.service: PID(s) 4242:")
    # two polls while activating, then RSS must hold still for 3 s of 1 s polls
    assert 5 <= clock.now <= 7
    assert systemd.calls[0][:2] == ["systemctl", "show"]
    assert systemd.calls[0][-1] == "llama@1.service"


def test_growing_memory_is_waited_for_then_audited_with_a_warning(tmp_path, monkeypatch):
    write_cgroup(tmp_path, {"": [4242]})
    write_process(tmp_path, 4242, "7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n", [(4242, "2-3", 2)])
    clock = FakeClock()
    monkeypatch.setattr(audit, "_rss_kb", lambda root, pid: int(1000 + 100 * clock.now))
    report = audit.audit_unit(str(tmp_path), "llama@1.service", BIND1, wait_seconds=10, settle_seconds=3,
                              run=FakeSystemd(props()), page_size=PAGE, clock=clock, sleep=clock.sleep)
    assert clock.now == 10
    assert report["warnings"] == ["unit llama@1.service: memory of PID 4242 was still growing after 10s; "
                                  "audited a service that may still be loading (raise wait_seconds)"]


class FakeSystemdPerUnit:
    """`systemctl show UNIT` answered per unit (the unit is argv's last word)."""

    def __init__(self, props_by_unit):
        self.props_by_unit = props_by_unit

    def __call__(self, argv):
        return 0, "".join("%s=%s\n" % item for item in self.props_by_unit[argv[-1]].items()), ""


def test_several_units_settle_in_the_same_seconds_and_each_is_judged_alone(tmp_path):
    write_cgroup(tmp_path, {"": [4242]})
    write_process(tmp_path, 4242, "7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n", [(4242, "2-3", 2)])
    clock = FakeClock()
    run = FakeSystemdPerUnit({"llama@1.service": props(), "llama@2.service": props(),
                              "gone@0.service": props(load="not-found"),
                              "down@0.service": dict(props("failed", 0), SubState="failed")})
    entries = [audit.UnitAudit("llama@1.service", BIND1, 99.0, "all"),
               audit.UnitAudit("gone@0.service", None, 99.0, "all"),
               audit.UnitAudit("llama@2.service", dict(BIND1, mem_nodes=[0]), 99.0, "anon"),
               audit.UnitAudit("down@0.service", BIND1, 99.0, "all")]
    reports = audit.audit_units(str(tmp_path), entries, wait_seconds=30, settle_seconds=3, run=run,
                                page_size=PAGE, clock=clock, sleep=clock.sleep)
    assert [report["unit"] for report in reports] == [entry.unit for entry in entries]
    assert [report["ok"] for report in reports] == [True, False, False, False]
    assert "not loaded" in reports[1]["msg"] and "below min_local_percent" in reports[2]["msg"]
    assert "not running after 30s" in reports[3]["msg"]
    # the two live units settled together: one settle period, not two; the dead one ran to the deadline
    assert clock.now == 30


def test_live_units_alone_are_done_after_one_settle_period(tmp_path):
    write_cgroup(tmp_path, {"": [4242]})
    write_process(tmp_path, 4242, "7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n", [(4242, "2-3", 2)])
    clock = FakeClock()
    run = FakeSystemdPerUnit(dict(("llama@%d.service" % i, props()) for i in range(4)))
    audit.audit_units(str(tmp_path), [audit.UnitAudit("llama@%d.service" % i, BIND1, 99.0, "all") for i in range(4)],
                      wait_seconds=60, settle_seconds=3, run=run, page_size=PAGE, clock=clock, sleep=clock.sleep)
    assert 3 <= clock.now <= 4


def test_unit_that_never_starts_fails_at_the_deadline_with_its_state(tmp_path):
    clock = FakeClock()
    with pytest.raises(NumaError) as caught:
        audit.audit_unit(str(tmp_path), "llama@1.service", BIND1, wait_seconds=5, run=FakeSystemd(
            dict(props("failed", 0), SubState="failed", Result="exit-code")), clock=clock, sleep=clock.sleep)
    assert clock.now == 5
    message = str(caught.value)
    assert "ActiveState=failed, SubState=failed, Result=exit-code" in message
    assert "journalctl -u llama@1.service" in message


def test_unknown_unit_fails_at_once(tmp_path):
    clock = FakeClock()
    with pytest.raises(NumaError, match="not loaded .LoadState=not-found."):
        audit.audit_unit(str(tmp_path), "nope@1.service", None, wait_seconds=60,
                         run=FakeSystemd(props(load="not-found")), clock=clock, sleep=clock.sleep)
    assert clock.now == 0


def test_failing_systemctl_is_reported():
    with pytest.raises(NumaError, match=r"failed \(rc 1\): Failed to connect to bus"):
        systemctl.show_unit("x.service", lambda argv: (1, "", "Failed to connect to bus\n"))


# --- the module --------------------------------------------------------------------------------------

def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            numa_audit.main()
    return json.loads(capsys.readouterr().out)


def test_module_fails_with_the_whole_report(tmp_path, trusted_dir, capsys):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    plan_file = pathlib.Path(trusted_dir, "llama@1.plan.json")
    plan_file.write_text(json.dumps(BIND1))
    result = run_module({"pids": [4242], "plan_file": str(plan_file), "root": str(tmp_path)}, capsys)
    assert result["failed"] is True
    assert "below min_local_percent 99" in result["msg"]
    assert result["nodes"]["0"]["file_pages"] == 8455 * PAGE // os.sysconf("SC_PAGE_SIZE")
    assert result["expected_mem_nodes"] == [1]


def test_module_passes_and_changes_nothing(tmp_path, capsys):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    result = run_module({"pids": [4242], "plan": BIND1, "pages": "anon", "root": str(tmp_path),
                         "_ansible_check_mode": True}, capsys)
    assert result.get("failed") is not True
    assert result["changed"] is False
    assert result["ok"] is True


def test_module_names_a_missing_plan_file(tmp_path, trusted_dir, capsys):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    result = run_module({"pids": [4242], "plan_file": os.path.join(trusted_dir, "absent.json"), "root": str(tmp_path)},
                        capsys)
    assert result["failed"] is True
    assert "does not exist: deploy the service with the inference_service role" in result["msg"]


def test_unreadable_plan_file_names_the_file_and_the_fix(trusted_dir):
    with pytest.raises(NumaError, match="plan file .*missing.json does not exist: .*numa-pin explain"):
        audit.load_plan(os.path.join(trusted_dir, "missing.json"))
    broken = pathlib.Path(trusted_dir, "broken.json")
    broken.write_text("{")
    with pytest.raises(NumaError, match="broken.json: not a JSON object .*numa-pin explain"):
        audit.load_plan(str(broken))
    bad = pathlib.Path(trusted_dir, "list.json")
    bad.write_text("[1]")
    with pytest.raises(NumaError, match="not a JSON object"):
        audit.load_plan(str(bad))


# --- the plan file is read as every plan record is: its verdict decides rollbacks -----------------------


def test_a_plan_file_root_can_trust_is_read(trusted_dir):
    path = pathlib.Path(trusted_dir, "llama@1.plan.json")
    path.write_text(json.dumps(BIND1))
    os.chmod(str(path), 0o644)
    assert audit.load_plan(str(path)) == BIND1


def test_a_symlinked_plan_file_is_refused_not_followed(trusted_dir):
    target = pathlib.Path(trusted_dir, "elsewhere.json")
    target.write_text(json.dumps(BIND1))
    link = pathlib.Path(trusted_dir, "llama@1.plan.json")
    link.symlink_to(target)
    with pytest.raises(NumaError, match=r"^cannot open .*llama@1\.plan\.json \(.*\): it must be a regular file, not a "
                                        r"symbolic link; deploy the service with the inference_service role") as caught:
        audit.load_plan(str(link))
    assert "\n" not in str(caught.value)


def test_a_plan_file_in_a_linked_directory_is_refused(trusted_dir):
    real = pathlib.Path(trusted_dir, "plans")
    real.mkdir(mode=0o755)
    (real / "llama@1.plan.json").write_text(json.dumps(BIND1))
    pathlib.Path(trusted_dir, "link").symlink_to(real)
    with pytest.raises(NumaError, match="refusing the plan directory .*link: it is a symbolic link"):
        audit.load_plan(os.path.join(trusted_dir, "link", "llama@1.plan.json"))


@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_a_plan_file_others_may_write_is_refused(trusted_dir, mode):
    path = pathlib.Path(trusted_dir, "llama@1.plan.json")
    path.write_text(json.dumps(BIND1))
    os.chmod(str(path), mode)
    with pytest.raises(NumaError, match=r"^ignoring .*llama@1\.plan\.json \(uid \d+, mode 0%o\): only a regular file "
                                        r"that root alone may write is trusted; chown root and chmod go-w it, or "
                                        r"deploy the service" % mode):
        audit.load_plan(str(path))


def test_a_plan_file_in_a_directory_others_may_write_is_refused(trusted_dir):
    shared = pathlib.Path(trusted_dir, "shared")
    shared.mkdir()
    os.chmod(str(shared), 0o777)
    (shared / "llama@1.plan.json").write_text(json.dumps(BIND1))
    with pytest.raises(NumaError, match=r"refusing the plan directory .*shared: it \(mode 0777\) may be written by "
                                        r"its group or others.*chmod go-w"):
        audit.load_plan(str(shared / "llama@1.plan.json"))


def test_an_oversized_plan_file_is_refused_unparsed(trusted_dir):
    path = pathlib.Path(trusted_dir, "llama@1.plan.json")
    path.write_text(json.dumps(dict(BIND1, padding=" " * (1 << 20))))
    with pytest.raises(NumaError, match=r"^ignoring .*llama@1\.plan\.json: not a JSON object of at most 1048576 bytes "
                                        r"in UTF-8; deploy the service"):
        audit.load_plan(str(path))


def test_a_plan_file_of_another_shape_is_refused(trusted_dir):
    path = pathlib.Path(trusted_dir, "llama@1.plan.json")
    path.write_text(json.dumps(dict(BIND1, mem_nodes=["1"])))
    with pytest.raises(NumaError, match=r"^refusing the plan file .*llama@1\.plan\.json: mem_nodes \['1'\] is not a "
                                        r"list of ids from 0 to \d+; deploy the service"):
        audit.load_plan(str(path))


def test_a_relative_plan_file_is_the_working_directorys(trusted_dir, monkeypatch):
    pathlib.Path(trusted_dir, "plan.json").write_text(json.dumps(BIND1))
    monkeypatch.chdir(trusted_dir)
    assert audit.load_plan("plan.json") == BIND1


def test_module_wants_unit_or_pids(capsys):
    result = run_module({"unit": "x.service", "pids": [1]}, capsys)
    assert "mutually exclusive" in result["msg"]


def _fake_audit_units(outcomes, seen):
    def audit_units(root, audits, wait_seconds, settle_seconds, run):
        seen.extend((entry.unit, entry.plan, entry.min_local_percent, entry.pages, wait_seconds) for entry in audits)
        return [{"unit": entry.unit, "ok": outcomes[entry.unit], "warnings": [],
                 "msg": "%s: %s" % (entry.unit, "fine" if outcomes[entry.unit] else "12.00% local, below 99")}
                for entry in audits]
    return audit_units


def test_module_audits_several_units_in_one_run_and_names_each_failure(trusted_dir, capsys, monkeypatch):
    plan_file = pathlib.Path(trusted_dir, "a@0.plan.json")
    plan_file.write_text(json.dumps(BIND1))
    seen = []
    monkeypatch.setattr(numa_audit, "audit_units", _fake_audit_units(
        {"a@0.service": True, "b@0.service": False, "c@0.service": True}, seen))
    result = run_module({"units": [
        {"unit": "a@0.service", "plan_file": str(plan_file)},
        {"unit": "c@0.service", "plan_file": os.path.join(trusted_dir, "absent.json")},
        {"unit": "b@0.service", "pages": "anon", "min_local_percent": 90},
    ], "wait_seconds": 7}, capsys)
    assert result["failed"] is True and result["ok"] is False
    assert [report["unit"] for report in result["units"]] == ["a@0.service", "c@0.service", "b@0.service"]
    assert [report["ok"] for report in result["units"]] == [True, False, False]
    assert "b@0.service: 12.00% local" in result["msg"] and "absent.json does not exist" in result["msg"]
    # c's plan file is missing, so it is not audited at all; the others get their own settings
    assert seen == [("a@0.service", BIND1, 99.0, "all", 7), ("b@0.service", None, 90.0, "anon", 7)]


def test_module_passes_when_every_unit_passes(capsys, monkeypatch):
    monkeypatch.setattr(numa_audit, "audit_units", _fake_audit_units({"a@0.service": True, "a@1.service": True}, []))
    result = run_module({"units": [{"unit": "a@0.service"}, {"unit": "a@1.service"}]}, capsys)
    assert result.get("failed") is not True and result["ok"] is True and result["changed"] is False
    assert result["msg"] == "2 unit(s) audited, all ok"


def test_module_refuses_a_unit_listed_twice(capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(numa_audit, "audit_units", _fake_audit_units({"a@0.service": True}, seen))
    result = run_module({"units": [{"unit": "a@0.service"}, {"unit": "a@0.service", "pages": "anon"}]}, capsys)
    assert result["failed"] is True and "a@0.service more than once" in result["msg"] and seen == []


@pytest.mark.parametrize("args, message", [
    ({"pids": [4242], "min_local_percent": 200}, "min_local_percent 200.0 is not a percentage"),
    ({"pids": [4242], "min_local_percent": "nan"}, "min_local_percent nan is not a percentage"),
    ({"pids": [0]}, "PID 0 is not a process ID"),
    ({"unit": "a@0.service", "wait_seconds": -1}, "wait_seconds -1 is not a number of seconds"),
    ({"units": [{"unit": "a@0.service", "min_local_percent": "inf"}]}, "min_local_percent inf is not a percentage"),
    ({"units": [{"unit": "a@0.service"}], "settle_seconds": "nan"}, "settle_seconds nan is not a number"),
], ids=["percent 200", "percent nan", "pid 0", "negative wait", "units percent inf", "units settle nan"])
def test_module_fails_nonsense_numbers_with_one_message(tmp_path, capsys, args, message):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    result = run_module(dict(args, root=str(tmp_path)), capsys)
    assert result["failed"] is True and message in result["msg"]


def test_module_refuses_units_beside_one_plan(capsys):
    result = run_module({"units": [{"unit": "a@0.service"}], "plan": BIND1}, capsys)
    assert "mutually exclusive" in result["msg"]


# --- the real thing: this very process on this host ----------------------------------------------

def test_auditing_this_process_on_this_host():
    node_dir = "/sys/devices/system/node"
    nodes = [n for n in os.listdir(node_dir) if n.startswith("node")] if os.path.isdir(node_dir) else ["node0"]
    if nodes != ["node0"]:
        pytest.skip("this check expects a one-node host")
    cpus = sorted(os.sched_getaffinity(0))
    report = audit.audit_pids("/", [os.getpid()], {"policy": "bind", "mem_nodes": [0], "cpus": cpus})
    assert report["ok"] is True, report["msg"]
    assert report["local_percent"] == 100.0
    process = report["processes"][0]
    assert process["thread_count"] >= 1
    assert set(process["nodes"]) == {"0"}
    assert process["nodes"]["0"]["anon_bytes"] > 0 and process["nodes"]["0"]["file_bytes"] > 0
    # numa_maps and the kernel's own RSS accounting agree (allocations in between aside)
    with open("/proc/self/smaps_rollup") as handle:
        rss = dict(line.split(":", 1) for line in handle if line.startswith("Rss"))
    rss_bytes = int(rss["Rss"].split()[0]) * 1024
    assert abs(report["resident_bytes"] - rss_bytes) < 0.1 * rss_bytes


def test_cli_entry_point_takes_pids_or_a_unit(tmp_path):
    write_process(tmp_path, 4242, TRAPPED_MAPS, [(4242, "2-3", 2)])
    report = audit.audit_service(pids=[4242], plan=BIND1, root=str(tmp_path))
    assert report["ok"] is False and report["expected_mem_nodes"] == [1]
    with pytest.raises(NumaError, match="not both"):
        audit.audit_service(pids=[1], unit="x.service")
    with pytest.raises(NumaError, match="not neither"):
        audit.audit_service()


def test_module_audits_every_deployed_instance_as_its_service_was_deployed(trusted_dir, capsys, monkeypatch):
    for name, content in (("a@0.plan.json", BIND1), ("a@1.plan.json", BIND1), ("b@0.plan.json", BIND1),
                          ("a.audit.json", {"min_local_percent": 90, "pages": "anon", "audit": True,
                                            "on_drift": "none"}),
                          ("b.audit.json", {"audit": False})):
        with open(os.path.join(trusted_dir, name), "w") as handle:
            json.dump(content, handle)
    seen = []
    outcomes = {"a@0.service": True, "a@1.service": False}
    monkeypatch.setattr(numa_audit, "audit_units", _fake_audit_units(outcomes, seen))
    result = run_module({"plan_dir": trusted_dir, "wait_seconds": 0}, capsys)
    assert result["failed"] is True
    assert [report["unit"] for report in result["units"]] == ["a@0.service", "a@1.service"]
    # b is deployed with audit false; a's instances are judged by a.audit.json, against their records.
    assert [(unit, plan["mem_nodes"], percent, pages) for unit, plan, percent, pages, _wait in seen] == [
        ("a@0.service", [1], 90, "anon"), ("a@1.service", [1], 90, "anon")]


def test_module_returns_the_placement_table_of_what_it_audited_with_the_gates_rates(trusted_dir, capsys,
                                                                                      monkeypatch):
    for name, content in (("a@0.plan.json", dict(BIND1, threads=2, port=8080)), ("a@1.plan.json", BIND1),
                          ("ab-gates.json", {"a@0.service": {"kept": True, "gain_percent": 50.0,
                                                             "before_tokens_per_second": 8.0,
                                                             "after_tokens_per_second": 12.0}})):
        with open(os.path.join(trusted_dir, name), "w") as handle:
            json.dump(content, handle)
    monkeypatch.setattr(numa_audit, "audit_units", _fake_audit_units({"a@0.service": True, "a@1.service": False}, []))
    result = run_module({"plan_dir": trusted_dir, "wait_seconds": 0}, capsys)
    # Returned with the failure too, so a failed --tags audit shows where each instance runs.
    assert result["failed"] is True
    assert [line.split() for line in result["table"]] == [
        ["instance", "node(s)", "cpus", "policy", "threads", "local", "pages", "model", "pages", "local", "port",
         "tokens/s"],
        ["a@0", "1", "2-3", "bind", "2", "-", "-", "8080", "12.0"],
        ["a@1", "1", "2-3", "bind", "-", "-", "-", "-", "-"]]


def test_module_with_nothing_deployed_says_so_and_passes(trusted_dir, capsys):
    result = run_module({"plan_dir": os.path.join(trusted_dir, "absent")}, capsys)
    assert result.get("failed") is not True and result["units"] == [] and result["table"] == []
    assert result["msg"] == "no instance to audit: none recorded in %s" % os.path.join(trusted_dir, "absent")


def write_weights(root, weights):
    directory = root / "sys/kernel/mm/mempolicy/weighted_interleave"
    directory.mkdir(parents=True)
    for node, weight in weights.items():
        (directory / ("node%d" % node)).write_text("%d\n" % weight)


WEIGHTED = {"policy": "weighted-interleave", "mem_nodes": [0, 1, 4], "cpus": [0, 1]}


@pytest.mark.parametrize("pages, ok", [((400, 400, 200), True), ((440, 380, 180), True),
                                       ((334, 333, 333), False), ((500, 500, 0), False)])
def test_weighted_interleave_passes_within_the_band_of_its_weights(tmp_path, pages, ok):
    maps = "7f00 weighted interleave:0-1,4 anon=1000 N0=%d N1=%d N4=%d kernelpagesize_kB=4\n" % pages
    write_process(tmp_path, 9, maps, [(9, "0-1", 1)])
    write_weights(tmp_path, {0: 2, 1: 2, 4: 1})
    report = audit.audit_pids(str(tmp_path), [9], WEIGHTED, page_size=PAGE)
    assert report["interleave_weight_percent"] == {"0": 40.0, "1": 40.0, "4": 20.0}
    assert report["ok"] is ok, report["msg"]
    assert ("off its weights by more than 10 points" in report["msg"]) is not ok
    assert "weights' shares node 0 40.0%" in report["msg"]


def test_weighted_interleave_without_readable_weights_only_reports_the_spread(tmp_path):
    maps = "7f00 weighted interleave:0-1,4 anon=1000 N0=500 N1=500 kernelpagesize_kB=4\n"
    write_process(tmp_path, 9, maps, [(9, "0-1", 1)])
    report = audit.audit_pids(str(tmp_path), [9], WEIGHTED, page_size=PAGE)
    assert report["ok"] is True and report["interleave_weight_percent"] is None
    assert report["interleave_percent"] == {"0": 50.0, "1": 50.0, "4": 0.0}


# --- exact boundaries of the verdict (tests/mutants.py) ---------------------------------------------

def _raw(node_bytes):
    """One process's reading as read_process gives it: ``node_bytes`` is node -> (anon, file, code) bytes."""
    return {"pid": 4242, "name": "llama-server", "cpus_allowed": "0-3", "mems_allowed": "0-1", "threads": [],
            "policies": {}, "without_memory": None,
            "node_bytes": {node: {"anon": anon, "file": file, "code": code}
                           for node, (anon, file, code) in node_bytes.items()}}


BIND_NODE0 = audit.Expectation("bind", [0], [])


@pytest.mark.parametrize("local, remote, threshold, ok", [
    (9900, 100, 99, True),     # 99.00 % at 99: passes (the share is compared with >=)
    (9899, 101, 99, False),    # 98.99 %: fails
    (9896, 104, 99, False),    # 98.96 %: fails (the share is rounded to hundredths, not tenths)
    (9950, 50, 99, True),      # above: passes
    (5000, 5000, 50, True),    # 50.00 % at 50
    (0, 10000, 0, True),       # nothing local passes a threshold of 0
    (10000, 0, 100, True),     # everything local passes 100
    (9999, 1, 100, False),     # 99.99 % does not
])
def test_a_share_at_the_threshold_passes_and_a_hundredth_below_fails(local, remote, threshold, ok):
    report = audit.judge([_raw({0: (local, 0, 0), 1: (remote, 0, 0)})], BIND_NODE0, threshold, "all", PAGE)
    assert report["local_percent"] == round(100.0 * local / (local + remote), 2)
    assert report["ok"] is ok
    if not ok:
        assert "%.2f%% of the anon + file memory is on node(s) 0, below min_local_percent %s" % (
            report["local_percent"], threshold) in report["msg"]


@pytest.mark.parametrize("pages, share, ok", [("all", 50.0, False), ("anon", 100.0, True), ("file", 0.0, False)])
def test_pages_all_counts_anon_and_file_memory(pages, share, ok):
    report = audit.judge([_raw({0: (3000, 0, 500), 1: (0, 3000, 0)})], BIND_NODE0, 99, pages, PAGE)
    assert (report["local_percent"], report["ok"]) == (share, ok)
    assert report["code_local_percent"] == 100.0


@pytest.mark.parametrize("policy", ["preferred", "interleave", "weighted-interleave"])
def test_only_a_bind_plan_is_held_to_the_threshold(policy):
    report = audit.judge([_raw({0: (1000, 0, 0), 1: (9000, 0, 0)})], audit.Expectation(policy, [0], []), 99,
                         "all", PAGE)
    assert (report["local_percent"], report["ok"]) == (10.0, True)
    bound = audit.judge([_raw({0: (1000, 0, 0), 1: (9000, 0, 0)})], BIND_NODE0, 99, "all", PAGE)
    assert bound["ok"] is False


@pytest.mark.parametrize("on_node0, ok", [(6000, True), (4000, True), (6001, False), (3999, False)])
def test_a_weighted_split_exactly_at_the_band_passes_and_past_it_fails(on_node0, ok):
    # Weights 1:1 want 50 % each; the band is 10 points: 60.00 % passes, 60.01 % does not.
    expect = audit.Expectation("weighted-interleave", [0, 1], [], {0: 1, 1: 1})
    report = audit.judge([_raw({0: (on_node0, 0, 0), 1: (10000 - on_node0, 0, 0)})], expect, 99, "all", PAGE)
    assert report["interleave_weight_percent"] == {"0": 50.0, "1": 50.0}
    assert report["ok"] is ok
    assert ("the weighted-interleave split is off its weights by more than 10 points" in report["msg"]) is not ok


@pytest.mark.parametrize("allowed, last, ok", [("0-1", 1, True), ("0-1", None, True), ("0-1", 2, False),
                                               ("0-2", 1, False), ("1", 0, True)])
def test_a_thread_allowed_or_last_seen_outside_the_plans_cpus_fails_the_audit(allowed, last, ok):
    raw = _raw({0: (4096, 0, 0)})
    raw["threads"] = [{"tid": 4243, "name": "worker", "cpus_allowed": allowed, "mems_allowed": "0", "last_cpu": last}]
    report = audit.judge([raw], audit.Expectation("bind", [0], [0, 1]), 99, "all", PAGE)
    assert report["ok"] is ok
    assert ("PID 4242 thread 4243 (worker) may run on CPUs %s (last on CPU %s), outside the plan's 0-1"
            % (allowed, last) in report["msg"]) is not ok
