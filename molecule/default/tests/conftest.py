"""What the lab's checks share: the guest, waits scaled to its speed, and its NUMA layout.

Every wait here polls for the state it needs and gives up only after a budget: a duration measured
on the reference machine, scaled by the calibration labvm.py took at this boot of the guest, times
labvm.BUDGET_MARGIN. No check depends on how fast the emulator happens to be.

A test states the layout it needs (fixtures two_nodes, one_node); switching boots the same disk
with the other topology and runs converge.yml again, as an operator would after a hardware change.
So tests hold in any order; in file order the guest switches once, at the end.
"""

import functools
import json
import os
import shlex
import subprocess
import sys
import time

import pytest

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY",
                         os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__))))))
sys.path.insert(0, os.path.join(PROJECT, "lab"))
import labvm  # noqa: E402  (lab/ is not a package)

VM_NAME = labvm.molecule_vm_name(os.environ.get("MOLECULE_SCENARIO_NAME", "default"), PROJECT)
SCENARIO_DIR = os.environ.get("MOLECULE_SCENARIO_DIRECTORY", os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
NUMA_PIN = "/usr/local/bin/numa-pin"

# Reference durations (seconds on the reference machine) of the steps the checks wait for.
CONVERGE_S = 300          # converge.yml after a topology change: every service re-planned
UNIT_SETTLE_S = 30        # a unit reaching active (or failed) after a start or a boot
COST_REPORT_S = 30        # playbooks/cost_report.yml against the guest
JOURNAL_S = 5             # journald writing what a unit's process printed


def budget(reference_seconds: float) -> float:
    return labvm.budget(VM_NAME, reference_seconds)


# ------------------------------------------------------------------------- each check's budget ---
#
# What each check may take, setup, call and teardown together: seconds on the reference machine, scaled by the
# guest's calibration like every wait (without the margin: this is what it should take, not when to give up).
# A check not named here has CHECK_S. The lab's share of CI's cap is what these add up to; each run writes
# build/reports/lab-checks.txt, the checks nearest their budget first, and `make test` quotes its top.
CHECK_S = 30
CHECK_BUDGETS = {
    # test_containers.py's first check sets up its container services (a converge), its last takes them back (another).
    "test_each_containerized_server_runs_on_its_node_with_its_model_copy_there": 240,
    "test_a_gated_change_of_a_container_service_restarts_one_instance_at_a_time_and_goes_back": 240,
    "test_docker_binds_a_container_by_its_cgroup_cpuset_and_the_audit_finds_it_by_its_id": 240,
    "test_a_placement_change_goes_one_instance_at_a_time_and_stays_only_where_it_is_faster": 540,
    "test_a_pin_mode_systemd_change_rolled_back_restores_the_previous_affinity": 300,
    "test_a_bad_helper_is_stopped_at_the_canary_host": 300,
    "test_a_first_deployment_measures_binding_against_the_unbound_default": 300,
    "test_facts_say_one_node": 240,  # its setup boots the one-node layout and converges again
    "test_facts_say_two_sockets_of_two_nodes_and_far_memory_beside_socket_0": 240,  # the same, sub-NUMA
    "test_site_and_the_fleet_report_from_inside_the_ee_match_the_checkouts_run": 180,
    "test_after_reboot_balancing_stays_off_and_services_return": 150,
    # irqbalance started and its first pass waited out (10 s), a module run in the guest measuring llama@1 before and
    # after, then one rebalance waited out.
    "test_device_interrupts_are_served_on_their_node_and_irqbalance_leaves_them": 90,
    "test_device_interrupts_come_back_when_the_setting_is_removed": 60,
    "test_a_crash_looping_server_fails_its_canary_in_seconds_with_its_journal_and_goes_back": 120,
}
CHECKS_REPORT = os.path.join(PROJECT, "build", "reports", "lab-checks.txt")
_TOOK = {}  # check -> seconds so far


def check_name(nodeid: str) -> str:
    """A check's function name: no module, no host parameter."""
    return nodeid.split("::")[-1].split("[")[0]


def pytest_runtest_logreport(report):
    name = check_name(report.nodeid)
    _TOOK[name] = _TOOK.get(name, 0.0) + report.duration


def budget_rows(took: dict, factor: float) -> list:
    """(took / budget, seconds, budget seconds, check), the nearest to its budget first."""
    rows = [(seconds / (CHECK_BUDGETS.get(name, CHECK_S) * factor), seconds, CHECK_BUDGETS.get(name, CHECK_S) * factor,
             name) for name, seconds in took.items()]
    return sorted(rows, reverse=True)


def pytest_sessionfinish(session):
    if not _TOOK:
        return
    try:
        factor = budget(1.0) / labvm.BUDGET_MARGIN
    except labvm.LabError:  # the guest is gone (a failed boot): the reference machine's seconds
        factor = 1.0
    rows = budget_rows(_TOOK, factor)
    lines = ["%5.2f  %7.1f s of %6.1f s  %s%s" % (ratio, took, allowed, name, "  OVER" if ratio > 1 else "")
             for ratio, took, allowed, name in rows]
    total = sum(row[1] for row in rows)
    allowed = sum(row[2] for row in rows)
    header = "lab checks: %.0f s of %.0f s budgeted (%.2f); %d over budget" % (
        total, allowed, total / allowed, sum(1 for row in rows if row[0] > 1))
    os.makedirs(os.path.dirname(CHECKS_REPORT), exist_ok=True)
    with open(CHECKS_REPORT, "w") as handle:
        handle.write("\n".join([header, "ratio     took     budget   check"] + lines) + "\n")


def wait_until(check, reference_seconds: float, what: str, interval: float = 2.0):
    """Poll check() until it returns a true value, which is returned; fail naming `what`."""
    deadline = time.monotonic() + budget(reference_seconds)
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail("%s: not reached within %.0f s (%s s on the reference machine x calibration x %d)"
                        % (what, budget(reference_seconds), reference_seconds, labvm.BUDGET_MARGIN))
        time.sleep(interval)


def unit_state(host, unit: str) -> str:
    return host.service(unit).systemd_properties["ActiveState"]


def wait_active(host, units):
    """Every unit active; a unit that failed fails the check at once, with its state and journal, instead of
    waiting out the budget."""
    pending = list(units)

    def all_active():
        states = {unit: unit_state(host, unit) for unit in pending}
        failed = [unit for unit, state in states.items() if state == "failed"]
        if failed:
            pytest.fail("%s failed while waiting for it to be active; its journal:\n%s" % (
                failed[0], host.run("journalctl --no-pager -q -n 15 -u %s" % failed[0]).stdout))
        pending[:] = [unit for unit, state in states.items() if state != "active"]
        return not pending
    wait_until(all_active, UNIT_SETTLE_S, "units active (still pending: %s)" % pending)


def node_cpus(host, node: int) -> str:
    return host.file("/sys/devices/system/node/node%d/cpulist" % node).content_string.strip()


def health(host, port: int) -> dict:
    """The stand-in server's own report of its placement."""
    result = host.run("curl -sf --max-time 20 http://127.0.0.1:%d/health" % port)
    assert result.rc == 0, "no /health on port %d: %s" % (port, result.stderr)
    return json.loads(result.stdout)


# The A/B gate of the lab's checks: three rounds, never more: the emulated guest's rounds spread wider than the 5 % cap,
# and the gate would measure up to max_rounds (15) each time; the changes gated are far beyond any band (-80 %,
# +1700 %), and a TCG minute each.
GATE = {"rounds": 3, "max_rounds": 3, "max_tokens": 6, "prompt": "Hi"}

# Every half second, whether each of a pair of instances answers /health: "<time> <0|1> <0|1>" lines in a file.
_POLLER = """
import sys, time, urllib.request
ports = [int(port) for port in sys.argv[2:]]
with open(sys.argv[1], "w", buffering=1) as out:
    while True:
        seen = []
        for port in ports:
            try:
                seen.append(int(urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2).status == 200))
            except Exception:
                seen.append(0)
        out.write("%.1f %s\\n" % (time.time(), " ".join(map(str, seen))))
        time.sleep(0.5)
"""


def start_poller(host, unit: str, log: str, ports) -> None:
    """A transient unit that polls the instances' /health at ``ports`` into ``log`` (read_polls reads it)."""
    host.run("systemctl stop %s; systemctl reset-failed %s" % (unit, unit))
    started = host.run("systemd-run --unit=%s python3 -c %s %s %s" % (unit, shlex.quote(_POLLER), log,
                                                                     " ".join(str(port) for port in ports)))
    assert started.rc == 0, started.stderr


def read_polls(host, unit: str, log: str) -> list:
    """Stop the poller; each poll as [time, seen...] (the seen as "0" or "1")."""
    host.run("systemctl stop %s" % unit)
    return [line.split() for line in host.file(log).content_string.splitlines() if line.strip()]


# An interleaved service's pages are only roughly even: task interleave takes the next node per
# allocation, and a 2 MiB THP or a large page-cache folio is one allocation of 512 pages; a node
# below its low watermark passes the page to the other node (zone_reclaim_mode 0). A policy that
# does not interleave puts (nearly) everything on one node, far outside this.
INTERLEAVED_MIN_SHARE = 0.25


def share(pages: dict, node: int) -> float:
    """The share of ``pages`` ({"N0": bytes}) on ``node``."""
    total = sum(pages.values())
    return pages.get("N%d" % node, 0) / float(total) if total else 0.0


def placement(host, unit: str, pid=None) -> dict:
    """Where the unit's main process (or its process ``pid``) runs and its pages are, read from the guest's /proc here.

    Deliberately not numa-pin's audit code: the lab checks our code with separate code.
    Returns pid, comm, cpus (Cpus_allowed_list), threads ({tid: its Cpus_allowed_list}, every thread of
    /proc/<pid>/task), policies (every numa_maps policy seen) and bytes per node ({"N0": bytes}, each mapping's
    page counts times its kernelpagesize_kB) of three kinds: anon (no file, or only anonymous pages), code (any
    mapping of a file the process maps executable: the server's binary and libraries, one copy per host wherever
    it was first read, so never the service's to place) and file (the rest: the model's page cache).
    """
    pid = str(pid or host.service(unit).systemd_properties["MainPID"])
    assert pid not in ("", "0"), "%s has no main process" % unit
    status = host.file("/proc/%s/status" % pid).content_string
    cpus = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                if line.startswith("Cpus_allowed_list:"))
    images = executable_files(host.file("/proc/%s/maps" % pid).content_string)
    result = {"pid": int(pid), "comm": host.file("/proc/%s/comm" % pid).content_string.strip(), "cpus": cpus,
              "threads": threads(host, pid), "policies": set(), "anon": {}, "file": {}, "code": {}}
    for line in host.file("/proc/%s/numa_maps" % pid).content_string.splitlines():
        words = line.split()
        if len(words) > 2 and words[1] in ("weighted", "prefer"):  # "weighted interleave:0-1", "prefer (many):0-1"
            words[1:3] = [" ".join(words[1:3])]
        if len(words) < 2:
            continue
        result["policies"].add(words[1])
        fields = dict(word.partition("=")[::2] for word in words[2:] if "=" in word)
        counts = {key: int(value) for key, value in fields.items()
                  if key[:1] == "N" and key[1:].isdigit() and value.isdigit()}
        if "file" not in fields or int(fields.get("anon", "0")) >= sum(counts.values()):
            kind = "anon"
        else:
            kind = "code" if fields["file"] in images else "file"
        page_bytes = int(fields.get("kernelpagesize_kB", "4")) * 1024
        for key, count in counts.items():
            result[kind][key] = result[kind].get(key, 0) + count * page_bytes
    return result


def executable_files(maps: str) -> set:
    """The paths a /proc/<pid>/maps text maps with execute permission (fields: range perms offset dev inode path)."""
    return {words[5] for words in (line.split(None, 5) for line in maps.splitlines())
            if len(words) == 6 and "x" in words[1] and words[5].startswith("/")}


def threads(host, pid) -> dict:
    """{tid: Cpus_allowed_list} of every thread of the process, from /proc/<pid>/task/<tid>/status."""
    found = host.run("grep -H '^Cpus_allowed_list:' /proc/%s/task/*/status" % pid)
    assert found.rc == 0, found.stderr
    allowed = {}
    for line in found.stdout.splitlines():
        path, _, value = line.partition(":Cpus_allowed_list:")
        allowed[int(path.split("/")[4])] = value.strip()
    return allowed


def journal(host, unit: str) -> str:
    """The journal of the unit's current run only: earlier runs of the same name say other things."""
    invocation = host.service("%s.service" % unit).systemd_properties["InvocationID"]
    assert invocation, "%s.service has no invocation id" % unit
    return host.run("journalctl _SYSTEMD_INVOCATION_ID=%s --no-pager -o cat" % invocation).stdout


# ------------------------------------------------------------------------- layouts ---

def converge(*extra: str) -> None:
    """converge.yml again, as molecule ran it (same inventory, same configuration), with ``extra`` arguments."""
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    subprocess.run([playbook, "-i", os.environ["MOLECULE_INVENTORY_FILE"],
                    os.path.join(SCENARIO_DIR, "converge.yml")] + list(extra),
                   check=True, timeout=budget(CONVERGE_S), cwd=PROJECT)


# The variables converge.yml gave site.yml, which the checks that converge with one service changed start from.
RUN_VARS = os.path.join(PROJECT, "build", "reports", "lab-run-vars.json")


@functools.lru_cache(maxsize=None)
def run_vars() -> str:
    """RUN_VARS as converge.yml wrote them, read before any converge of a check changed them (every converge writes
    them anew, with its changes in)."""
    with open(RUN_VARS) as handle:
        return handle.read()


def service_entry(service: str, **changes) -> dict:
    """The entry of ``service`` in RUN_VARS, with ``changes``."""
    (entry,) = [entry for entry in json.loads(run_vars())["inference_service_list"] if entry["name"] == service]
    return dict(entry, **changes)


def service_vars(tmp_path, step: str, service: str, **changes) -> str:
    """``-e @FILE`` of RUN_VARS whose service list is ``service``'s entry alone, changed by ``changes``: the file's
    path. The role deploys that service only; the others, unlisted, run on as they are (the role warns about each,
    and takes back only what inference_service_remove names), so a converge spends no module runs on them."""
    return services_vars(tmp_path, step, [service_entry(service, **changes)])


def services_vars(tmp_path, step: str, services: list, **variables) -> str:
    """``-e @FILE`` of RUN_VARS with ``services`` as the service list, and ``variables``: the file's path."""
    path = tmp_path / ("%s.json" % step)
    path.write_text(json.dumps(dict(json.loads(run_vars()), inference_service_list=services, **variables)))
    return "@%s" % path


GATE_VERDICTS = "/etc/inferops-numa/ab-gates.json"


def gate_verdicts(host) -> dict:
    """The host's A/B gate verdicts (unit -> verdict): each run's merged with those of units it did not measure."""
    found = host.file(GATE_VERDICTS)
    return json.loads(found.content_string) if found.exists else {}


def verdicts_since(host, before: dict) -> dict:
    """The verdicts written since ``before`` (gate_verdicts then): the units a converge measured, and no other's
    (another check's service, or this one's from an earlier check, whichever order the checks run in)."""
    return {unit: verdict for unit, verdict in gate_verdicts(host).items() if before.get(unit) != verdict}


def converge_failing(*extra: str) -> str:
    """converge.yml again with ``extra`` arguments, expected to fail; its output (stdout and stderr)."""
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    done = subprocess.run([playbook, "-i", os.environ["MOLECULE_INVENTORY_FILE"],
                           os.path.join(SCENARIO_DIR, "converge.yml")] + list(extra),
                          timeout=budget(CONVERGE_S), cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    assert done.returncode != 0, "converge.yml passed where it was to fail:\n%s" % done.stdout[-3000:]
    return done.stdout


def failed_task_result(output: str, task: str) -> dict:
    """The JSON result ansible-playbook printed for the failure of the task named ``task`` (its header names the
    role first: "TASK [role : task]", then "fatal: [host]: FAILED! => {...}")."""
    header = output.find(" : %s]" % task)
    assert header >= 0, "no task %r in the output:\n%s" % (task, output[-3000:])
    section = output[header:]
    assert "FAILED! => " in section, "task %r did not fail:\n%s" % (task, section[-3000:])
    start = section.index("FAILED! => ") + len("FAILED! => ")
    return json.JSONDecoder().raw_decode(section[start:])[0]


def ensure_layout(numa: int) -> None:
    if labvm.instance(VM_NAME).get("numa") != numa:
        labvm.relayout(VM_NAME, numa)
        converge()


@pytest.fixture
def two_nodes():
    ensure_layout(2)


@pytest.fixture
def one_node():
    ensure_layout(1)
