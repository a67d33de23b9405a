"""systemctl.py: a unit's processes from its cgroup under the root prefix, systemd's answers handed in."""

from ansible_collections.inferops.numa.plugins.module_utils.numa.read import systemctl


def test_a_cgroup_procs_line_that_is_no_pid_is_not_a_process_of_the_unit(tmp_path):
    group = tmp_path / "sys" / "fs" / "cgroup" / "system.slice" / "llama@0.service"
    (group / "worker").mkdir(parents=True)
    (group / "cgroup.procs").write_bytes(b"4242\n-1\n0x10\n\xff\xfe\n\xd9\xa1\n4300\n")
    (group / "worker" / "cgroup.procs").write_text("4301\n")
    props = {"ControlGroup": "/system.slice/llama@0.service", "MainPID": "4242"}
    assert systemctl.unit_pids(str(tmp_path), props) == [4242, 4300, 4301]


def test_without_a_readable_cgroup_the_main_pid_stands_for_the_unit(tmp_path):
    assert systemctl.unit_pids(str(tmp_path), {"ControlGroup": "/gone.service", "MainPID": "77"}) == [77]
    assert systemctl.unit_pids(str(tmp_path), {"ControlGroup": "", "MainPID": "0"}) == []
