"""numa_host trusts an installed numa-pin (and skips installing it) only where root alone can write it; each helper
version goes into a directory of its own beside the others, the path links to the current one, and versions no unit
names go beyond the newest three."""

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.tools import ansible_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "roles", "numa_host", "files", "installed_stamp.py")
PACKAGE = os.path.join(REPO, "plugins", "module_utils", "numa")
NOBODY = 65534

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: builds root-owned trees and chowns them away")


def stamp(package, launcher, *version_launcher):
    """The role's call: the script's text through -I -c, as the task passes it."""
    with open(SCRIPT, encoding="utf-8") as script:
        text = script.read()
    return subprocess.run([sys.executable, "-I", "-c", text, package, launcher] + list(version_launcher),
                          capture_output=True, text=True, timeout=60, check=False)


def install(base, stamp_text="v1 abc"):
    package = os.path.join(base, "lib", "numa")
    os.makedirs(package, mode=0o755)
    with open(os.path.join(package, ".installed"), "w", encoding="ascii") as out:
        out.write(stamp_text + "\n")
    launcher = os.path.join(base, "numa-pin")
    with open(launcher, "w", encoding="ascii") as out:
        out.write("#!/usr/bin/python3\n")
    os.chmod(launcher, 0o755)
    return package, launcher


@as_root
def test_a_root_only_install_gives_its_stamp(trusted_dir):
    package, launcher = install(trusted_dir)
    result = stamp(package, launcher)
    assert (result.returncode, result.stdout.strip()) == (0, "v1 abc")


def test_nothing_installed_yet_gives_an_empty_stamp():
    result = stamp("/usr/lib/inferops-numa-not-installed/numa", "/usr/bin/inferops-numa-not-installed")
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "", "")


def test_a_world_writable_directory_on_the_way_is_refused():
    with tempfile.TemporaryDirectory() as scratch:  # under /tmp: mode 1777
        result = stamp(os.path.join(scratch, "numa"), "/usr/bin/true")
    assert result.returncode == 1
    assert len(result.stdout.strip().splitlines()) == 1
    assert "writable by group or others (mode 1777)" in result.stdout and "chmod go-w" in result.stdout


@as_root
@pytest.mark.parametrize("owned_by_user", ["lib", "lib/numa", "numa-pin"])
def test_a_path_another_user_owns_is_refused(trusted_dir, owned_by_user):
    package, launcher = install(trusted_dir)
    os.chown(os.path.join(trusted_dir, owned_by_user), NOBODY, NOBODY)
    result = stamp(package, launcher)
    assert result.returncode == 1
    assert "%s is owned by uid %d" % (os.path.join(trusted_dir, owned_by_user), NOBODY) in result.stdout


@as_root
@pytest.mark.parametrize("change", ["owned by another user", "group-writable"])
def test_a_layer_subpackage_root_does_not_alone_control_is_refused(trusted_dir, change):
    """The package's subpackages (one per layer) hold code every service start runs: the same rule."""
    package, launcher = install(trusted_dir)
    layer = os.path.join(package, "decide")
    os.mkdir(layer, 0o755)
    if change == "group-writable":
        os.chmod(layer, 0o775)
    else:
        os.chown(layer, NOBODY, NOBODY)
    result = stamp(package, launcher)
    expected = ("%s is owned by uid %d" % (layer, NOBODY) if change != "group-writable"
                else "%s is writable by group or others (mode 0775)" % layer)
    assert result.returncode == 1 and expected in result.stdout


@as_root
def test_a_symlink_into_a_users_directory_is_refused(trusted_dir):
    package, launcher = install(trusted_dir)
    users = os.path.join(trusted_dir, "users")
    shutil.move(os.path.join(trusted_dir, "lib"), users)
    os.chown(users, NOBODY, NOBODY)
    os.symlink(users, os.path.join(trusted_dir, "lib"))  # root's link, the user's directory behind it
    result = stamp(package, launcher)
    assert result.returncode == 1 and "%s is owned by uid %d" % (users, NOBODY) in result.stdout


@as_root
@pytest.mark.parametrize("forgery", ["owned by another user", "a symlink"])
def test_a_stamp_root_did_not_write_means_install_again(trusted_dir, forgery):
    package, launcher = install(trusted_dir)
    stamp_path = os.path.join(package, ".installed")
    if forgery == "a symlink":
        real = os.path.join(trusted_dir, "elsewhere")
        os.rename(stamp_path, real)
        os.symlink(real, stamp_path)
    else:
        os.chown(stamp_path, NOBODY, NOBODY)
    result = stamp(package, launcher)
    assert (result.returncode, result.stdout.strip()) == (0, "")


def test_the_second_line_says_whether_the_path_links_to_this_version(tmp_path):
    """Given the version's launcher, the script also says whether the path links to exactly it (a path under /tmp
    is refused before that, so a link is read only where it is trusted: judged here by the function itself)."""
    script = runpy.run_path(SCRIPT)
    target = tmp_path / "v1" / "numa-pin"
    link = tmp_path / "numa-pin"
    assert script["linked"](str(link), str(target)) is False  # nothing there
    link.write_text("#!/usr/bin/python3\n")
    assert script["linked"](str(link), str(target)) is False  # a launcher of the layout before versions
    link.unlink()
    link.symlink_to(target)
    assert script["linked"](str(link), str(target)) is True
    assert script["linked"](str(link), str(tmp_path / "v2" / "numa-pin")) is False


@as_root
def test_a_version_launcher_another_user_owns_is_refused(trusted_dir):
    package, launcher = install(trusted_dir)
    version = os.path.join(trusted_dir, "lib", "numa-pin")
    with open(version, "w", encoding="ascii") as out:
        out.write("#!/usr/bin/python3\n")
    os.chown(version, NOBODY, NOBODY)
    result = stamp(package, launcher, version)
    assert result.returncode == 1 and "%s is owned by uid %d" % (version, NOBODY) in result.stdout


@as_root
def test_a_path_linking_into_a_users_directory_is_refused(trusted_dir):
    """The path is root's link, but the launcher it resolves to sits where another user may write."""
    package, launcher = install(trusted_dir)
    users = os.path.join(trusted_dir, "users")
    os.mkdir(users, 0o755)
    os.chown(users, NOBODY, NOBODY)
    target = os.path.join(users, "numa-pin")
    with open(target, "w", encoding="ascii") as out:
        out.write("#!/usr/bin/python3\n")
    os.unlink(launcher)
    os.symlink(target, launcher)
    result = stamp(package, launcher, os.path.join(trusted_dir, "lib", "numa-pin"))
    assert result.returncode == 1 and "%s is owned by uid %d" % (users, NOBODY) in result.stdout


# --- the role's versioned install, through ansible-playbook ------------------------------------------------

HELPER_PLAY = """\
- name: Install the numa-pin helper as numa_host does
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Install it
      ansible.builtin.include_role:
        name: inferops.numa.numa_host
        tasks_from: helper
"""


class Host:
    """A numa_host helper install under a directory only root may write: lib/ (numa_host_helper_dir), bin/numa-pin
    (numa_host_helper_path), units/ (where the prune looks for unit files), and the package copied to src/numa."""

    def __init__(self, base, tmp_path):
        self.base = base
        self.lib = os.path.join(base, "lib")
        self.path = os.path.join(base, "bin", "numa-pin")
        self.units = os.path.join(base, "units")
        self.source = str(tmp_path / "src" / "numa")
        self.playbook = tmp_path / "helper.yml"
        self.playbook.write_text(HELPER_PLAY)
        os.makedirs(self.units, mode=0o755)
        shutil.copytree(PACKAGE, self.source, ignore=shutil.ignore_patterns("__pycache__"))

    def change_the_helper(self, text):
        with open(os.path.join(self.source, "cli", "numa_pin.py"), "a", encoding="utf-8") as out:
            out.write("\n# %s\n" % text)

    def install(self, *extra):
        variables = {"numa_host_helper_dir": self.lib, "numa_host_helper_path": self.path,
                     "numa_host_helper_source": self.source, "_numa_host_helper_unit_dirs": [self.units]}
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        done = subprocess.run([ansible_command("ansible-playbook"), "-i", "localhost,", str(self.playbook),
                               "-e", json.dumps(variables), "-e", "ansible_python_interpreter=%s" % sys.executable]
                              + list(extra),
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
        return done.returncode, done.stdout + done.stderr

    def versions(self):
        return sorted(name for name in os.listdir(self.lib) if name != "numa")

    def current(self):
        target = os.readlink(self.path)
        assert os.path.dirname(os.path.dirname(target)) == self.lib and target.endswith("/numa-pin"), target
        return os.path.basename(os.path.dirname(target))


def _changed(output):
    (line,) = [line for line in output.splitlines() if line.startswith("localhost ") and "changed=" in line]
    return int(line.split("changed=")[1].split()[0])


@pytest.fixture
def helper_host(trusted_dir, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the role installs root-owned files and checks that only root may write them")
    return Host(trusted_dir, tmp_path)


def test_the_helper_goes_into_a_directory_of_its_version_and_the_path_links_to_it(helper_host):
    code, output = helper_host.install()
    assert code == 0, output
    (version,) = helper_host.versions()
    assert len(version) == 12 and int(version, 16) >= 0
    assert os.path.islink(helper_host.path) and helper_host.current() == version
    home = os.path.join(helper_host.lib, version)
    with open(os.path.join(home, "numa-pin")) as launcher:
        assert json.dumps(home) in launcher.read()
    assert os.path.isfile(os.path.join(home, "numa", ".installed"))
    facts = subprocess.run([helper_host.path, "facts"], capture_output=True, text=True, timeout=60, check=False)
    assert facts.returncode == 0 and "nodes" in json.loads(facts.stdout), facts.stderr
    code, output = helper_host.install()
    assert code == 0 and _changed(output) == 0, output


def test_a_dry_run_on_a_fresh_host_shows_the_versioned_launcher_and_changes_nothing(helper_host):
    code, output = helper_host.install("--check", "--diff")
    assert code == 0, output
    assert sorted(os.listdir(helper_host.base)) == ["units"], output
    # The launcher's diff (headed by its path from ansible-core 2.19 on, by a temporary file's before).
    launcher = r'^\+import sys; sys\.path\.insert\(0, "%s/[0-9a-f]{12}"\); ' % re.escape(helper_host.lib)
    assert re.search(launcher, output, re.MULTILINE), output


def test_a_changed_helper_goes_beside_the_first_and_the_path_moves_to_it(helper_host):
    assert helper_host.install()[0] == 0
    (first,) = helper_host.versions()
    home = os.path.join(helper_host.lib, first)
    before = {path: os.stat(os.path.join(root, path)).st_mtime_ns for root, _dirs, files in os.walk(home)
              for path in files}
    helper_host.change_the_helper("a second version")
    code, output = helper_host.install()
    assert code == 0, output
    (second,) = set(helper_host.versions()) - {first}
    assert helper_host.current() == second
    after = {path: os.stat(os.path.join(root, path)).st_mtime_ns for root, _dirs, files in os.walk(home)
             for path in files}
    assert after == before  # the first version as it was: a unit that names it starts it unchanged
    run = subprocess.run([os.path.join(home, "numa-pin"), "--version"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stderr


def test_versions_no_unit_names_go_beyond_the_newest_three(helper_host):
    installed = []
    for number in range(5):
        helper_host.change_the_helper("version %d" % number)
        if number == 3:  # a unit still starts the first version (rolled back, or not deployed again since)
            with open(os.path.join(helper_host.units, "llama@.service"), "w", encoding="ascii") as unit:
                unit.write("[Service]\nExecStart=%s/%s/numa-pin exec --instance %%i -- /bin/true\n"
                           % (helper_host.lib, installed[0]))
        if number == 4:
            os.unlink(os.path.join(helper_host.units, "llama@.service"))
        code, output = helper_host.install()
        assert code == 0, output
        installed.append(helper_host.current())
        if number == 3:
            assert helper_host.versions() == sorted(installed), "the unit's version was removed"
    assert len(set(installed)) == 5
    assert helper_host.versions() == sorted(installed[2:])


def test_a_helper_directory_another_user_may_write_is_refused_and_the_path_kept(helper_host):
    assert helper_host.install()[0] == 0
    first = helper_host.current()
    os.chmod(helper_host.lib, 0o775)
    helper_host.change_the_helper("a second version")
    code, output = helper_host.install()
    assert code != 0
    assert "%s is writable by group or others (mode 0775)" % helper_host.lib in output, output
    assert helper_host.current() == first and helper_host.versions() == [first]


def test_an_install_from_before_versions_moves_to_a_version_and_stays_trusted(helper_host):
    """The layout before versions: the package in lib/numa and a launcher file at the path. The path becomes a
    link, the old package stays (counted among the newest three) and nothing is refused."""
    legacy = os.path.join(helper_host.lib, "numa")
    os.makedirs(legacy, mode=0o755)
    with open(os.path.join(legacy, ".installed"), "w", encoding="ascii") as out:
        out.write("old abc\n")
    os.makedirs(os.path.dirname(helper_host.path), mode=0o755)
    with open(helper_host.path, "w", encoding="ascii") as out:
        out.write("#!/usr/bin/python3\nimport sys; sys.path.insert(0, %r)\n" % helper_host.lib)
    os.chmod(helper_host.path, 0o755)
    code, output = helper_host.install()
    assert code == 0, output
    assert os.path.islink(helper_host.path) and len(helper_host.versions()) == 1 and os.path.isdir(legacy)


# --- numa_host_state absent: the role taken back ------------------------------------------------------------

ABSENT_PLAY = """\
- name: Set the knobs, then take numa_host back as numa_host_state absent does
  hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    group/inferops.numa.numa:
      root: {root}
  tasks:
    - name: Set the knobs as the role's present state does
      inferops.numa.numa_balancing:
        state: disabled
      when: set_knobs | default(false) | bool
    - name: Set the weights as the role's present state does
      inferops.numa.numa_weights:
        source: hmat
      when: set_knobs | default(false) | bool
    - name: Take it back
      ansible.builtin.include_role:
        name: inferops.numa.numa_host
        tasks_from: absent
      when: not (set_knobs | default(false) | bool)
"""


def test_state_absent_restores_the_knobs_removes_the_helper_and_the_textfile_and_runs_again_unchanged(
        helper_host, tmp_path):
    from tests.fixtures import sysfs
    from tests.unit.balancing_fakeroot import FakeRoot

    root = str(tmp_path / "knobs")
    sysfs.snc2_cxl().write(root)
    FakeRoot(root).knobs(balancing=1, zone_reclaim=0)
    knob_files = ["proc/sys/kernel/numa_balancing"] + ["sys/kernel/mm/mempolicy/weighted_interleave/node%d" % node
                                                        for node in range(5)]
    before = {name: open(os.path.join(root, name)).read() for name in knob_files}
    metrics = os.path.join(helper_host.base, "metrics")
    os.mkdir(metrics, 0o755)
    with open(os.path.join(metrics, "inferops_numa.prom"), "w", encoding="ascii") as out:
        out.write("inferops_numa_up 1\n")
    assert helper_host.install()[0] == 0
    helper_host.playbook.write_text(ABSENT_PLAY.format(root=root))
    code, output = helper_host.install("-e", "set_knobs=true")
    assert code == 0 and {name: open(os.path.join(root, name)).read() for name in knob_files} != before, output

    code, output = helper_host.install("-e", "numa_host_metrics_dir=" + metrics)
    assert code == 0 and _changed(output) > 0, output
    assert {name: open(os.path.join(root, name)).read() for name in knob_files} == before
    assert not os.path.exists(os.path.join(root, "etc/sysctl.d/60-inferops-numa.conf"))
    assert not os.path.exists(os.path.join(root, "etc/tmpfiles.d/60-inferops-numa-weights.conf"))
    assert os.listdir(os.path.join(root, "var/lib/inferops-numa/originals")) == []
    assert not os.path.lexists(helper_host.path) and not os.path.exists(helper_host.lib)
    assert os.listdir(metrics) == []

    code, output = helper_host.install("-e", "numa_host_metrics_dir=" + metrics)
    assert code == 0 and _changed(output) == 0, output
