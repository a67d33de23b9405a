"""resctrl memory bandwidth monitoring on constructed trees: each instance's local and total traffic from its own
monitor group, absent (not zero) where the hardware or the group is missing, and the timer's monitor groups."""

import argparse
import io
import os
import shutil

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import resctrl_groups
from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import metrics_command
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import resctrl
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import exposition, metrics

from tests.fixtures import sysfs
from tests.unit.test_audit import PAGE, write_process
from tests.unit.test_metrics import BIND1, LOCAL_MAPS, Systemd, active, samples, value, write_json

MBM = "llc_occupancy\nmbm_total_bytes\nmbm_local_bytes\n"


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def resctrl_group(root, path, tasks, domains=None):
    """A resctrl group at ``path`` (under sys/fs/resctrl) listing ``tasks``; domains: {"mon_L3_00": {event: text}}."""
    base = os.path.join(root, resctrl.RESCTRL, path)
    write(os.path.join(base, "tasks"), "".join("%d\n" % tid for tid in tasks))
    if "mon_groups/" not in path:  # a control group (the default one too) holds the directory of its monitor groups
        os.makedirs(os.path.join(base, "mon_groups"), exist_ok=True)
    for domain, events in (domains or {}).items():
        for event, text in events.items():
            write(os.path.join(base, "mon_data", domain, event), text + "\n")
    return base


def counted(local, total):
    return {"mbm_local_bytes": str(local), "mbm_total_bytes": str(total), "llc_occupancy": "1048576"}


@pytest.fixture
def machine(tmp_path):
    """A dual-socket machine with MBM, running llama (PID 4242, threads 4242-4244) and an unrelated PID 777."""
    root = sysfs.dual_socket_gpus().write(str(tmp_path / "machine"))
    write(os.path.join(root, resctrl.RESCTRL, resctrl.FEATURES), MBM)
    write_process(root, 4242, LOCAL_MAPS, [(4242, "40-79,120-159", 41), (4243, "40-79,120-159", 42),
                                           (4244, "40-79,120-159", 43)])
    write(os.path.join(root, "proc/777/status"), "Name:\tsshd\nTgid:\t777\nPid:\t777\n")
    return root


def snapshot(root, trusted_dir, plans=None):
    plan_dir = os.path.join(trusted_dir, "plans")
    os.makedirs(plan_dir, 0o755, exist_ok=True)
    for name, plan in (plans or {"llama@0.plan.json": BIND1}).items():
        write_json(os.path.join(plan_dir, name), plan)
    return metrics.collect(root, plan_dir, Systemd({"llama@0.service": active(4242)}), page_size=PAGE,
                           clock=lambda: 1.0)


def test_an_instances_own_monitor_group_gives_its_local_and_total_traffic_summed_over_domains(machine, trusted_dir):
    resctrl_group(machine, "", [1, 777, 4242, 4243, 4244])
    resctrl_group(machine, "mon_groups/inferops-numa.llama@0", [4242, 4243, 4244],
                  {"mon_L3_00": counted(100, 150), "mon_L3_01": counted(5, 50)})
    entry = snapshot(machine, trusted_dir)["instances"][0]
    assert entry["memory_bandwidth"] == {"group": "mon_groups/inferops-numa.llama@0", "local_bytes": 105,
                                         "total_bytes": 200, "reason": ""}
    text = exposition.render(snapshot(machine, trusted_dir))
    assert value(text, "inferops_numa_instance_mbm_local_bytes_total", unit="llama@0.service") == 105
    assert value(text, "inferops_numa_instance_mbm_bytes_total", unit="llama@0.service") == 200
    assert "# TYPE inferops_numa_instance_mbm_bytes_total counter" in text


def test_without_monitoring_hardware_the_metrics_are_absent_not_zero(machine, trusted_dir):
    os.remove(os.path.join(machine, resctrl.RESCTRL, resctrl.FEATURES))
    resctrl_group(machine, "mon_groups/inferops-numa.llama@0", [4242], {"mon_L3_00": counted(1, 2)})
    snap = snapshot(machine, trusted_dir)
    assert snap["instances"][0]["memory_bandwidth"]["local_bytes"] is None
    assert "no resctrl monitoring" in snap["instances"][0]["memory_bandwidth"]["reason"]
    names = set(name for name, _labels in samples(exposition.render(snap)))
    assert "inferops_numa_instance_up" in names
    assert not any("mbm" in name for name in names)


def test_a_host_counting_occupancy_only_counts_no_bandwidth(machine, trusted_dir):
    write(os.path.join(machine, resctrl.RESCTRL, resctrl.FEATURES), "llc_occupancy\n")
    resctrl_group(machine, "mon_groups/inferops-numa.llama@0", [4242], {"mon_L3_00": counted(1, 2)})
    assert resctrl.read_hierarchy(machine) is None
    assert snapshot(machine, trusted_dir)["instances"][0]["memory_bandwidth"]["total_bytes"] is None


def test_a_domain_reporting_unavailable_leaves_that_counter_out_not_a_part_of_it(machine, trusted_dir):
    resctrl_group(machine, "mon_groups/inferops-numa.llama@0", [4242, 4243, 4244],
                  {"mon_L3_00": counted(100, 150), "mon_L3_01": dict(counted(5, 50), mbm_local_bytes="Unavailable")})
    snap = snapshot(machine, trusted_dir)
    assert snap["instances"][0]["memory_bandwidth"]["local_bytes"] is None
    assert snap["instances"][0]["memory_bandwidth"]["total_bytes"] == 200
    names = set(name for name, _labels in samples(exposition.render(snap)))
    assert "inferops_numa_instance_mbm_bytes_total" in names and "inferops_numa_instance_mbm_local_bytes_total" not in names


def test_sub_numa_domains_are_counted_once(machine, trusted_dir):
    """With SNC a domain's files already sum its mon_sub_L3_* directories."""
    base = resctrl_group(machine, "mon_groups/m", [4242, 4243], {"mon_L3_00": counted(60, 90)})
    for sub, local in (("mon_sub_L3_00", 20), ("mon_sub_L3_01", 40)):
        for event, text in counted(local, 45).items():
            write(os.path.join(base, "mon_data/mon_L3_00", sub, event), text)
    assert snapshot(machine, trusted_dir)["instances"][0]["memory_bandwidth"]["local_bytes"] == 60


@pytest.mark.parametrize("layout, reason", [
    ({"": [1, 4242, 4243, 4244]}, "default group"),
    ({"": [1, 777, 4242], "mon_groups/shared": [777, 4242]}, "task 777 first"),
    ({"": [1], "cat": [777, 4242, 4243]}, "other processes"),
])
def test_a_group_that_is_not_the_instances_alone_gives_no_counters(machine, trusted_dir, layout, reason):
    for path, tasks in layout.items():
        resctrl_group(machine, path, tasks, {"mon_L3_00": counted(7, 9)})
    found = snapshot(machine, trusted_dir)["instances"][0]["memory_bandwidth"]
    assert found["group"] is None and found["total_bytes"] is None and reason in found["reason"]


def test_a_thread_that_exited_since_the_group_was_read_does_not_make_it_shared(machine, trusted_dir):
    resctrl_group(machine, "cat", [4242, 4243, 9999], {"mon_L3_00": counted(7, 9)})  # 9999: no /proc entry
    assert snapshot(machine, trusted_dir)["instances"][0]["memory_bandwidth"]["group"] == "cat"


def test_the_most_specific_group_is_the_one_counted():
    hierarchy = resctrl.Hierarchy(frozenset(["mbm_total_bytes"]), {
        resctrl.Group("", "", False): {1, 5}, resctrl.Group("cat", "cat", False): {5, 6},
        resctrl.Group("cat/mon_groups/m", "cat", True): {5}})
    assert resctrl.group_of(hierarchy, 5).path == "cat/mon_groups/m"
    assert resctrl.group_of(hierarchy, 6).path == "cat"
    assert resctrl.group_of(hierarchy, 1).path == ""
    assert resctrl.group_of(hierarchy, 2) is None


# --- the timer's monitor groups ---------------------------------------------------------------------


@pytest.fixture
def kernfs_mkdir(monkeypatch):
    """mkdir and rmdir as resctrl's: a new group directory comes with its tasks file, and goes with it."""
    real, real_rmdir = os.mkdir, os.rmdir

    def mkdir(name, mode=0o777, *, dir_fd=None):
        real(name, mode, dir_fd=dir_fd)
        if dir_fd is None:
            return  # the test's own os.makedirs
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
        try:
            os.close(os.open("tasks", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
            real("mon_data", dir_fd=fd)
            real("mon_data/mon_L3_00", dir_fd=fd)
            for event in ("mbm_local_bytes", "mbm_total_bytes"):
                counter = os.open("mon_data/mon_L3_00/" + event, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(counter, b"0\n")
                os.close(counter)
        finally:
            os.close(fd)
    def rmdir(name, *, dir_fd=None):
        if dir_fd is None:
            return real_rmdir(name)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
        try:
            os.unlink("tasks", dir_fd=fd)
            shutil.rmtree("mon_data", dir_fd=fd, ignore_errors=True)
        finally:
            os.close(fd)
        return real_rmdir(name, dir_fd=dir_fd)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "rmdir", rmdir)


def running(pid=4242, unit="llama@0.service"):
    return {"unit": unit, "up": True, "main_pid": pid, "pids": [pid]}


def tasks_of(root, path):
    with open(os.path.join(root, resctrl.RESCTRL, path, "tasks")) as handle:
        return [int(word) for word in handle.read().split()]


def test_an_instance_in_the_default_group_gets_a_monitor_group_of_its_own(machine, kernfs_mkdir):
    resctrl_group(machine, "", [1, 777, 4242, 4243, 4244])
    lines, changed = resctrl_groups.adopt([running()], ["llama@0.service"], machine)
    assert tasks_of(machine, "mon_groups/inferops-numa.llama@0") == [4242, 4243, 4244]
    assert changed == {"llama@0.service"}
    assert lines == ["resctrl: llama@0.service: made monitor group mon_groups/inferops-numa.llama@0: 3 thread(s) "
                     "moved in"]


def test_an_instance_already_in_its_group_is_left_as_it_is(machine, kernfs_mkdir):
    resctrl_group(machine, "", [1, 777, 4242, 4243, 4244])
    resctrl_group(machine, "mon_groups/inferops-numa.llama@0", [4242, 4243, 4244])
    assert resctrl_groups.adopt([running()], ["llama@0.service"], machine) == ([], set())


def test_a_thread_started_later_joins_its_instances_group(machine, kernfs_mkdir):
    resctrl_group(machine, "", [1, 777, 4242, 4243, 4244])
    resctrl_group(machine, "mon_groups/inferops-numa.llama@0", [4242, 4243])
    lines, _changed = resctrl_groups.adopt([running()], ["llama@0.service"], machine)
    assert tasks_of(machine, "mon_groups/inferops-numa.llama@0") == [4242, 4243, 4244]
    assert lines == ["resctrl: llama@0.service: monitor group mon_groups/inferops-numa.llama@0: 1 thread(s) moved in"]


def test_the_group_is_made_in_the_control_group_the_instance_is_in(machine, kernfs_mkdir):
    """A monitor group of another control group would change the instance's cache allocation: the kernel refuses it."""
    resctrl_group(machine, "", [1])
    resctrl_group(machine, "cat", [777, 4242, 4243, 4244])
    resctrl_groups.adopt([running()], ["llama@0.service"], machine)
    assert tasks_of(machine, "cat/mon_groups/inferops-numa.llama@0") == [4242, 4243, 4244]
    assert not os.path.exists(os.path.join(machine, resctrl.RESCTRL, "mon_groups/inferops-numa.llama@0"))


def test_an_operators_shared_monitor_group_is_left_alone(machine, kernfs_mkdir):
    resctrl_group(machine, "", [1, 777, 4242, 4243, 4244])
    resctrl_group(machine, "mon_groups/theirs", [777, 4242, 4243, 4244])
    assert resctrl_groups.adopt([running()], ["llama@0.service"], machine) == ([], set())
    assert tasks_of(machine, "mon_groups/theirs") == [777, 4242, 4243, 4244]


def test_a_stopped_instance_has_nothing_moved(machine, kernfs_mkdir):
    resctrl_group(machine, "", [1, 777, 4242, 4243, 4244])
    assert resctrl_groups.adopt([dict(running(), up=False)], ["llama@0.service"], machine) == ([], set())
    assert os.listdir(os.path.join(machine, resctrl.RESCTRL, "mon_groups")) == []


def test_an_empty_group_of_a_unit_no_longer_recorded_is_removed_and_only_that(machine, kernfs_mkdir):
    resctrl_group(machine, "", [1, 777])
    for name in ("inferops-numa.gone@0", "inferops-numa.stopped@0", "someone-elses"):
        resctrl_group(machine, "mon_groups/" + name, [])
    resctrl_group(machine, "mon_groups/inferops-numa.busy@0", [777])
    lines, _changed = resctrl_groups.adopt([], ["stopped@0.service"], machine)
    left = sorted(os.listdir(os.path.join(machine, resctrl.RESCTRL, "mon_groups")))
    assert left == ["inferops-numa.busy@0", "inferops-numa.stopped@0", "someone-elses"]
    assert lines == ["resctrl: removed the empty monitor group mon_groups/inferops-numa.gone@0: no unit of that name "
                     "is deployed"]


def test_no_monitoring_means_no_group_is_made(machine, kernfs_mkdir):
    os.remove(os.path.join(machine, resctrl.RESCTRL, resctrl.FEATURES))
    resctrl_group(machine, "", [1, 4242])
    assert resctrl_groups.adopt([running()], ["llama@0.service"], machine) == ([], set())
    assert os.listdir(os.path.join(machine, resctrl.RESCTRL, "mon_groups")) == []


def test_no_free_monitor_id_is_one_line_naming_the_cause_and_the_fix(machine, monkeypatch):
    resctrl_group(machine, "", [1, 4242])

    def full(name, mode=0o777, *, dir_fd=None):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "mkdir", full)
    lines, changed = resctrl_groups.adopt([running()], ["llama@0.service"], machine)
    assert changed == {"llama@0.service"} and len(lines) == 1
    assert "num_rmids" in lines[0] and "remove monitor groups no longer needed" in lines[0]


def test_a_link_planted_for_a_group_is_not_followed(machine, tmp_path, kernfs_mkdir):
    resctrl_group(machine, "", [1, 4242, 4243, 4244])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "tasks").write_text("")
    os.symlink(str(elsewhere), os.path.join(machine, resctrl.RESCTRL, "mon_groups/inferops-numa.llama@0"))
    lines, _changed = resctrl_groups.adopt([running()], ["llama@0.service"], machine)
    assert (elsewhere / "tasks").read_text() == ""
    assert len(lines) == 1 and "cannot make monitor group" in lines[0]



def test_the_timer_moves_an_instance_in_and_its_textfile_shows_the_new_groups_counters(machine, trusted_dir,
                                                                                       kernfs_mkdir, monkeypatch,
                                                                                       tmp_path):
    resctrl_group(machine, "", [1, 777, 4242, 4243, 4244])
    plan_dir = os.path.join(trusted_dir, "plans")
    os.makedirs(plan_dir, 0o755)
    write_json(os.path.join(plan_dir, "llama@0.plan.json"), BIND1)
    run = Systemd({"llama@0.service": active(4242)})
    real_collect = metrics.collect
    monkeypatch.setattr(metrics, "collect", lambda _root, plans, _run: real_collect(machine, plans, run, page_size=PAGE))
    os.chmod(str(tmp_path), 0o755)
    args = argparse.Namespace(textfile_dir=str(tmp_path / "textfile"), stdout=False, json=False, plan_dir=plan_dir,
                              state_dir=str(tmp_path / "state"), drift_interval=3600.0)
    err = io.StringIO()
    assert metrics_command.run(args, io.StringIO(), err) == 0
    assert "resctrl: llama@0.service: made monitor group mon_groups/inferops-numa.llama@0: 3 thread(s)" in err.getvalue()
    text = (tmp_path / "textfile" / exposition.TEXTFILE_NAME).read_text()
    assert value(text, "inferops_numa_instance_mbm_bytes_total", unit="llama@0.service") == 0
