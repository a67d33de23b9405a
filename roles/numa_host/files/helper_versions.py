"""Print the numa-pin versions to remove, one directory a line: those no unit names, beyond the newest few.

Each helper version lives in a directory of its own under the helper directory, named by the first 12 hex digits
of its digest (<version>/numa, the package, and <version>/numa-pin, its launcher); the directory ``numa`` is the
package of the layout before versions. A unit file names the launcher of the version it starts, so a unit that was
rolled back, or not deployed again since (a host whose rollout stopped, a service taken out of the list but still
enabled), starts that version at its next start or crash restart: a version some unit file (or drop-in, or a kept
``.previous`` copy) names is never removed, whatever its age. Of the others the newest KEEP, counting the current
one, stay as a way back by hand, and the rest go; the newest is the one whose install stamp was written last.

Run as ``python3 -I helper_versions.py HELPER_DIR CURRENT KEEP UNIT_DIR...``. Read-only; standard library only.
"""
import os
import re
import stat
import sys

VERSION = re.compile(r"^(?:[0-9a-f]{12}|numa)$")
STAMP = ".installed"
UNIT_FILE_MAX_BYTES = 1 << 20


def versions(helper_dir):
    """[path] of the version directories, newest install first."""
    try:
        names = os.listdir(helper_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        path = os.path.join(helper_dir, name)
        info = os.lstat(path)
        if not VERSION.match(name) or not stat.S_ISDIR(info.st_mode):
            continue
        package = path if name == "numa" else os.path.join(path, "numa")
        try:
            installed = os.lstat(os.path.join(package, STAMP)).st_mtime
        except OSError:  # an install that did not finish: its directory's time
            installed = info.st_mtime
        found.append((installed, path))
    return [path for _installed, path in sorted(found, reverse=True)]


def named_by_units(unit_dirs, paths):
    """The ``paths`` some regular file under ``unit_dirs`` names (as ``<path>/``); links and masks are not read."""
    wanted = {path: (path + "/").encode() for path in paths}
    found = set()
    for top in unit_dirs:
        for root, _dirs, files in os.walk(top):
            for name in files:
                unit = os.path.join(root, name)
                try:
                    if not stat.S_ISREG(os.lstat(unit).st_mode):
                        continue
                    with open(unit, "rb") as handle:
                        text = handle.read(UNIT_FILE_MAX_BYTES)
                except OSError:
                    continue
                found.update(path for path, needle in wanted.items() if needle in text)
    return found


def to_remove(helper_dir, current, keep, unit_dirs):
    current = os.path.join(helper_dir, os.path.basename(current.rstrip("/")))
    others = [path for path in versions(helper_dir) if path != current]
    kept = set(others[:max(keep - 1, 0)])
    named = named_by_units(unit_dirs, others)
    return [path for path in others if path not in kept and path not in named]


def main(helper_dir, current, keep, *unit_dirs):
    for path in to_remove(helper_dir, current, int(keep), unit_dirs):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
