"""numa_balancing logic (module_utils/numa/act/balancing.py) on fake roots: issue 4, every branch."""
import errno
import os
import shutil

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import balancing as b, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import boot_config
from ansible_collections.inferops.numa.plugins.module_utils.numa.system import root_files
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

from tests.unit.balancing_fakeroot import FakeRoot

OURS = "/etc/sysctl.d/60-inferops-numa.conf"


@pytest.fixture
def host(tmp_path):
    return FakeRoot(tmp_path).knobs(balancing=1, zone_reclaim=0).debian()


def plan(host, **request):
    return b.make_plan(host.path, b.BalancingRequest(**request))


def sequence(host, with_ours=False):
    return [conf.path for conf in boot_config.boot_sequence(host.path, OURS, with_ours)]


# ---------------------------------------------------------------- values and keys


@pytest.mark.parametrize("state,value,expected", [
    ("disabled", None, 0), ("enabled", None, 1), ("tiering", None, 2), ("raw", 3, 3), ("raw", 0, 0)])
def test_desired_value(state, value, expected):
    assert b.desired_value(state, value) == expected


@pytest.mark.parametrize("state,value,words", [
    ("raw", None, "state=raw needs value"),
    ("raw", -1, "must be >= 0"),
    ("disabled", 1, "only used with state=raw"),
    ("off", None, "unknown state 'off': use one of disabled, enabled, tiering, raw, auto"),
])
def test_desired_value_refuses(state, value, words):
    with pytest.raises(NumaError, match=words):
        b.desired_value(state, value)


@pytest.mark.parametrize("spelling", [
    "kernel.numa_balancing", "kernel/numa_balancing", " kernel.numa_balancing ", "/kernel/numa_balancing",
    "kernel//numa_balancing"])
def test_canonical_key_spellings_match(spelling):
    assert boot_config.canonical_key(spelling) == "kernel/numa_balancing"


def test_canonical_key_keeps_dots_inside_a_slash_path():
    # sysctl.d(5): both name the same knob; the dot belongs to the interface name eth0.200.
    assert boot_config.canonical_key("net.ipv4.conf.eth0/200.forwarding") == "net/ipv4/conf/eth0.200/forwarding"
    assert boot_config.canonical_key("net/ipv4/conf/eth0.200/forwarding") == "net/ipv4/conf/eth0.200/forwarding"
    assert boot_config.canonical_key("/kernel.numa_balancing") != "kernel/numa_balancing"


# ---------------------------------------------------------------- parsing


def test_parse_sysctl_syntax():
    text = "\n".join([
        "# comment kernel.numa_balancing = 1",  # 1
        "; kernel.numa_balancing = 1",  # 2 also a comment
        "   kernel.numa_balancing=1",  # 3 leading whitespace
        "-kernel/numa_balancing = 2 ",  # 4 '-' only means ignore errors
        "-kernel.sched_*",  # 5 glob exclusion, assigns nothing
        "kernel.numa_* = 1",  # 6 glob: systemd never applies it over an explicit key
        "not an assignment",  # 7 syntax error, skipped
        "",
        "vm.zone_reclaim_mode\t=\t1",  # 9
        "= 5",  # 10 no key
        "kernel.numa_balancing = 0 # trailing text is part of the value",  # 11
    ])
    found = boot_config.parse_sysctl(text)
    assert [(a.key, a.value, a.line) for a in found] == [
        ("kernel/numa_balancing", "1", 3),
        ("kernel/numa_balancing", "2", 4),
        ("vm/zone_reclaim_mode", "1", 9),
        ("kernel/numa_balancing", "0 # trailing text is part of the value", 11),
    ]


@pytest.mark.parametrize("written,wanted,same", [("0", 0, True), ("00", 0, True), ("1", 0, False),
                                                 ("0 # x", 0, True), ("yes", 1, False), ("", 0, False)])
def test_same_value(written, wanted, same):
    assert boot_config.same_value(written, wanted) is same


def test_render_dropin_has_header_and_keys():
    text = b.render_dropin({"kernel.numa_balancing": 0, "vm.zone_reclaim_mode": 0}, "disabled")
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any("Managed by Ansible" in line and "inferops.numa" in line for line in header)
    assert any("NUMA-bound" in line for line in header)
    assert [a.key for a in boot_config.parse_sysctl(text)] == ["kernel/numa_balancing", "vm/zone_reclaim_mode"]
    assert text.endswith("kernel.numa_balancing = 0\nvm.zone_reclaim_mode = 0\n")


# ---------------------------------------------------------------- boot order


def test_boot_sequence_sorts_by_name_across_directories(tmp_path):
    host = FakeRoot(tmp_path)
    host.file("/usr/lib/sysctl.d/10-a.conf", "").file("/etc/sysctl.d/20-b.conf", "")
    host.file("/run/sysctl.d/15-c.conf", "").file("/usr/local/lib/sysctl.d/30-d.conf", "")
    host.file("/lib/sysctl.d/05-e.conf", "").file("/etc/sysctl.d/zz-last.conf", "")
    assert sequence(host) == ["/lib/sysctl.d/05-e.conf", "/usr/lib/sysctl.d/10-a.conf", "/run/sysctl.d/15-c.conf",
                              "/etc/sysctl.d/20-b.conf", "/usr/local/lib/sysctl.d/30-d.conf",
                              "/etc/sysctl.d/zz-last.conf"]


def test_boot_sequence_same_name_precedence(tmp_path):
    host = FakeRoot(tmp_path)
    host.file("/usr/lib/sysctl.d/50-x.conf", "").file("/run/sysctl.d/50-x.conf", "")
    host.file("/run/sysctl.d/40-y.conf", "").file("/lib/sysctl.d/40-y.conf", "")
    host.file("/etc/sysctl.d/30-z.conf", "").file("/run/sysctl.d/30-z.conf", "").file("/usr/lib/sysctl.d/30-z.conf", "")
    assert sequence(host) == ["/etc/sysctl.d/30-z.conf", "/run/sysctl.d/40-y.conf", "/run/sysctl.d/50-x.conf"]


def test_boot_sequence_skips_hidden_non_conf_and_directories(tmp_path):
    host = FakeRoot(tmp_path)
    host.file("/etc/sysctl.d/.hidden.conf", "").file("/etc/sysctl.d/notes.txt", "")
    host.file("/etc/sysctl.d/dir.conf/inner", "").file("/etc/sysctl.d/10-ok.conf", "")
    assert sequence(host) == ["/etc/sysctl.d/10-ok.conf"]


def test_debian_sysctl_conf_symlink_is_applied_last_once(host):
    host.file("/usr/lib/sysctl.d/zz-vendor.conf", "")
    assert sequence(host) == ["/usr/lib/sysctl.d/50-pid-max.conf", "/usr/lib/sysctl.d/99-protect-links.conf",
                              "/usr/lib/sysctl.d/zz-vendor.conf", "/etc/sysctl.conf"]


def test_sysctl_conf_without_symlink_is_still_last(tmp_path):
    host = FakeRoot(tmp_path).file("/etc/sysctl.conf", "").file("/usr/lib/sysctl.d/99-zz.conf", "")
    assert sequence(host, with_ours=True) == [OURS, "/usr/lib/sysctl.d/99-zz.conf", "/etc/sysctl.conf"]


def test_ours_is_placed_by_name_and_hides_a_vendor_file_of_the_same_name(tmp_path):
    host = FakeRoot(tmp_path).file("/usr/lib/sysctl.d/50-default.conf", "")
    host.file("/usr/lib/sysctl.d/60-inferops-numa.conf", "").file("/usr/lib/sysctl.d/70-after.conf", "")
    assert sequence(host, with_ours=True) == ["/usr/lib/sysctl.d/50-default.conf", OURS,
                                              "/usr/lib/sysctl.d/70-after.conf"]
    # Without our drop-in (persist=false) the vendor file of that name is what boot applies.
    assert "/usr/lib/sysctl.d/60-inferops-numa.conf" in sequence(host)


def test_resolve_keeps_absolute_links_inside_root(tmp_path):
    host = FakeRoot(tmp_path).file("/srv/conf/numa.conf", "kernel.numa_balancing = 1\n")
    host.symlink("/etc/sysctl.d/70-link.conf", "/srv/conf/numa.conf")
    host.symlink("/etc/sysctl.d/71-masked.conf", "/dev/null")
    assert root_files.resolve(host.path, "/etc/sysctl.d/70-link.conf") == "/srv/conf/numa.conf"
    assert root_files.resolve(host.path, "/etc/sysctl.d/71-masked.conf") == "/dev/null"


# ---------------------------------------------------------------- conflicts


def test_conflict_after_ours_fails_naming_the_file(host):
    host.file("/etc/sysctl.d/99-zz.conf", "# tuning\nvm.swappiness = 10\nkernel.numa_balancing = 1\n")
    result = plan(host)
    assert result.conflicts == [{
        "file": host.real("/etc/sysctl.d/99-zz.conf"), "key": "kernel.numa_balancing", "value": "1", "line": 3,
        "applied_after_ours": True, "wins_at_boot": True,
        "fix": "remove or change line 3 of %s" % host.real("/etc/sysctl.d/99-zz.conf")}]
    assert result.error is not None
    assert host.real("/etc/sysctl.d/99-zz.conf") in result.error and "line 3" in result.error
    assert "on_conflict=warn" in result.error and "after a reboot" in result.error


def test_conflict_with_on_conflict_warn_becomes_a_warning(host):
    host.file("/etc/sysctl.d/99-zz.conf", "kernel.numa_balancing = 1\n")
    result = plan(host, on_conflict="warn")
    assert result.error is None
    assert len(result.warnings) == 1 and host.real("/etc/sysctl.d/99-zz.conf") in result.warnings[0]
    assert result.changed


def test_conflict_before_ours_is_harmless_and_reported(host):
    host.file("/usr/lib/sysctl.d/50-default.conf", "kernel.numa_balancing = 1\n")
    result = plan(host)
    assert result.error is None and result.warnings == []
    assert result.conflicts[0]["applied_after_ours"] is False and result.conflicts[0]["wins_at_boot"] is False
    assert any("applied before" in note and "50-default.conf" in note for note in result.notes)
    assert "50-default.conf" in b.summary(result, check_mode=False)


def test_same_value_after_ours_is_not_a_conflict(host):
    host.file("/etc/sysctl.d/99-zz.conf", "kernel.numa_balancing = 0\n")
    assert plan(host).conflicts == [] and plan(host).error is None


def test_later_file_that_restores_the_value_defuses_an_earlier_conflict(host):
    host.file("/etc/sysctl.d/70-bad.conf", "kernel.numa_balancing = 1\n")
    host.file("/usr/lib/sysctl.d/80-good.conf", "kernel.numa_balancing = 0\n")
    result = plan(host)
    assert result.error is None
    assert [(c["applied_after_ours"], c["wins_at_boot"]) for c in result.conflicts] == [(True, False)]
    assert any("a later file sets the wanted value again" in note for note in result.notes)


def test_last_assignment_in_a_file_is_the_one_that_counts(host):
    host.file("/etc/sysctl.d/99-zz.conf", "kernel.numa_balancing = 1\nkernel.numa_balancing = 0\n")
    result = plan(host)
    assert result.error is None
    assert [(c["line"], c["wins_at_boot"]) for c in result.conflicts] == [(1, False)]


def test_sysctl_conf_via_debian_symlink_conflicts(host):
    host.file("/etc/sysctl.conf", "kernel/numa_balancing=1\n")
    result = plan(host)
    assert [c["file"] for c in result.conflicts] == [host.real("/etc/sysctl.conf")]
    assert host.real("/etc/sysctl.conf") in result.error


@pytest.mark.parametrize("line", ["-kernel.numa_balancing = 1", "  kernel/numa_balancing=1", "kernel.numa_balancing=2"])
def test_every_spelling_is_detected(host, line):
    host.file("/run/sysctl.d/90-x.conf", line + "\n")
    result = plan(host)
    assert result.error is not None
    # A generated or packaged file: the fix is to mask it, not to edit it.
    assert "mask %s with a same-named symlink to /dev/null" % host.real("/run/sysctl.d/90-x.conf") in result.error


def test_masked_vendor_file_is_not_a_conflict(host):
    host.file("/usr/lib/sysctl.d/90-vendor.conf", "kernel.numa_balancing = 1\n")
    host.symlink("/etc/sysctl.d/90-vendor.conf", "/dev/null")
    result = plan(host)
    assert result.conflicts == [] and result.warnings == []


def test_glob_is_not_a_conflict(host):
    host.file("/etc/sysctl.d/90-glob.conf", "kernel.numa_* = 1\n")
    assert plan(host).conflicts == []


def test_our_file_on_disk_is_not_its_own_conflict(host):
    host.file(OURS, "kernel.numa_balancing = 1\n")
    result = plan(host)
    assert result.conflicts == [] and result.dropin_changed


def test_zone_reclaim_conflicts_only_when_managed(host):
    host.file("/etc/sysctl.d/99-zz.conf", "vm.zone_reclaim_mode = 1\n")
    assert plan(host).conflicts == []
    result = plan(host, zone_reclaim_mode=0)
    assert [c["key"] for c in result.conflicts] == ["vm.zone_reclaim_mode"] and result.error


def test_unreadable_file_is_a_warning_not_a_crash(host):
    host.symlink("/etc/sysctl.d/90-loop.conf", "90-loop.conf")
    result = plan(host)
    assert result.error is None
    assert any("90-loop.conf" in w and "cannot read" in w for w in result.warnings)


def test_persist_false_warns_and_plans_removal_of_our_file(host):
    host.file(OURS, b.render_dropin({"kernel.numa_balancing": 0}, "disabled"))
    host.file("/usr/lib/sysctl.d/50-default.conf", "kernel.numa_balancing = 1\n")
    result = plan(host, persist=False)
    assert result.error is None
    assert result.dropin_after is None and result.dropin_changed
    assert result.conflicts[0]["applied_after_ours"] is True and result.conflicts[0]["wins_at_boot"] is True
    assert any("persist is false" in w and "50-default.conf" in w for w in result.warnings)
    assert "would remove" in b.summary(result, check_mode=True)


# ---------------------------------------------------------------- plan, support, runtime


def test_plan_values_and_idempotence(host):
    first = plan(host, zone_reclaim_mode=1)
    assert first.supported and first.changed
    assert first.before == {"kernel.numa_balancing": 1, "vm.zone_reclaim_mode": 0}
    assert first.after == {"kernel.numa_balancing": 0, "vm.zone_reclaim_mode": 1}
    assert first.runtime_changes == [("kernel.numa_balancing", 0), ("vm.zone_reclaim_mode", 1)]
    knobs.apply(first.knob)
    host.file(OURS, first.dropin_after)
    second = plan(host, zone_reclaim_mode=1)
    assert not second.changed and second.runtime_changes == [] and not second.dropin_changed
    assert host.read("/proc/sys/kernel/numa_balancing") == "0\n"
    assert "up to date" in b.summary(second, check_mode=False)


def test_dropping_zone_reclaim_rewrites_the_dropin_but_leaves_the_knob(host):
    first = plan(host, zone_reclaim_mode=1)
    knobs.apply(first.knob)
    host.file(OURS, first.dropin_after)
    second = plan(host)
    assert second.dropin_changed and "zone_reclaim" not in second.dropin_after
    assert second.runtime_changes == [] and second.after["vm.zone_reclaim_mode"] == 1


def test_missing_knob_is_unsupported_and_plans_nothing(tmp_path):
    host = FakeRoot(tmp_path).knobs(balancing=None, zone_reclaim=None)
    result = plan(host)
    assert not result.supported and not result.changed
    assert "CONFIG_NUMA_BALANCING" in result.notes[0] and "nothing written" in result.notes[0]
    assert b.result(result, False)["persisted_file"] is None


def test_missing_procfs_is_unsupported_with_its_own_reason(tmp_path):
    result = plan(FakeRoot(tmp_path))
    assert not result.supported and "is procfs mounted" in b.summary(result, False)


def test_zone_reclaim_requested_without_the_knob_fails(tmp_path):
    host = FakeRoot(tmp_path).knobs(balancing=1, zone_reclaim=None)
    with pytest.raises(NumaError, match="drop the option"):
        plan(host, zone_reclaim_mode=0)
    assert plan(host).before == {"kernel.numa_balancing": 1}


def test_bad_options_fail(host):
    with pytest.raises(NumaError, match="on_conflict"):
        plan(host, on_conflict="ignore")
    with pytest.raises(NumaError, match="zone_reclaim_mode must be >= 0"):
        plan(host, zone_reclaim_mode=-1)


def test_garbage_knob_content_fails_without_echoing_it(host):
    host.file("/proc/sys/kernel/numa_balancing", "banana\n")
    with pytest.raises(NumaError, match="does not hold an integer") as failure:
        plan(host)
    assert "banana" not in str(failure.value)


def _raising_open(errno_value, access=os.O_WRONLY):
    real_open_under = root_files.open_under

    def fake(root, path, flags):
        if path.startswith("/proc/sys/") and flags & os.O_ACCMODE == access:
            raise OSError(errno_value, os.strerror(errno_value), path)
        return real_open_under(root, path, flags)
    return fake


@pytest.mark.parametrize("code,words", [
    (errno.EACCES, "become: true"), (errno.EPERM, "become: true"), (errno.EROFS, "read-only"),
    (errno.EINVAL, "Linux >= 5.18"), (errno.EIO, "cannot write")])
def test_runtime_write_errors_name_the_fix(host, monkeypatch, code, words):
    result = plan(host, state="tiering")
    monkeypatch.setattr(root_files, "open_under", _raising_open(code))
    with pytest.raises(NumaError, match=words.replace(".", r"\.")):
        knobs.apply(result.knob)


def test_runtime_read_permission_error_names_the_fix(host, monkeypatch):
    monkeypatch.setattr(root_files, "open_under", _raising_open(errno.EACCES, os.O_RDONLY))
    with pytest.raises(NumaError, match="become: true"):
        plan(host)


def test_write_that_does_not_stick_fails(host, monkeypatch):
    result = plan(host)
    monkeypatch.setattr(knobs, "read_value", lambda root, name, path: "1")
    with pytest.raises(NumaError, match="kernel reports 1"):
        knobs.apply(result.knob)


def test_dropin_errors():
    assert "become: true" in str(root_files.write_error("/x", OSError(errno.EACCES, "Permission denied")))
    assert "No space" in str(root_files.write_error("/x", OSError(errno.ENOSPC, "No space left on device")))


# ---------------------------------------------------------------- tuned


PROFILE_SETS_1 = "[main]\nsummary=vendor\n\n[sysctl]\nkernel.numa_balancing = 1  # inline comment\nvm.swappiness=10\n"


def test_no_tuned_profile(host):
    assert plan(host).tuned is None
    host.file("/etc/tuned/active_profile", "\n")
    assert plan(host).tuned is None


def test_tuned_profile_setting_it_warns_with_profile_and_file(host):
    host.tuned("throughput-performance", {"/usr/lib/tuned/throughput-performance": PROFILE_SETS_1})
    result = plan(host)
    conf = host.real("/usr/lib/tuned/throughput-performance/tuned.conf")
    assert result.tuned == {
        "active_profile": "throughput-performance", "files": [conf], "reapply_sysctl": True,
        "settings": [{"profile": "throughput-performance", "file": conf, "key": "kernel.numa_balancing",
                      "value": "1"}]}
    assert len(result.warnings) == 1
    assert "throughput-performance" in result.warnings[0] and conf in result.warnings[0]
    assert "re-applies /etc/sysctl.d" in result.warnings[0]
    assert result.error is None


def test_tuned_without_reapply_keeps_its_value(host):
    host.tuned("hpc", {"/etc/tuned/profiles/hpc": PROFILE_SETS_1}, main="# main\nreapply_sysctl = 0\n")
    result = plan(host)
    assert result.tuned["reapply_sysctl"] is False
    assert "stays in force" in result.warnings[0]


def test_tuned_include_chain_and_self_named_override(host):
    # /etc/tuned/hpc includes the vendor profile of the same name, which includes a base that sets 1;
    # the /etc profile sets 0 last, so tuned ends with 0 and there is nothing to warn about.
    host.tuned("hpc", {
        "/etc/tuned/hpc": "[main]\ninclude=hpc\n[sysctl]\nkernel/numa_balancing=0\n",
        "/usr/lib/tuned/hpc": "[main]\ninclude = base ; other\n",
        "/usr/lib/tuned/profiles/base": PROFILE_SETS_1,
        "/usr/lib/tuned/other": "[main]\nsummary=nothing\n",
    })
    result = plan(host)
    assert result.tuned["files"] == [host.real(p) for p in (
        "/etc/tuned/hpc/tuned.conf", "/usr/lib/tuned/hpc/tuned.conf", "/usr/lib/tuned/profiles/base/tuned.conf",
        "/usr/lib/tuned/other/tuned.conf")]
    assert result.tuned["settings"][0]["value"] == "0" and result.tuned["settings"][0]["profile"] == "hpc"
    assert result.warnings == []


def test_tuned_included_profile_setting_it_is_found(host):
    host.tuned("custom", {"/etc/tuned/custom": "[main]\ninclude=base\n",
                          "/usr/lib/tuned/base": PROFILE_SETS_1})
    result = plan(host)
    assert result.tuned["settings"][0]["profile"] == "base"
    assert "tuned profile 'base'" in result.warnings[0]


def test_tuned_custom_sysctl_unit_and_disabled_unit(host):
    host.tuned("a b", {
        "/etc/tuned/a": "[my_knobs]\ntype=sysctl\nvm.zone_reclaim_mode=1\n",
        "/etc/tuned/b": "[sysctl]\nenabled=false\nkernel.numa_balancing=1\n",
    })
    result = plan(host, zone_reclaim_mode=0)
    assert result.tuned["active_profile"] == "a b"
    assert [(s["key"], s["value"]) for s in result.tuned["settings"]] == [("vm.zone_reclaim_mode", "1")]
    assert len(result.warnings) == 1 and "vm.zone_reclaim_mode" in result.warnings[0]


def test_tuned_missing_variable_and_broken_profiles_are_warnings(host):
    host.tuned("gone templated broken", {
        "/etc/tuned/templated": "[main]\ninclude=${f:virt_check:virtual-guest:throughput-performance}\n",
        "/etc/tuned/broken": "kernel.numa_balancing = 1\n",  # no section header
    })
    result = plan(host)
    text = " | ".join(result.warnings)
    assert "'gone' not found" in text and "uses a variable" in text and "cannot parse tuned profile" in text
    assert result.tuned["settings"] == []


# ---------------------------------------------------------------- vmstat


def test_sample_vmstat_reports_growth(host):
    host.vmstat(pte=100, faults=50)
    waited = []

    def sleep(seconds):
        waited.append(seconds)
        host.vmstat(pte=175, faults=52)
    assert b.sample_vmstat(host.path, 2.5, sleep) == {"seconds": 2.5, "numa_pte_updates": 75, "numa_hint_faults": 2}
    assert waited == [2.5]


def test_verify_flat_counters_after_disabling(host):
    host.vmstat()
    result = plan(host)
    delta, warning = b.verify(result, 1, check_mode=False, sleep=lambda s: None)
    assert delta == {"seconds": 1, "numa_pte_updates": 0, "numa_hint_faults": 0} and warning is None


def test_verify_warns_when_still_scanning(host):
    host.vmstat()
    result = plan(host)
    warning = b.verify(result, 1, check_mode=False, sleep=lambda s: host.vmstat(pte=130))[1]
    assert "still scanning" in warning and "numa_pte_updates +30" in warning
    # In check mode the knob is still 1, so scanning is expected.
    warning = b.verify(result, 1, check_mode=True, sleep=lambda s: host.vmstat(pte=160))[1]
    assert warning is None


def test_verify_without_counters_and_bad_interval(host):
    result = plan(host)
    delta, warning = b.verify(result, 1, check_mode=False, sleep=lambda s: None)
    assert delta["numa_pte_updates"] is None and "could not be checked" in warning
    with pytest.raises(NumaError, match="verify_seconds must be > 0"):
        b.verify(result, 0, check_mode=False)


# ---------------------------------------------------------------- reporting


def test_result_and_diff(host):
    host.file(OURS, "old\n")
    result = plan(host)
    values = b.result(result, check_mode=True)
    assert values["changed"] and values["persisted_file"] == host.real(OURS)
    assert values["msg"] == "would set kernel.numa_balancing 1 -> 0; would write %s" % host.real(OURS)
    file_diff, runtime_diff = b.diff(result)
    assert file_diff["before"] == "old\n" and file_diff["after"] == result.dropin_after
    assert file_diff["before_header"] == host.real(OURS)
    assert runtime_diff["before"] == "kernel.numa_balancing = 1\n"
    assert runtime_diff["after"] == "kernel.numa_balancing = 0\n"


# ---------------------------------------------------------------- never leaving root (issue 14)


SECRET = "1\n"  # a valid knob value: a followed link would be read and written without any error


@pytest.fixture
def outside(tmp_path):
    """A tree beside the root, shaped like one, that nothing may read or write through a link."""
    tree = FakeRoot(tmp_path / "outside").knobs(balancing=1, zone_reclaim=0)
    tree.file("/etc/sysctl.d/keep.conf", "kernel.numa_balancing = 1\n")
    return tree


def snapshot(tree):
    """Every file under a tree, with its content, owner and mode."""
    found = {}
    for directory, _dirs, names in os.walk(tree.path):
        for name in names:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            with open(path) as handle:
                found[path] = (handle.read(), info.st_uid, info.st_mode)
    return found


@pytest.fixture
def inside(tmp_path):
    return FakeRoot(tmp_path / "root").knobs(balancing=1, zone_reclaim=0).debian()


@pytest.mark.parametrize("component", ["/proc", "/proc/sys", "/proc/sys/kernel", "/proc/sys/kernel/numa_balancing"])
def test_a_symlinked_knob_or_knob_directory_is_refused_for_reads(inside, outside, component):
    if os.path.isdir(inside.real(component)):
        shutil.rmtree(inside.real(component))
    else:
        os.remove(inside.real(component))
    inside.symlink(component, outside.real(component))
    with pytest.raises(NumaError, match="refusing to read kernel.numa_balancing") as failure:
        plan(inside)
    assert "%s is a symlink" % inside.real(component) in str(failure.value)


def test_a_knob_swapped_for_a_symlink_after_planning_is_not_written_through(inside, outside):
    before = snapshot(outside)
    result = plan(inside)
    os.remove(inside.real("/proc/sys/kernel/numa_balancing"))
    inside.symlink("/proc/sys/kernel/numa_balancing", outside.real("/proc/sys/kernel/numa_balancing"))
    with pytest.raises(NumaError, match="refusing to write kernel.numa_balancing .* is a symlink"):
        knobs.apply(result.knob)
    assert snapshot(outside) == before


def test_knob_errors_never_echo_what_the_link_or_file_holds(inside, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash:19000:0:99999:7:::\n")
    os.remove(inside.real("/proc/sys/kernel/numa_balancing"))
    inside.symlink("/proc/sys/kernel/numa_balancing", str(secret))
    with pytest.raises(NumaError) as failure:
        plan(inside)
    assert "$6$hash" not in str(failure.value) and "\n" not in str(failure.value)


def test_a_fifo_as_knob_fails_at_once_instead_of_hanging(inside):
    os.remove(inside.real("/proc/sys/kernel/numa_balancing"))
    os.mkfifo(inside.real("/proc/sys/kernel/numa_balancing"))
    with pytest.raises(NumaError, match="is not a regular file"):
        plan(inside)


def test_the_real_procfs_is_read_without_refusal():
    if not os.path.isfile("/proc/sys/kernel/numa_balancing"):
        pytest.skip("this kernel has no kernel.numa_balancing")
    with open("/proc/sys/kernel/numa_balancing") as handle:
        assert b.read_runtime("/", "kernel.numa_balancing") == int(handle.read())


@pytest.mark.parametrize("component", ["/etc", "/etc/sysctl.d"])
def test_a_symlinked_dropin_directory_is_refused(inside, outside, component):
    shutil.rmtree(inside.real(component))
    inside.symlink(component, outside.real(component))
    with pytest.raises(NumaError, match="refusing to use .*: %s is a symlink; replace the symlink with a real "
                                        "directory" % inside.real(component)):
        plan(inside)


def test_a_sysctl_file_linked_out_of_root_is_read_inside_root(inside, outside):
    # Followed on the host, each of these links reaches a file that sets the knob to 1: a conflict.
    # Inside the root their targets do not exist, so there is nothing to read.
    inside.symlink("/etc/sysctl.d/90-out.conf", outside.real("/etc/sysctl.d/keep.conf"))
    inside.symlink("/etc/sysctl.d/91-up.conf", "../../../../../../../../" + outside.real("/etc/sysctl.d/keep.conf"))
    inside.symlink("/run/sysctl.d", outside.real("/etc/sysctl.d"))
    result = plan(inside)
    assert result.conflicts == [] and result.error is None
    assert root_files.resolve(inside.path, "/etc/sysctl.d/90-out.conf") == outside.real("/etc/sysctl.d/keep.conf")


def test_tuned_parse_errors_name_the_line_not_its_text(inside):
    inside.tuned("broken", {"/etc/tuned/broken": "[main]\nsummary=x\nsecret-token-abc\n"})
    text = " | ".join(plan(inside).warnings)
    assert "cannot parse tuned profile" in text and "at line 3" in text and "secret-token-abc" not in text


def test_refused_directories_writable_by_others(inside):
    os.chmod(inside.real("/etc/sysctl.d"), 0o777)
    with pytest.raises(NumaError, match=r"writable by others .*mode 0777.*make it owned by root"):
        plan(inside)


@pytest.mark.parametrize("shape,words", [
    (lambda root: (shutil.rmtree(root.real("/etc/sysctl.d")), root.file("/etc/sysctl.d", "x\n")),
     r"cannot read .*60-inferops-numa.conf \(Not a directory\)$"),
    (lambda root: os.makedirs(root.real(OURS)), r"60-inferops-numa.conf is not a regular file; move it away"),
    (lambda root: os.mkfifo(root.real(OURS)), r"60-inferops-numa.conf is not a regular file; move it away"),
])
def test_what_cannot_be_a_dropin_fails_in_one_line(inside, shape, words):
    shape(inside)
    with pytest.raises(NumaError, match=words) as failure:
        plan(inside)
    assert "\n" not in str(failure.value)


# ---------------------------------------------------------------- state auto and memory tiers

def tiered(host, tiers):
    """The host with the kernel's memory tiers: {tier id: nodelist}, as /sys/devices/virtual/memory_tiering
    shows them (Linux 6.1+)."""
    for tier, nodelist in tiers.items():
        host.file("/sys/devices/virtual/memory_tiering/memory_tier%d/nodelist" % tier, nodelist + "\n")
    return host


@pytest.mark.parametrize("tiers,state", [
    ({}, "disabled"),                            # no memory tiering at all (before 6.1, or no NUMA)
    ({4: "0-1"}, "disabled"),                    # one tier: DRAM only
    ({4: "0-1", 22: ""}, "disabled"),            # a slower tier without nodes
    ({2: "", 4: "0-1"}, "disabled"),             # a faster tier without nodes: DRAM is still the only one
    ({4: "0-1", 22: "2"}, "tiering"),            # DRAM and a CXL expander
    ({22: "2-3", 4: "0-1", 30: "4"}, "tiering"),  # tiers listed out of order
])
def test_auto_is_tiering_exactly_where_a_slower_tier_holds_nodes(host, tiers, state):
    result = plan(tiered(host, tiers), state="auto")
    assert result.state == state
    assert result.desired["kernel.numa_balancing"] == b.STATE_VALUES[state]
    assert "Requested state: %s." % state in result.dropin_after
    assert any(note.startswith("state auto:") for note in result.notes) and result.warnings == []


def test_auto_names_the_slower_nodes_and_disabled_there_warns_that_promotion_stops(host):
    tiered(host, {4: "0-1", 22: "2-3", 30: "4"})
    assert "node(s) 2-4 slower" in " ".join(plan(host, state="auto").notes)
    (warning,) = plan(host, state="disabled").warnings
    assert "stops promoting hot pages from the slower node(s) 2-4" in warning and "state tiering (or auto)" in warning


def test_states_other_than_auto_and_disabled_never_read_the_tiers(host, monkeypatch):
    monkeypatch.setattr(b, "memory_tiers", lambda root: pytest.fail("tiers read for an explicit state"))
    for state in ("enabled", "tiering"):
        assert plan(host, state=state).state == state
    assert plan(host, state="raw", value=3).desired["kernel.numa_balancing"] == 3


def test_auto_with_a_value_is_refused(host):
    with pytest.raises(NumaError, match="only used with state=raw"):
        plan(host, state="auto", value=2)
