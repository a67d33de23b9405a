"""safe_fs: the one root-safe file layer (walks without links, trust rules, atomic writes)."""

import errno
import os
import runpy
import stat

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.system import safe_fs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAMP_SCRIPT = os.path.join(REPO, "roles", "numa_host", "files", "installed_stamp.py")
OTHER = 4242  # a uid and gid that are neither root's nor this process's


def status(mode, uid=0, gid=0, kind=stat.S_IFDIR):
    """An lstat result with these owner and mode bits, for judging without chown."""
    return os.stat_result((kind | mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))


def me():
    return os.geteuid()


# --- the trust rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("rule,mode,gid,verdict", [
    (safe_fs.SYSCTL_DIR, 0o755, 0, ""),
    (safe_fs.SYSCTL_DIR, 0o775, 0, ""),  # group write, but the group is root's
    (safe_fs.SYSCTL_DIR, 0o775, OTHER, safe_fs.WRITABLE),
    (safe_fs.SYSCTL_DIR, 0o757, 0, safe_fs.WRITABLE),
    (safe_fs.SYSCTL_DIR, 0o1777, 0, safe_fs.WRITABLE),  # no sticky excuse
    (safe_fs.REPLICA_DIR, 0o750, 0, ""),
    (safe_fs.REPLICA_DIR, 0o770, 0, safe_fs.WRITABLE),  # group write refused, whoever the group is
    (safe_fs.REPLICA_DIR, 0o1777, OTHER, ""),  # the sticky bit excuses it (StrictModes)
    (safe_fs.PRIVATE_DIR, 0o755, 0, ""),
    (safe_fs.PRIVATE_DIR, 0o775, 0, safe_fs.WRITABLE),
    (safe_fs.PRIVATE_DIR, 0o1777, 0, safe_fs.WRITABLE),
    (safe_fs.RECORD_DIR, 0o1777, 0, safe_fs.WRITABLE),
    (safe_fs.RECORD_DIR, 0o700, 0, ""),
    (safe_fs.INSTALL_PATH, 0o755, 0, ""),
    (safe_fs.INSTALL_PATH, 0o1777, 0, safe_fs.WRITABLE),
])
def test_each_rule_refuses_the_writers_it_names(rule, mode, gid, verdict):
    assert rule.distrust(status(mode, uid=0, gid=gid), rule.first_owner()) == verdict


@pytest.mark.parametrize("rule", [safe_fs.SYSCTL_DIR, safe_fs.PRIVATE_DIR, safe_fs.RECORD_DIR, safe_fs.TRUSTED_FILE])
def test_root_or_self_rules_take_root_and_this_user_only(rule):
    assert rule.distrust(status(0o755, uid=0), rule.first_owner()) == ""
    assert rule.distrust(status(0o755, uid=me()), rule.first_owner()) == ""
    assert rule.distrust(status(0o755, uid=OTHER), rule.first_owner()) == safe_fs.OWNER


def test_the_install_path_is_roots_alone():
    assert safe_fs.INSTALL_PATH.first_owner() == 0
    assert safe_fs.INSTALL_PATH.distrust(status(0o755, uid=OTHER), 0) == safe_fs.OWNER


def test_a_root_replica_walk_takes_the_first_other_owner_as_the_services_user():
    rule = safe_fs.REPLICA_DIR
    assert rule.learn_owner(0, status(0o755, uid=0)) == 0  # root's directories: no one else yet
    assert rule.learn_owner(0, status(0o750, uid=OTHER)) == OTHER
    assert rule.learn_owner(OTHER, status(0o750, uid=OTHER + 1)) == OTHER  # then it stays
    assert rule.distrust(status(0o750, uid=OTHER + 1), OTHER) == safe_fs.OWNER
    assert safe_fs.SYSCTL_DIR.learn_owner(0, status(0o755, uid=OTHER)) == 0  # only the replica rule learns


def test_only_the_rules_that_make_directories_have_a_mode_for_them():
    modes = {rule.name: rule.create_mode for rule in (safe_fs.SYSCTL_DIR, safe_fs.REPLICA_DIR, safe_fs.PRIVATE_DIR,
                                                      safe_fs.RECORD_DIR, safe_fs.INSTALL_PATH)}
    assert modes == {"sysctl.d": 0o755, "replica": 0o750, "private": 0o755, "records": None, "install": None}


@pytest.mark.parametrize("mode", [0o755, 0o700, 0o775, 0o757, 0o1777, 0o2775, 0o777])
@pytest.mark.parametrize("uid", [0, OTHER])
@pytest.mark.parametrize("gid", [0, OTHER])
def test_the_install_stamp_script_judges_as_the_install_path_rule(mode, uid, gid):
    """installed_stamp.py runs on the host before the package is there, so it keeps the rule itself."""
    script = runpy.run_path(STAMP_SCRIPT)  # not as __main__: nothing runs
    info = status(mode, uid=uid, gid=gid)
    assert (script["distrust"]("/x", info) is None) == (safe_fs.INSTALL_PATH.distrust(info, 0) == "")


# --- walking --------------------------------------------------------------------------------------


def test_names_of_drops_empty_and_dot_names_and_refuses_dot_dot():
    assert safe_fs.names_of("/r", "/etc//./sysctl.d/") == ["etc", "sysctl.d"]
    with pytest.raises(safe_fs.Refused) as refused:
        safe_fs.names_of("/r", "/etc/../x/y")
    assert refused.value.path == "/r/etc/.." and refused.value.found == safe_fs.OUTSIDE
    assert str(refused.value) == "/r/etc/.. is outside root"


def test_a_link_on_the_way_is_refused_not_followed(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(safe_fs.Refused) as refused:
        safe_fs.walk(str(tmp_path), ["link", "below"], None, create=False)
    assert refused.value.errno == errno.ELOOP and refused.value.path == str(tmp_path / "link")
    assert stat.S_ISLNK(refused.value.info.st_mode) and str(refused.value) == "%s is a symlink" % (tmp_path / "link")
    assert not (tmp_path / "real" / "below").exists()


def test_a_file_on_the_way_is_not_a_directory_and_a_missing_one_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError) as not_dir:
        safe_fs.walk(str(tmp_path), ["file"], None)
    assert not_dir.value.filename == str(tmp_path / "file")
    with pytest.raises(FileNotFoundError) as missing:
        safe_fs.walk(str(tmp_path), ["none", "deeper"], safe_fs.PRIVATE_DIR)
    assert missing.value.filename == str(tmp_path / "none")


@pytest.mark.parametrize("rule", [safe_fs.REPLICA_DIR, safe_fs.PRIVATE_DIR])
def test_create_makes_the_missing_directories_with_the_rules_mode(tmp_path, rule):
    old = os.umask(0)
    try:
        fd, problem, _owner = safe_fs.open_directory(str(tmp_path), ["a", "b"], rule, create=True)
    finally:
        os.umask(old)
    os.close(fd)
    assert problem is None
    assert [stat.S_IMODE(os.stat(str(path)).st_mode) for path in (tmp_path / "a", tmp_path / "a" / "b")] == \
        [rule.create_mode] * 2


def test_without_a_create_mode_nothing_is_made(tmp_path):
    with pytest.raises(FileNotFoundError):
        safe_fs.walk(str(tmp_path), ["a"], safe_fs.RECORD_DIR, create=True)
    assert not (tmp_path / "a").exists()


def test_a_failed_mkdir_names_the_directory(tmp_path, monkeypatch):
    def denied(name, mode, dir_fd):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(os, "mkdir", denied)
    with pytest.raises(safe_fs.CreateFailed) as failed:
        safe_fs.walk(str(tmp_path), ["a"], safe_fs.PRIVATE_DIR, create=True)
    assert (failed.value.errno, failed.value.filename) == (errno.EACCES, str(tmp_path / "a"))


def tree(tmp_path):
    """tmp_path/open (mode 0777: anyone may write it)/inner (0755)."""
    inner = tmp_path / "open" / "inner"
    inner.mkdir(parents=True)
    os.chmod(str(tmp_path / "open"), 0o777)
    return str(tmp_path)


def test_a_last_only_rule_judges_the_last_directory_alone(tmp_path):
    fd, problem, _owner = safe_fs.open_directory(tree(tmp_path), ["open", "inner"], safe_fs.PRIVATE_DIR)
    os.close(fd)
    assert problem is None


def test_an_every_directory_rule_names_the_first_it_distrusts(tmp_path):
    start = tree(tmp_path)
    fd, problem, _owner = safe_fs.open_directory(start, ["open", "inner"], safe_fs.RECORD_DIR, judge_start=False)
    assert fd == -1 and problem.path == os.path.join(start, "open") and problem.why == safe_fs.WRITABLE
    assert stat.S_IMODE(problem.info.st_mode) == 0o777


def test_only_a_missing_first_rule_calls_a_directory_below_a_distrusted_one_missing(tmp_path):
    start = tree(tmp_path)
    with pytest.raises(FileNotFoundError):
        safe_fs.walk(start, ["open", "none"], safe_fs.RECORD_DIR, judge_start=False)
    fd, problem, _owner = safe_fs.walk(start, ["open", "none"], safe_fs.SYSCTL_DIR, create=True, judge_start=False)
    os.close(fd)
    assert problem.path == os.path.join(start, "open")
    assert not os.path.exists(os.path.join(start, "open", "none"))  # nothing made in a distrusted directory


def test_the_start_is_judged_only_when_asked(tmp_path):
    os.chmod(str(tmp_path), 0o777)
    fd, problem, _owner = safe_fs.open_directory(str(tmp_path), [], safe_fs.PRIVATE_DIR, judge_start=False)
    os.close(fd)
    assert problem is None
    fd, problem, _owner = safe_fs.open_directory(str(tmp_path), [], safe_fs.PRIVATE_DIR)
    assert fd == -1 and problem.path == str(tmp_path)


def test_the_directory_reached_is_open_for_reading(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    fd, problem, _owner = safe_fs.open_directory(str(tmp_path), ["a"], None)
    try:
        assert problem is None and os.listdir(fd) == ["f"]
        os.fsync(fd)
    finally:
        os.close(fd)


# --- writing --------------------------------------------------------------------------------------


@pytest.fixture
def directory(tmp_path):
    fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_temporary_names_are_random_and_recognised():
    names = {safe_fs.temporary_name(".p-", ".tmp") for _ in range(4)}
    assert len(names) == 4 and all(safe_fs.is_temporary_name(name, ".p-", ".tmp") for name in names)
    assert not safe_fs.is_temporary_name(".p-0123456789ABCDEF.tmp", ".p-", ".tmp")
    assert not safe_fs.is_temporary_name(".p-0123456789abcdef0.tmp", ".p-", ".tmp")
    assert not safe_fs.is_temporary_name(".p-0123456789abcdef", ".p-", ".tmp")


def test_a_temporary_file_has_the_mode_whatever_the_umask(tmp_path, directory):
    old = os.umask(0o077)
    try:
        name = safe_fs.create_temporary(directory, b"data", 0o644, ".t-")
    finally:
        os.umask(old)
    info = os.stat(str(tmp_path / name))
    assert stat.S_IMODE(info.st_mode) == 0o644 and (tmp_path / name).read_bytes() == b"data"


def test_a_planted_guess_of_the_temporary_name_is_not_written_through(tmp_path, directory, monkeypatch):
    monkeypatch.setattr(os, "urandom", lambda count: b"\0" * count)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    os.symlink(str(victim), str(tmp_path / (".t-" + "0" * safe_fs.TOKEN_LENGTH + ".tmp")))
    with pytest.raises(FileExistsError):
        safe_fs.create_temporary(directory, b"x", 0o644, ".t-")
    assert victim.read_text() == "untouched\n"


def test_a_failed_write_leaves_no_temporary_and_the_old_file(tmp_path, directory, monkeypatch):
    (tmp_path / "state").write_text("old")

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as failed:
        safe_fs.write_atomically(directory, "state", b"new", 0o600, ".state.")
    assert failed.value.errno == errno.ENOSPC
    assert os.listdir(str(tmp_path)) == ["state"] and (tmp_path / "state").read_text() == "old"


def test_an_atomic_write_replaces_a_link_itself_never_its_target(tmp_path, directory):
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (tmp_path / "out").symlink_to(victim)
    safe_fs.write_atomically(directory, "out", b"ours\n", 0o600, ".out.")
    assert victim.read_text() == "untouched\n" and not (tmp_path / "out").is_symlink()
    assert (tmp_path / "out").read_text() == "ours\n"
    assert stat.S_IMODE(os.stat(str(tmp_path / "out")).st_mode) == 0o600
    assert sorted(os.listdir(str(tmp_path))) == ["out", "victim"]


def test_a_failed_rename_removes_the_temporary(tmp_path, directory):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "inside").write_text("x")
    temporary = safe_fs.create_temporary(directory, b"x", 0o644, ".t-")
    with pytest.raises(OSError):
        safe_fs.rename_into_place(directory, temporary, "busy")  # a non-empty directory is never replaced
    assert sorted(os.listdir(str(tmp_path))) == ["busy"]


def test_without_o_tmpfile_an_unnamed_temporary_gets_a_random_name(tmp_path, directory, monkeypatch):
    monkeypatch.setattr(os, "O_TMPFILE", os.O_DIRECTORY)  # what a kernel without O_TMPFILE sees: EISDIR
    fd, name = safe_fs.open_temporary(directory, 0o600, ".partial-", unnamed=True)
    os.close(fd)
    assert safe_fs.is_temporary_name(name, ".partial-") and (tmp_path / name).is_file()


def test_an_unnamed_temporary_is_named_only_when_linked(tmp_path, directory):
    fd, name = safe_fs.open_temporary(directory, 0o600, ".partial-", unnamed=True)
    try:
        if name is None:  # O_TMPFILE: nothing in the directory until it is linked
            assert os.listdir(str(tmp_path)) == []
            name = safe_fs.link_temporary(directory, fd, ".partial-")
        assert os.listdir(str(tmp_path)) == [name] and safe_fs.is_temporary_name(name, ".partial-")
    finally:
        os.close(fd)
