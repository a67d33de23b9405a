"""numa-pin metrics: the snapshot of fake and real hosts, its Prometheus text checked by promtool, files written
as root, and drift acted on at most once per interval."""

import json
import os
import shutil
import stat

import pytest
from hypothesis import strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.system import kernel
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import drift, exposition, metrics
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import systemctl
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read

from tests.fixtures import sysfs
from tests.unit.test_audit import PAGE, TRAPPED_MAPS, write_process

PACKAGE_PARENT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "plugins", "module_utils")
BIND1 = {"policy": "bind", "mem_nodes": [1], "cpulist": "40-79,120-159", "node": 1}
LOCAL_MAPS = "7f00 bind:1 anon=2048 dirty=2048 N1=2048 kernelpagesize_kB=4\n"


def samples(text):
    """{(name, frozenset(labels)): value} of a rendered text, by a reader of the format written here."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        pairs = frozenset()
        if labels:
            pairs = frozenset(tuple(part.split("=", 1)) for part in labels.rstrip("}").split('",'))
            pairs = frozenset((key, item.strip('"')) for key, item in pairs)
        found[(name, pairs)] = float(value)
    return found


def value(text, name, **labels):
    matches = [v for (n, pairs), v in samples(text).items()
               if n == name and set((key, str(item)) for key, item in labels.items()) <= set(pairs)]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


class Systemd:
    """`systemctl show UNIT...` answered from properties per unit; every other command recorded and answered ok."""

    def __init__(self, props_by_unit):
        self.props_by_unit = props_by_unit
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[:2] != ["systemctl", "show"]:
            return 0, "", ""
        units = argv[argv.index("--") + 1:]
        return 0, "\n".join("Id=%s\n" % unit + "".join("%s=%s\n" % item for item in self.props_by_unit[unit].items())
                            for unit in units), ""


def active(pid):
    return {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
            "MainPID": str(pid), "ControlGroup": ""}


def write_json(path, data, mode=0o644):
    with open(path, "w") as handle:
        json.dump(data, handle)
    os.chmod(path, mode)


@pytest.fixture(scope="module")
def machine_root(tmp_path_factory):
    """A dual-socket machine under a root, running a llama instance on its node and one in the page-cache trap."""
    root = sysfs.dual_socket_gpus().write(str(tmp_path_factory.mktemp("machine")))
    for node in (0, 1):
        with open(os.path.join(root, "sys/devices/system/node/node%d/numastat" % node), "w") as handle:
            handle.write("numa_hit %d\nnuma_miss 7\nnuma_foreign 3\ninterleave_hit 11\nlocal_node 90\nother_node 5\n"
                         % (1000 + node))
    write_process(root, 4242, LOCAL_MAPS, [(4242, "40-79,120-159", 41)])
    write_process(root, 4343, TRAPPED_MAPS, [(4343, "40-79,120-159", 41), (4344, "0-159", 3)])
    return root


@pytest.fixture
def host(machine_root, trusted_dir):
    """The machine, with a plan dir holding its two llama instances and a stopped one."""
    plans = os.path.join(trusted_dir, "plans")
    os.mkdir(plans, 0o755)
    write_json(os.path.join(plans, "llama@0.plan.json"), BIND1)
    write_json(os.path.join(plans, "llama@1.plan.json"), BIND1)
    write_json(os.path.join(plans, "down@0.plan.json"), dict(BIND1, policy="interleave", mem_nodes=[0, 1]))
    write_json(os.path.join(plans, "llama.audit.json"), {"min_local_percent": 99, "pages": "all",
                                                         "on_drift": "restart", "audit": True})
    run = Systemd({"llama@0.service": active(4242), "llama@1.service": active(4343),
                   "down@0.service": dict(active(0), ActiveState="failed")})
    return machine_root, plans, run


def snapshot_of(host, clock=lambda: 1000.0):
    root, plans, run = host
    return metrics.collect(root, plans, run, page_size=PAGE, clock=clock)


def test_each_recorded_instance_is_measured_against_its_plan(host):
    snap = snapshot_of(host)
    by_unit = dict((entry["unit"], entry) for entry in snap["instances"])
    assert sorted(by_unit) == ["down@0.service", "llama@0.service", "llama@1.service"]
    good, trapped, down = by_unit["llama@0.service"], by_unit["llama@1.service"], by_unit["down@0.service"]
    assert good["up"] and good["local_ratio"] == {"anon": 1.0, "file": None, "judged": 1.0}
    assert good["drift"] is False and good["affinity_match"] is True and good["on_drift"] == "restart"
    # The trapped instance: its model's page cache on node 0, one thread allowed everywhere.
    assert trapped["local_ratio"]["anon"] == 1.0 and trapped["local_ratio"]["file"] == 0.0
    assert trapped["remote_bytes"] == {"anon": 0, "file": 8455 * PAGE}
    assert trapped["drift"] is True and trapped["affinity_match"] is False
    assert trapped["remote_nodes"] == {"0": {"anon_bytes": 0, "file_bytes": 8455 * PAGE}}
    assert down["up"] is False and down["drift"] is False and down["nodes"] == "0-1"
    assert down["on_drift"] == "none" and down["min_local_percent"] == 99.0  # no audit settings: the defaults
    assert "not running" in down["message"]


def test_one_systemctl_call_for_every_unit(host):
    snapshot_of(host)
    assert len(host[2].calls) == 1 and host[2].calls[0][-3:] == ["down@0.service", "llama@0.service",
                                                                 "llama@1.service"]


def test_host_state_is_read_from_the_kernel_files(host):
    snap = snapshot_of(host)
    assert snap["host"]["numa_balancing"] == 1 and snap["host"]["node_count"] == 2
    node1 = snap["host"]["nodes"][1]
    assert (node1["cpus"], node1["gpus"]) == (80, 2)
    assert node1["memory_free_bytes"] == 180 * 1024 ** 3 and node1["counters"]["numa_hit"] == 1001


def test_plan_age_is_the_record_files_age(host):
    plans = host[1]
    os.utime(os.path.join(plans, "llama@0.plan.json"), (900, 900))
    entry = snapshot_of(host, clock=lambda: 1000.0)["instances"][1]
    assert entry["unit"] == "llama@0.service" and entry["plan_age_seconds"] == 100.0


def test_a_weighted_interleave_instances_split_and_its_weights_shares_are_shown(tmp_path, trusted_dir):
    root = sysfs.dual_socket_gpus().write(str(tmp_path / "machine"))
    os.makedirs(os.path.join(root, "sys/kernel/mm/mempolicy/weighted_interleave"))
    for node, weight in ((0, 3), (1, 1)):
        with open(os.path.join(root, "sys/kernel/mm/mempolicy/weighted_interleave/node%d" % node), "w") as handle:
            handle.write("%d\n" % weight)
    write_process(root, 4646, "7f00 weighted interleave:0-1 anon=1000 N0=700 N1=300 kernelpagesize_kB=4\n",
                  [(4646, "0-159", 1)])
    plans = os.path.join(trusted_dir, "plans")
    os.mkdir(plans, 0o755)
    write_json(os.path.join(plans, "big@0.plan.json"), {"policy": "weighted-interleave", "mem_nodes": [0, 1],
                                                        "cpulist": "0-159", "node": 0})
    snap = metrics.collect(root, plans, Systemd({"big@0.service": active(4646)}), page_size=PAGE, clock=lambda: 1.0)
    entry = snap["instances"][0]
    assert entry["interleave_ratio"] == {"0": 0.7, "1": 0.3}
    assert entry["interleave_weight_ratio"] == {"0": 0.75, "1": 0.25}
    text = exposition.render(snap)
    assert value(text, "inferops_numa_instance_interleave_node_ratio", unit="big@0.service", node="1") == 0.3
    assert value(text, "inferops_numa_instance_interleave_weight_ratio", unit="big@0.service", node="0") == 0.75


NAMES = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


# --- the records it trusts ------------------------------------------------------------------------


@pytest.mark.parametrize("spoil", ["group-writable", "symlink", "foreign", "not-json"])
def test_a_record_root_did_not_write_alone_is_left_out_with_a_warning(host, tmp_path, spoil):
    path = os.path.join(host[1], "llama@0.plan.json")
    if spoil == "group-writable":
        os.chmod(path, 0o664)
    elif spoil == "symlink":
        shutil.move(path, str(tmp_path / "elsewhere.json"))  # tmp_path may be another file system (RAM)
        os.symlink(str(tmp_path / "elsewhere.json"), path)
    elif spoil == "foreign":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(path, 65534, 65534)
    else:
        with open(path, "w") as handle:
            handle.write("[1, 2")
    snap = snapshot_of(host)
    assert [entry["unit"] for entry in snap["instances"]] == ["down@0.service", "llama@1.service"]
    assert len(snap["warnings"]) == 1 and "llama@0.plan.json" in snap["warnings"][0]
    assert "\n" not in snap["warnings"][0]


def test_bad_audit_settings_leave_the_service_out_naming_the_file(host):
    write_json(os.path.join(host[1], "llama.audit.json"), {"min_local_percent": "lots", "on_drift": "restart"})
    snap = snapshot_of(host)
    assert [entry["unit"] for entry in snap["instances"]] == ["down@0.service"]
    assert all("llama.audit.json: min_local_percent 'lots' is not a percentage" in w for w in snap["warnings"])


def test_the_ab_gates_verdicts_are_shown_per_instance(host):
    write_json(os.path.join(host[1], "ab-gates.json"), {
        "llama@0.service": {"kept": True, "gain_percent": 65.06, "msg": "8.30 -> 13.70 tokens/s"},
        "llama@1.service": {"kept": False, "gain_percent": -48.5}, "down@0.service": {"kept": True, "msg": "no"},
        "evil\n# TYPE x gauge": {"kept": "yes", "gain_percent": 1}})
    snap = snapshot_of(host)
    by_unit = dict((entry["unit"], entry["ab_gate"]) for entry in snap["instances"])
    assert by_unit == {"llama@0.service": {"kept": True, "gain_percent": 65.06},
                       "llama@1.service": {"kept": False, "gain_percent": -48.5},
                       "down@0.service": {"kept": True, "gain_percent": None}}
    assert any("the verdict on 'evil\\n# TYPE x gauge' is not {kept" in warning for warning in snap["warnings"])
    text = exposition.render(snap)
    assert value(text, "inferops_numa_instance_ab_gain_ratio", unit="llama@0.service") == 0.6506
    assert value(text, "inferops_numa_instance_ab_kept", unit="llama@1.service") == 0
    assert value(text, "inferops_numa_instance_ab_kept", unit="down@0.service") == 1
    assert 'inferops_numa_instance_ab_gain_ratio{nodes="0-1"' not in text  # not measured, no sample


def test_an_ab_gates_file_others_may_write_is_ignored(host):
    write_json(os.path.join(host[1], "ab-gates.json"), {"llama@0.service": {"kept": True, "gain_percent": 1}},
               mode=0o666)
    snap = snapshot_of(host)
    assert all(entry["ab_gate"] is None for entry in snap["instances"])
    assert any("ab-gates.json" in warning and "only a regular file that root alone may write" in warning
               for warning in snap["warnings"])


# --- files written as root ------------------------------------------------------------------------


def test_the_textfile_is_replaced_whole_and_no_temporary_is_left(tmp_path):
    directory = tmp_path / "textfile"
    directory.mkdir(mode=0o755)
    os.chmod(str(directory), 0o755)
    target = directory / exposition.TEXTFILE_NAME
    os.symlink(str(tmp_path / "victim"), str(target))  # planted: replaced, never followed
    (tmp_path / "victim").write_text("keep\n")
    path = exposition.write_textfile(str(directory), "inferops_numa_nodes 2\n")
    assert path == str(target) and target.read_text() == "inferops_numa_nodes 2\n"
    assert not os.path.islink(str(target)) and stat.S_IMODE(os.stat(str(target)).st_mode) == 0o644
    assert (tmp_path / "victim").read_text() == "keep\n"
    assert os.listdir(str(directory)) == [exposition.TEXTFILE_NAME]


def test_a_missing_directory_is_made_root_only(tmp_path):
    os.chmod(str(tmp_path), 0o755)
    exposition.write_textfile(str(tmp_path / "new"), "x 1\n")
    assert stat.S_IMODE(os.stat(str(tmp_path / "new")).st_mode) & 0o022 == 0


@pytest.mark.parametrize("spoil", ["group-writable", "world-writable-sticky", "symlink", "foreign", "relative",
                                   "dotdot", "a-file"])
def test_a_directory_others_may_write_is_refused(tmp_path, spoil):
    os.chmod(str(tmp_path), 0o755)
    directory = tmp_path / "textfile"
    directory.mkdir()
    os.chmod(str(directory), 0o755)
    given = str(directory)
    if spoil == "group-writable":
        os.chmod(given, 0o775)
    elif spoil == "world-writable-sticky":
        os.chmod(given, 0o1777)
    elif spoil == "symlink":
        os.symlink(given, str(tmp_path / "link"))
        given = str(tmp_path / "link")
    elif spoil == "foreign":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(given, 65534, 65534)
    elif spoil == "relative":
        given = "relative/dir"
    elif spoil == "a-file":
        (tmp_path / "plain").write_text("")
        given = str(tmp_path / "plain" / "textfile")
    else:
        given = str(directory) + "/../textfile"
    with pytest.raises(NumaError) as caught:
        exposition.write_textfile(given, "x 1\n")
    assert "\n" not in str(caught.value) and ("refusing" in str(caught.value) or "path" in str(caught.value)
                                              or "'..'" in str(caught.value))
    assert not os.path.exists(os.path.join(str(directory), exposition.TEXTFILE_NAME))


def test_a_directory_above_may_be_anyones_it_is_never_followed(tmp_path):
    """Debian's /var/lib/prometheus belongs to prometheus; its node-exporter directory, root's, is the one checked."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(str(shared), 0o1777)
    if os.geteuid() == 0:
        os.chown(str(shared), 65534, 65534)
    (shared / "ours").mkdir()
    os.chmod(str(shared / "ours"), 0o755)
    os.chown(str(shared / "ours"), os.geteuid(), os.getegid())
    exposition.write_textfile(str(shared / "ours"), "x 1\n")
    os.symlink(str(shared), str(tmp_path / "link"))  # a link above the directory is refused too
    with pytest.raises(NumaError, match="symbolic link"):
        exposition.write_textfile(str(tmp_path / "link" / "ours"), "x 1\n")


# --- drift -----------------------------------------------------------------------------------------


def test_drift_is_logged_with_where_the_pages_are_and_acted_on_once_per_interval(host):
    snap = snapshot_of(host)
    run = host[2]
    actions = {}
    lines, changed = drift.drift_actions(snap["instances"], actions, 3600, 5000.0, run, record=lambda marked: None)
    assert changed and run.calls[-1] == ["systemctl", "restart", "--", "llama@1.service"]
    assert lines[0].startswith("drift: llama@1.service: PID(s) 4343") and "remote: 33.03 MiB on node 0 (anon 0 B, file 33.03 MiB)" in lines[0]
    assert lines[1] == "drift: llama@1.service: restarted (on_drift restart)"
    assert actions == {"llama@1.service": {"last_seconds": 5000.0, "counts": {"restart": 1}}}
    calls = len(run.calls)
    lines, changed = drift.drift_actions(snap["instances"], actions, 3600, 5000.0 + 3599, run,
                                           record=lambda marked: None)
    assert not changed and len(run.calls) == calls and "not taken: the last action was 3599 s ago" in lines[1]
    lines, changed = drift.drift_actions(snap["instances"], actions, 3600, 5000.0 + 3601, run,
                                           record=lambda marked: None)
    assert changed and actions["llama@1.service"]["counts"] == {"restart": 2}


def test_evict_moves_the_remote_pages_to_the_plans_nodes(host):
    write_json(os.path.join(host[1], "llama.audit.json"), {"on_drift": "evict"})
    snap = snapshot_of(host)
    moved = []
    lines, _changed = drift.drift_actions(snap["instances"], {}, 0, 1.0, host[2],
                                            migrate=lambda pid, old, new: moved.append((pid, old, new)) or 0,
                                            record=lambda marked: None)
    assert moved == [(4343, [0], [1])]
    assert lines[-1] == "drift: llama@1.service: pages on node(s) 0 moved to node(s) 1 (on_drift evict): PID 4343: moved"


def test_a_look_reports_drift_without_acting(host):
    snap = snapshot_of(host)
    calls = len(host[2].calls)
    lines, changed = drift.drift_actions(snap["instances"], {}, 0, 1.0, host[2], act=False)
    assert len(lines) == 1 and not changed and len(host[2].calls) == calls


def test_the_action_counts_survive_in_the_state_directory(tmp_path):
    os.chmod(str(tmp_path), 0o755)
    state = str(tmp_path / "state")
    assert drift.read_actions(state) == {}
    drift.write_actions(state, {"a@0.service": {"last_seconds": 3.5, "counts": {"evict": 1}}})
    assert stat.S_IMODE(os.stat(os.path.join(state, drift.STATE_NAME)).st_mode) == 0o600
    assert drift.read_actions(state) == {"a@0.service": {"last_seconds": 3.5, "counts": {"evict": 1}}}


@pytest.mark.parametrize("interval", [-1, float("nan"), float("inf"), True, "1h"])
def test_a_drift_interval_that_is_no_duration_is_refused(interval):
    with pytest.raises(NumaError, match="drift interval"):
        drift.check_interval(interval)


def test_migrate_pages_of_this_process_to_its_own_node():
    node = sorted(read("/")["nodes"], key=lambda entry: entry["id"])[0]["id"]
    assert kernel.migrate_pages(os.getpid(), [node], [node]) >= 0


def test_show_units_splits_systemctls_blocks():
    run = Systemd({"a@0.service": active(1), "b@1.service": active(2)})
    shown = systemctl.show_units(["a@0.service", "b@1.service"], run)
    assert shown["b@1.service"]["MainPID"] == "2" and shown["a@0.service"]["Id"] == "a@0.service"
    with pytest.raises(NumaError, match="printed 1 blocks of properties for 2 units"):
        systemctl.show_units(["a@0.service", "b@1.service"], lambda argv: (0, "Id=a\nMainPID=1\n", ""))


# --- the command on this host ----------------------------------------------------------------------
