"""Print the installed numa-pin's stamp, after checking that only root could have written what it vouches for.

Every service start runs numa-pin, often as root, so its code and launcher must be writable by root
alone: a directory on their path that another user may write (owner, or group/other write bit)
would let that user swap the code, or a stamp, that the role then trusts. Run as
``python3 -I installed_stamp.py PACKAGE_DIR LAUNCHER [VERSION_LAUNCHER]``: prints the stamp, or an empty
line when none is installed yet; exits 1 with one line naming the path, its owner and the fix when a path is
not root's alone. Each helper version has a directory of its own (PACKAGE_DIR is <version>/numa, its launcher
VERSION_LAUNCHER is <version>/numa-pin) and LAUNCHER, the path users and timers run, is a symlink to the current
version's launcher: given VERSION_LAUNCHER, it is checked too, and a second line says ``linked`` when LAUNCHER
is a symlink to exactly it, else ``unlinked``. Standard library only: it runs on the host before the helper is
installed, so it cannot import the package's safe_fs; it keeps that module's INSTALL_PATH rule itself (root
alone owns, no group or other write bit, a sticky bit excuses none, every part from / down, both as written and
as resolved), and tests/unit/test_safe_fs.py holds ``distrust`` to the same verdicts as the rule there.
"""
import errno
import os
import stat
import sys

STAMP = ".installed"
STAMP_MAX_BYTES = 4096
REFUSED_BITS = stat.S_IWGRP | stat.S_IWOTH


def untrusted(path):
    """The first part of ``path`` that someone other than root may change, with why; or None.

    Both the path as written and the path it resolves to: a root-owned symlink on the way is fine
    when every directory of its target is root's alone as well.
    """
    for spelling in (path, os.path.realpath(path)):
        problem = _untrusted_walk(spelling)
        if problem:
            return problem
    return None


def _untrusted_walk(path):
    parts = [part for part in path.split("/") if part]
    for depth in range(len(parts) + 1):
        current = "/" + "/".join(parts[:depth])
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return None  # not installed yet: the role creates the rest, owned by root
        problem = distrust(current, info)
        if problem:
            return problem
    return None


def distrust(current, info):
    """Why the part ``current`` with lstat ``info`` is not root's alone, or None. A link's own mode is
    always 0777 and means nothing: its target is judged on the realpath walk."""
    if info.st_uid != 0:
        return "%s is owned by uid %d" % (current, info.st_uid)
    if not stat.S_ISLNK(info.st_mode) and info.st_mode & REFUSED_BITS:
        return "%s is writable by group or others (mode %04o)" % (current, stat.S_IMODE(info.st_mode))
    return None


def read_stamp(package):
    try:
        fd = os.open(os.path.join(package, STAMP), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):  # none, or a symlink the role never writes: install again
            return ""
        raise
    with os.fdopen(fd, "rb") as stamp:
        info = os.fstat(stamp.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != 0:
            return ""  # not one the role wrote: install again
        return stamp.read(STAMP_MAX_BYTES).decode("ascii", "replace").strip()


def untrusted_subpackage(package):
    """The first of the package's subpackage directories (one per layer) that is not root's alone, or None."""
    try:
        names = sorted(os.listdir(package))
    except FileNotFoundError:
        return None
    for name in names:
        current = os.path.join(package, name)
        info = os.lstat(current)
        if stat.S_ISDIR(info.st_mode) or stat.S_ISLNK(info.st_mode):
            problem = distrust(current, info)
            if problem:
                return problem
    return None


def linked(launcher, version_launcher):
    """Whether ``launcher`` is a symlink whose target is exactly ``version_launcher``."""
    try:
        return os.readlink(launcher) == version_launcher
    except OSError:  # not there, or not a symlink (a launcher of the layout before versions)
        return False


def main(package, launcher, version_launcher=None):
    for path in (package, launcher) + ((version_launcher,) if version_launcher else ()):
        problem = untrusted(os.path.abspath(path)) or (path == package and untrusted_subpackage(path))
        if problem:
            print("numa-pin's install path is not root's alone: %s. Fix: make every directory of %s owned by root "
                  "and writable by root only (chown root; chmod go-w), or set numa_host_helper_dir / "
                  "numa_host_helper_path to such a place" % (problem, path))
            return 1
    try:
        print(read_stamp(package))
    except OSError as exc:
        print("cannot read numa-pin's install stamp in %s: %s. Fix: check that directory, or remove it to install "
              "afresh" % (package, exc.strerror))
        return 1
    if version_launcher:
        print("linked" if linked(launcher, version_launcher) else "unlinked")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
