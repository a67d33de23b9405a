"""The numa_balancing Ansible module end to end: main() in-process, then the ad hoc command."""
import errno
import json
import os
import shutil
import stat

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.system import root_files, safe_fs
from ansible_collections.inferops.numa.plugins.modules import numa_balancing

from tests.ansible_compat import clear_warnings, patch_module_args
from tests.unit.balancing_fakeroot import FakeRoot

OURS = "/etc/sysctl.d/60-inferops-numa.conf"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def host(tmp_path):
    return FakeRoot(tmp_path / "root").knobs(balancing=1, zone_reclaim=0).debian()


def warnings_of(out):
    """Warning texts; ansible-core >= 2.19 wraps each in a WarningSummary dict."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in out.get("warnings", [])]


@pytest.fixture
def run(capsys, monkeypatch):
    """Run main() with module args; return (exit code, parsed JSON result)."""
    def _run(args, check=False, diff=False):
        # Module warnings are process-global; a real module run is a fresh process.
        clear_warnings(monkeypatch)
        args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
        with patch_module_args(args), pytest.raises(SystemExit) as stop:
            numa_balancing.main()
        return stop.value.code, json.loads(capsys.readouterr().out)
    return _run


def test_check_mode_with_diff_writes_nothing(host, run):
    code, out = run({"root": host.path, "state": "disabled", "zone_reclaim_mode": 0}, check=True, diff=True)
    assert code == 0 and out["changed"] is True
    assert out["before"]["kernel.numa_balancing"] == 1 and out["after"]["kernel.numa_balancing"] == 0
    assert out["msg"].startswith("would set kernel.numa_balancing 1 -> 0")
    file_diff, runtime_diff = out["diff"]
    assert file_diff["before"] == "" and "kernel.numa_balancing = 0\nvm.zone_reclaim_mode = 0\n" in file_diff["after"]
    assert file_diff["after_header"] == host.real(OURS)
    assert runtime_diff["before"].startswith("kernel.numa_balancing = 1")
    assert not host.exists(OURS) and host.read("/proc/sys/kernel/numa_balancing") == "1\n"
    assert sorted(os.listdir(host.real("/etc/sysctl.d"))) == ["99-sysctl.conf", "README.sysctl"]


def test_apply_then_second_run_reports_no_change(host, run):
    code, first = run({"root": host.path, "state": "disabled"})
    assert code == 0 and first["changed"] is True and first["persisted_file"] == host.real(OURS)
    assert host.read("/proc/sys/kernel/numa_balancing") == "0\n"
    content = host.read(OURS)
    assert content.startswith("# Managed by Ansible") and content.endswith("kernel.numa_balancing = 0\n")
    assert oct(os.stat(host.real(OURS)).st_mode & 0o777) == "0o644"
    assert sorted(os.listdir(host.real("/etc/sysctl.d"))) == [
        "60-inferops-numa.conf", "99-sysctl.conf", "README.sysctl"]  # no temp file left behind
    code, second = run({"root": host.path, "state": "disabled"}, diff=True)
    assert code == 0 and second["changed"] is False
    assert second["diff"][0]["before"] == second["diff"][0]["after"] == content
    assert "up to date" in second["msg"]


def test_drift_is_repaired(host, run):
    run({"root": host.path})
    host.file("/proc/sys/kernel/numa_balancing", "1\n")
    code, out = run({"root": host.path})
    assert out["changed"] is True and out["msg"] == "set kernel.numa_balancing 1 -> 0; %s up to date" % host.real(OURS)


def test_conflicting_file_after_ours_fails_and_writes_nothing(host, run):
    host.file("/etc/sysctl.d/99-zz.conf", "kernel.numa_balancing = 1\n")
    code, out = run({"root": host.path, "state": "disabled"})
    assert code == 1 and out["failed"] is True and out["changed"] is False
    assert host.real("/etc/sysctl.d/99-zz.conf") in out["msg"]
    assert out["conflicts"][0]["applied_after_ours"] is True
    assert not host.exists(OURS) and host.read("/proc/sys/kernel/numa_balancing") == "1\n"


def test_conflict_with_warn_applies_and_warns(host, run):
    host.file("/etc/sysctl.d/99-zz.conf", "kernel.numa_balancing = 1\n")
    code, out = run({"root": host.path, "on_conflict": "warn"})
    assert code == 0 and out["changed"] is True and host.exists(OURS)
    assert any("99-zz.conf" in w and "Accepted because on_conflict=warn" in w for w in warnings_of(out))


def test_missing_knob_is_ok_and_writes_nothing(tmp_path, run):
    host = FakeRoot(tmp_path).knobs(balancing=None, zone_reclaim=None)
    code, out = run({"root": host.path, "verify_seconds": 1}, diff=True)
    assert code == 0 and out["changed"] is False and out["supported"] is False
    assert "CONFIG_NUMA_BALANCING" in out["msg"] and out["persisted_file"] is None
    assert "diff" not in out and "vmstat_delta" not in out
    assert not host.exists("/etc/sysctl.d")


def test_permission_error_on_the_knob_fails_with_the_fix(host, run, monkeypatch):
    real_open_under = root_files.open_under

    def denied(root, path, flags):
        if path.endswith("numa_balancing") and flags & os.O_ACCMODE == os.O_WRONLY:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open_under(root, path, flags)
    monkeypatch.setattr(root_files, "open_under", denied)
    code, out = run({"root": host.path})
    assert code == 1 and "become: true" in out["msg"] and "Permission denied" in out["msg"]
    assert not host.exists(OURS)


def test_permission_error_on_the_dropin_fails_with_the_fix(host, run, monkeypatch):
    real_create = safe_fs.create_temporary

    def denied(directory, data, *mode_and_name):
        if data.startswith(b"{"):  # the originals record, written first through the same layer
            return real_create(directory, data, *mode_and_name)
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(safe_fs, "create_temporary", denied)
    code, out = run({"root": host.path})
    assert code == 1 and "become: true" in out["msg"] and host.real(OURS) in out["msg"]


def test_persist_false_removes_our_dropin(host, run):
    run({"root": host.path})
    code, out = run({"root": host.path, "state": "enabled", "persist": False})
    assert code == 0 and out["changed"] is True and out["persisted_file"] is None
    assert not host.exists(OURS) and host.read("/proc/sys/kernel/numa_balancing") == "1\n"
    code, out = run({"root": host.path, "state": "enabled", "persist": False})
    assert out["changed"] is False


def test_raw_and_tiering_values(host, run):
    code, out = run({"root": host.path, "state": "raw"})
    assert code == 1 and "state=raw needs value" in out["msg"]
    code, out = run({"root": host.path, "state": "raw", "value": 3})
    assert code == 0 and host.read("/proc/sys/kernel/numa_balancing") == "3\n"
    code, out = run({"root": host.path, "state": "tiering"})
    assert out["after"]["kernel.numa_balancing"] == 2 and "kernel.numa_balancing = 2" in host.read(OURS)


def test_verify_seconds_returns_deltas(host, run):
    host.vmstat(pte=10, faults=3)
    code, out = run({"root": host.path, "verify_seconds": 0.01})
    assert code == 0 and out["vmstat_delta"] == {"seconds": 0.01, "numa_pte_updates": 0, "numa_hint_faults": 0}
    assert warnings_of(out) == []


def test_tuned_profile_is_reported(host, run):
    host.tuned("latency", {"/usr/lib/tuned/latency": "[sysctl]\nkernel.numa_balancing=1\n"})
    code, out = run({"root": host.path})
    assert code == 0 and out["tuned"]["active_profile"] == "latency"
    assert any("tuned profile 'latency'" in w for w in warnings_of(out))


# ---------------------------------------------------------------- the ad hoc command


# ---------------------------------------------------------------- the drop-in as root sees it (issue 14)


OTHER_UID = 4242
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="ownership checks need root (CI runs as root)")


def assert_root_owned_regular_dropin(host):
    info = os.lstat(host.real(OURS))
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644
    assert (info.st_uid, info.st_gid) == (0, 0)
    assert host.read(OURS).startswith("# Managed by Ansible")


@AS_ROOT
@pytest.mark.parametrize("target_inside_root", [True, False])
def test_a_symlinked_dropin_becomes_a_root_owned_regular_file(host, run, tmp_path, target_inside_root):
    target = host.real("/srv/sysctl.conf") if target_inside_root else str(tmp_path / "elsewhere.conf")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as handle:
        handle.write("kernel.shmmax = 1\n")
    os.chown(target, OTHER_UID, OTHER_UID)
    os.chmod(target, 0o666)
    host.symlink(OURS, target)
    code, out = run({"root": host.path}, diff=True)
    assert code == 0 and out["changed"] is True
    assert "replaced %s (it was a symlink to %r)" % (host.real(OURS), target) in out["msg"]
    assert out["diff"][0]["before"] == ""  # the link's target is not shown
    assert_root_owned_regular_dropin(host)
    with open(target) as handle:
        assert handle.read() == "kernel.shmmax = 1\n"
    info = os.stat(target)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (OTHER_UID, 0o666)
    assert sorted(os.listdir(host.real("/etc/sysctl.d"))) == ["60-inferops-numa.conf", "99-sysctl.conf",
                                                              "README.sysctl"]
    assert run({"root": host.path})[1]["changed"] is False


@AS_ROOT
@pytest.mark.parametrize("uid,mode", [(OTHER_UID, 0o644), (0, 0o666), (0, 0o600)])
def test_a_dropin_with_the_right_text_but_another_owner_or_mode_is_rewritten(host, run, uid, mode):
    run({"root": host.path})
    os.chown(host.real(OURS), uid, uid)
    os.chmod(host.real(OURS), mode)
    code, out = run({"root": host.path}, check=True)
    assert code == 0 and out["changed"] is True and "would replace" in out["msg"]
    assert os.stat(host.real(OURS)).st_uid == uid  # check mode wrote nothing
    code, out = run({"root": host.path})
    assert out["changed"] is True
    assert_root_owned_regular_dropin(host)


@pytest.mark.parametrize("mask", ["/dev/null", "../../dev/null"])
def test_a_masked_dropin_is_left_alone_and_reported(host, run, mask):
    host.symlink(OURS, mask)
    code, out = run({"root": host.path}, diff=True)
    assert code == 0 and out["dropin_masked"] is True and out["persisted_file"] is None
    assert out["changed"] is True and host.read("/proc/sys/kernel/numa_balancing") == "0\n"  # runtime only
    assert "%s is masked, left alone" % host.real(OURS) in out["msg"]
    assert any("is masked" in w and "force: true" in w for w in warnings_of(out))
    assert out["diff"][0]["before"] == out["diff"][0]["after"] == ""
    assert os.readlink(host.real(OURS)) == mask
    code, out = run({"root": host.path})
    assert out["changed"] is False and os.readlink(host.real(OURS)) == mask


def test_a_masked_dropin_still_hides_a_vendor_file_of_its_name(host, run):
    host.symlink(OURS, "/dev/null")
    host.file("/usr/lib/sysctl.d/60-inferops-numa.conf", "kernel.numa_balancing = 1\n")
    code, out = run({"root": host.path})
    assert code == 0 and out["conflicts"] == []


def test_force_replaces_a_mask_and_persist_false_with_force_removes_it(host, run):
    host.symlink(OURS, "/dev/null")
    code, out = run({"root": host.path, "force": True}, check=True)
    assert out["changed"] is True and "would replace" in out["msg"] and os.path.islink(host.real(OURS))
    code, out = run({"root": host.path, "force": True})
    assert code == 0 and out["changed"] is True and out["dropin_masked"] is False
    assert "it was a mask: a symlink to /dev/null" in out["msg"]
    assert not os.path.islink(host.real(OURS)) and "kernel.numa_balancing = 0" in host.read(OURS)
    host.symlink("/etc/sysctl.d/other", "/dev/null")
    os.replace(host.real("/etc/sysctl.d/other"), host.real(OURS))
    code, out = run({"root": host.path, "persist": False})
    assert out["changed"] is False and os.path.islink(host.real(OURS))
    code, out = run({"root": host.path, "persist": False, "force": True})
    assert out["changed"] is True and "removed" in out["msg"] and not host.exists(OURS)


@pytest.mark.parametrize("component", ["/etc", "/etc/sysctl.d"])
@pytest.mark.parametrize("check", [True, False])
def test_a_symlinked_sysctl_d_is_refused_and_nothing_is_written(host, run, tmp_path, component, check):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(host.real(component), str(elsewhere), symlinks=True)
    shutil.rmtree(host.real(component))
    host.symlink(component, str(elsewhere))
    code, out = run({"root": host.path}, check=check)
    assert code == 1 and out["msg"].startswith("refusing to use %s: %s is a symlink" % (host.real(OURS),
                                                                                        host.real(component)))
    assert "\n" not in out["msg"]
    assert not any(name.startswith(("60-", ".inferops")) for _d, _s, names in os.walk(str(elsewhere))
                   for name in names)
    assert host.read("/proc/sys/kernel/numa_balancing") == "1\n"


@AS_ROOT
def test_a_sysctl_d_another_user_owns_is_refused(host, run):
    os.chown(host.real("/etc/sysctl.d"), OTHER_UID, OTHER_UID)
    code, out = run({"root": host.path})
    assert code == 1
    assert "%s is writable by others (owner uid %d" % (host.real("/etc/sysctl.d"), OTHER_UID) in out["msg"]
    assert not host.exists(OURS)


def temporary(directory):
    """The temporary file a drop-in is written to first (knobs.write_dropin, through safe_fs.write_atomically)."""
    return safe_fs.create_temporary(directory, b"x", root_files.DROPIN_MODE, root_files.TEMPORARY_PREFIX)


def test_the_temporary_name_is_fresh_and_never_written_through(host, monkeypatch, tmp_path):
    directory = os.open(host.real("/etc/sysctl.d"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = {temporary(directory) for _ in range(2)}
        assert len(names) == 2 and all(name.startswith(".") and not name.endswith(".conf") for name in names)
        # Even a planted guess of the name is not followed: creation fails and the link's target is unchanged.
        monkeypatch.setattr(safe_fs.os, "urandom", lambda count: b"\0" * count)
        victim = tmp_path / "victim"
        victim.write_text("untouched\n")
        os.symlink(str(victim), host.real("/etc/sysctl.d/.inferops-numa-0000000000000000.tmp"))
        with pytest.raises(FileExistsError):
            temporary(directory)
        assert victim.read_text() == "untouched\n"
    finally:
        os.close(directory)


def test_a_symlinked_knob_fails_in_one_line_and_changes_nothing_outside(host, run, tmp_path):
    outside = tmp_path / "knob"
    outside.write_text("1\n")
    os.remove(host.real("/proc/sys/kernel/numa_balancing"))
    host.symlink("/proc/sys/kernel/numa_balancing", str(outside))
    code, out = run({"root": host.path})
    assert code == 1 and "is a symlink" in out["msg"] and "\n" not in out["msg"]
    assert outside.read_text() == "1\n" and not host.exists(OURS)


def test_auto_writes_tiering_on_a_tiered_host_and_says_why(host, run):
    host.file("/sys/devices/virtual/memory_tiering/memory_tier4/nodelist", "0\n")
    host.file("/sys/devices/virtual/memory_tiering/memory_tier22/nodelist", "1\n")
    code, out = run({"root": host.path, "state": "auto"})
    assert code == 0 and out["state"] == "tiering" and out["changed"] is True
    assert host.read("/proc/sys/kernel/numa_balancing") == "2\n" and "Requested state: tiering." in host.read(OURS)
    assert "state auto: memory tiers, node(s) 1 slower" in out["msg"] and warnings_of(out) == []
    code, out = run({"root": host.path, "state": "disabled"})
    assert out["state"] == "disabled" and host.read("/proc/sys/kernel/numa_balancing") == "0\n"
    assert any("stops promoting hot pages" in warning for warning in warnings_of(out))


# --- state: original, the host's own value and drop-in put back ------------------------------------------------------

RECORD = "/var/lib/inferops-numa/originals/numa_balancing.json"


def balancing_state(host):
    """The runtime values and what stands at our drop-in's path, byte for byte."""
    dropin = host.real(OURS)
    held = None if not os.path.lexists(dropin) else ("-> " + os.readlink(dropin) if os.path.islink(dropin)
                                                     else (host.read(OURS), oct(os.stat(dropin).st_mode & 0o777)))
    return host.read("/proc/sys/kernel/numa_balancing"), host.read("/proc/sys/vm/zone_reclaim_mode"), held


@pytest.mark.parametrize("admin_dropin", [None, "kernel.numa_balancing = 1\n# the admin's own\n"])
def test_state_original_puts_back_what_the_first_change_found(host, run, admin_dropin):
    if admin_dropin:
        host.file(OURS, admin_dropin)
        os.chmod(host.real(OURS), 0o640)
    before = balancing_state(host)
    assert run({"root": host.path, "state": "disabled", "zone_reclaim_mode": 1})[1]["changed"]
    assert run({"root": host.path, "state": "enabled", "zone_reclaim_mode": 2})[1]["changed"]  # recorded once: kept
    assert balancing_state(host) != before and host.exists(RECORD)

    code, checked = run({"root": host.path, "state": "original"}, check=True, diff=True)
    assert code == 0 and checked["changed"] and checked["state"] == "original"
    assert checked["before"] == {"kernel.numa_balancing": 1, "vm.zone_reclaim_mode": 2}
    assert checked["after"] == {"kernel.numa_balancing": 1, "vm.zone_reclaim_mode": 0}
    assert checked["diff"][0]["after"] == (admin_dropin or "")
    assert checked["msg"].startswith("would restore the originals of numa_balancing: vm.zone_reclaim_mode 2 -> 0")
    assert balancing_state(host) != before and host.exists(RECORD)

    code, restored = run({"root": host.path, "state": "original"})
    assert code == 0 and restored["changed"] and restored["msg"].startswith("restored the originals")
    assert balancing_state(host) == before and not host.exists(RECORD)
    assert restored["persisted_file"] == (host.real(OURS) if admin_dropin else None)

    code, again = run({"root": host.path, "state": "original"})
    assert code == 0 and not again["changed"] and again["msg"].startswith("no originals recorded in ")
    assert balancing_state(host) == before


def test_state_original_refuses_a_record_not_to_be_trusted_and_changes_nothing(host, run):
    run({"root": host.path, "state": "disabled"})
    os.chmod(host.real(RECORD), 0o646)
    before = balancing_state(host)
    code, out = run({"root": host.path, "state": "original"})
    assert code == 1 and out["failed"] and not out["changed"]
    assert out["msg"].startswith("refusing the originals record %s: it is mode 0646" % host.real(RECORD))
    assert balancing_state(host) == before


def test_state_original_refuses_a_value_to_set(host, run):
    code, out = run({"root": host.path, "state": "original", "zone_reclaim_mode": 0})
    assert code == 1 and out["msg"].startswith("zone_reclaim_mode is not used with state=original")
