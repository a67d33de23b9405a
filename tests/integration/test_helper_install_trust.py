"""numa_host trusts an installed numa-pin (and skips installing it) only where root alone can write it."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.unit.conftest import trusted_dir  # noqa: F401 (a fixture)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "roles", "numa_host", "files", "installed_stamp.py")
NOBODY = 65534

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: builds root-owned trees and chowns them away")


def stamp(package, launcher):
    """The role's call: the script's text through -I -c, as the task passes it."""
    with open(SCRIPT, encoding="utf-8") as script:
        text = script.read()
    return subprocess.run([sys.executable, "-I", "-c", text, package, launcher],
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
