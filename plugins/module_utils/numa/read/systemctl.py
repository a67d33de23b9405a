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

# docker's container ids (--cidfile): 64 lowercase hexadecimal digits.
_CONTAINER_ID_LENGTH = 64
_HEX_DIGITS = "0123456789abcdef"

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


def container_pids(root: str, cid_path: str) -> List[int]:
    """Every PID in the cgroup of the docker container whose id docker wrote to ``cid_path`` (``--cidfile``): the
    systemd driver's ``docker-<id>.scope`` or cgroupfs' ``docker/<id>``. NumaError when the id file is missing or
    is not an id, or no cgroup has it: the container is not running."""
    container_id = _read_container_id(os.path.join(root, cid_path.lstrip("/")))
    for base in CGROUP_ROOTS:
        for group in ("system.slice/docker-%s.scope" % container_id, "docker/%s" % container_id):
            top = os.path.join(root, base, group)
            if os.path.isdir(top) and not os.path.islink(top):
                return _cgroup_pids(top)
    raise NumaError("no cgroup holds the container %s (id from %s): is it running? `docker ps` shows it"
                    % (container_id[:12], cid_path))


def _read_container_id(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            text = handle.read(_CONTAINER_ID_LENGTH + 2).decode("ascii", "replace").strip()
    except OSError as exc:
        raise NumaError("cannot read the container id file %s (%s): the instance's container is not running, or "
                        "was not started by its unit" % (path, exc.strerror))
    if len(text) != _CONTAINER_ID_LENGTH or text.strip(_HEX_DIGITS):
        raise NumaError("%s holds no container id (64 hexadecimal digits): restart the instance so docker writes it "
                        "again" % path)
    return text


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
