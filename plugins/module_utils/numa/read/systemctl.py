"""What systemd says about a unit: ``systemctl show``'s properties and the processes of the unit's cgroup.

The audit finds a service's processes here, numastat and the metrics ask here whether instances run.
Every call goes through a ``CommandRunner`` (argv -> exit code, stdout, stderr), so tests hand in
systemd's answers; the cgroup tree is read under the root prefix like every other kernel file.
"""

import os
import subprocess
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from ..base.errors import NumaError

# NRestarts and ExecMainStatus: a unit that systemd keeps restarting is crash-looping, whatever its ActiveState says.
UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "MainPID", "ControlGroup", "NRestarts",
                   "ExecMainStatus")
# Where a unit's ControlGroup is found: the unified hierarchy, then the legacy and hybrid layouts' trees.
CGROUP_ROOTS = ("sys/fs/cgroup", "sys/fs/cgroup/systemd", "sys/fs/cgroup/unified")

# Runs a command: argv -> (exit code, stdout, stderr).
CommandRunner = Callable[[List[str]], Tuple[int, str, str]]


def run_command(argv: List[str]) -> Tuple[int, str, str]:
    """Default runner for systemctl."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False,
                              universal_newlines=True)
    except OSError as exc:
        raise NumaError("cannot run %s: %s; audit a unit only on a host running systemd, or pass PIDs"
                        % (argv[0], exc.strerror))
    return done.returncode, done.stdout, done.stderr


def show_unit(unit: str, run: CommandRunner) -> Dict[str, str]:
    """``systemctl show`` properties of a unit (UNIT_PROPERTIES)."""
    argv = ["systemctl", "show", "--property=" + ",".join(UNIT_PROPERTIES), "--", unit]
    rc, out, err = run(argv)
    if rc != 0:
        raise NumaError("systemctl show %s failed (rc %d): %s" % (unit, rc, (err or out).strip()))
    return _properties(out.splitlines())


def show_units(units: Sequence[str], run: CommandRunner) -> Dict[str, Dict[str, str]]:
    """``systemctl show`` properties (UNIT_PROPERTIES) of several units in one call: unit -> properties.

    systemctl prints one block per unit, in the order asked, separated by an empty line.
    """
    if not units:
        return {}
    argv = ["systemctl", "show", "--property=Id," + ",".join(UNIT_PROPERTIES), "--"] + list(units)
    rc, out, err = run(argv)
    if rc != 0:
        raise NumaError("systemctl show %s failed (rc %d): %s" % (" ".join(units), rc, (err or out).strip()))
    blocks = [_properties(block.splitlines()) for block in out.strip("\n").split("\n\n")]
    if len(blocks) != len(units):
        raise NumaError("systemctl show printed %d blocks of properties for %d units: run `systemctl show %s` "
                        "to see why" % (len(blocks), len(units), " ".join(units)))
    return dict(zip(units, blocks))


def _properties(lines: Sequence[str]) -> Dict[str, str]:
    props = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            props[key] = value
    return props


def unit_pids(root: str, props: Mapping[str, str]) -> List[int]:
    """Every PID in the unit's cgroup (child cgroups too); the MainPID when the cgroup is unreadable."""
    group = props.get("ControlGroup", "").strip("/")
    if group:
        for base in CGROUP_ROOTS:
            top = os.path.join(root, base, group)
            if os.path.isdir(top):
                return _cgroup_pids(top)
    main = int(props.get("MainPID") or 0)
    return [main] if main > 0 else []


def _cgroup_pids(top: str) -> List[int]:
    pids = set()
    for directory, dummy, files in os.walk(top):
        if "cgroup.procs" not in files:
            continue
        try:
            with open(os.path.join(directory, "cgroup.procs"), encoding="ascii", errors="replace") as handle:
                # The kernel writes one PID a line; anything else is not a process of this unit.
                pids.update(int(word) for word in handle.read().split() if word.isdecimal() and word.isascii())
        except FileNotFoundError:
            continue
    return sorted(pids)
