#!/usr/bin/env python3
"""The container scenario's host (molecule/container): a Debian bookworm container booting systemd under podman,
reached by Ansible over SSH on 127.0.0.1. Minutes where the QEMU lab (lab/labvm.py) takes most of an hour.

    lab/container.py image                      make (once per recipe) the image, print its name
    lab/container.py up --name N --dir D        start container N, sshd on a free port of 127.0.0.1, a key made
                                                in D for this run; print {name, address, port, user, identity_file,
                                                service_ports: free ports for the scenario's services}
    lab/container.py down --name N              remove container N (nothing when there is none)
    lab/container.py snapshot --name N          print what the container holds as JSON (snapshot())
    lab/container.py name SCENARIO PROJECT      print the container name of a scenario in a checkout

The image is made like the execution environment's base (lab/ee.py debian_image: mmdebstrap offline into a tarball,
podman import), tagged by its recipe's hash, so a recipe change makes a new one and an unchanged one is reused.
podman runs with lab/ee.py's settings (runc, no default ulimits) and the host's network: no CNI plugins or slirp are
installed here, so sshd listens on a free port of 127.0.0.1 instead of 22 (the host's own sshd may hold 22), set in
a drop-in before it first starts (the image leaves ssh.service disabled for that).

What a container cannot do: it shares the host's kernel, and podman mounts /proc/sys and /sys read only, so kernel
knobs (kernel.numa_balancing, vm.zone_reclaim_mode, weighted-interleave weights) can be read and not written; its
NUMA layout is the host's (one node here). The scenario's variables ask the roles for nothing that writes them.
"""

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ee  # noqa: E402  (lab/ is not a package)

# --- the image's recipe: every constant here feeds its tag --------------------------------------------------
RECIPE_VERSION = 1
REPOSITORY = "localhost/inferops-numa-systemd"
# systemd-sysv: /sbin/init; dbus: systemctl's bus to PID 1 as the roles use it; sudo: Ansible's become as root;
# procps: ps and pgrep, which the checks and an operator read the services with.
PACKAGES = ["systemd-sysv", "dbus", "python3", "openssh-server", "sudo", "procps"]
HOOKS = [
    # sshd starts once `up` has written its port (host network: port 22 would collide with the host's sshd).
    "chroot \"$1\" systemctl disable ssh.service >/dev/null 2>&1",
    # A container needs no getty on a console it does not have; the system's own timers (apt's downloads, dpkg's
    # backup, e2scrub, fstrim) would change files while a check compares snapshots taken around a run.
    "chroot \"$1\" systemctl mask console-getty.service getty@tty1.service apt-daily.timer apt-daily-upgrade.timer "
    "dpkg-db-backup.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true",
]
USER = "root"
SERVICE_PORTS = 2
SSHD_DROPIN = "/etc/ssh/sshd_config.d/10-inferops-container.conf"
# Seconds to wait for systemd to finish booting, then for sshd to answer.
BOOT_SECONDS = 60
SSH_SECONDS = 30

# What snapshot() reads: every file under ROOTS but the ones under SKIPPED, which change on their own (journals,
# caches, Ansible's own temporary files, systemd's random seed and timer stamps of the system's own timers).
ROOTS = ["/etc", "/usr/local", "/opt", "/srv", "/var/lib", "/home", "/root", "/usr/lib/systemd/system"]
SKIPPED = ["/var/lib/systemd/random-seed", "/var/lib/systemd/catalog", "/var/lib/systemd/deb-systemd-helper-masked",
           "/var/lib/apt/lists", "/var/lib/dpkg/lock", "/var/lib/private/systemd", "/root/.ansible", "/root/.cache",
           "/etc/ld.so.cache",
           # shadow's backups of the previous version, rewritten by every useradd and userdel: after a user is added
           # and removed they hold the version with it. The files themselves (/etc/passwd ...) are compared.
           "/etc/passwd-", "/etc/group-", "/etc/shadow-", "/etc/gshadow-", "/etc/subuid-", "/etc/subgid-"]
# The kernel knobs the roles set, each stood in for by a file of the container's (stand_in_knobs), at the value a
# kernel with two or more nodes boots with: numa_host (balancing auto: disabled on this one-node host) changes it, and
# numa_host_state absent must put it back.
STAND_IN_KNOBS = {"/proc/sys/kernel/numa_balancing": "1"}
STAND_IN_DIR = "/run/inferops-lab-knobs"
# Knobs read (never written here): a removal must leave them at the values they had.
KNOBS = ["/proc/sys/kernel/numa_balancing", "/proc/sys/vm/zone_reclaim_mode"]
# Units that come and go with logins (Ansible's SSH sessions), not with what the roles do.
TRANSIENT_UNITS = ("session-", "user@", "user-", "user-runtime-dir@", "run-")


class ContainerError(Exception):
    """A step that cannot run, with the cause and the fix."""


def recipe() -> Dict[str, object]:
    return {"version": RECIPE_VERSION, "suite": ee.SUITE, "variant": "minbase", "packages": sorted(PACKAGES),
            "hooks": HOOKS, "mirror": ee.MIRROR}


def image_name() -> str:
    blob = json.dumps(recipe(), sort_keys=True).encode()
    return "%s:%s" % (REPOSITORY, hashlib.sha256(blob).hexdigest()[:16])


def ensure_image(log=sys.stderr) -> str:
    name = image_name()
    if ee.image_exists(name):
        return name
    ee.debian_image(name, PACKAGES, HOOKS, "the container scenario's systemd image", "/sbin/init", log)
    # The images of earlier recipes are never used again: drop them (one that a container still runs stays).
    listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", REPOSITORY, check=False).stdout.split()
    for old in listed:
        if old != name:
            podman("rmi", old, check=False)
    return name


def container_name(scenario: str, project: str) -> str:
    """One container per scenario and checkout: two worktrees on one machine never share, nor remove, one."""
    checkout = hashlib.sha256(os.path.realpath(project).encode()).hexdigest()[:8]
    return "molecule-%s-%s" % (scenario, checkout)


def podman(*argv: str, check: bool = True, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
    """podman with lab/ee.py's settings; its output captured."""
    try:
        done = subprocess.run(["podman"] + list(argv), env=ee.podman_environment(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise ContainerError("podman is not installed; run make apt (Debian: apt-get install podman runc)")
    if check and done.returncode != 0:
        raise ContainerError("podman %s failed (exit %d): %s" % (" ".join(argv[:3]), done.returncode,
                                                                done.stderr.strip()[-2000:]))
    return done


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def exists(name: str) -> bool:
    return podman("container", "exists", name, check=False).returncode == 0


def down(name: str) -> bool:
    """Remove the container; False when there was none."""
    if not exists(name):
        return False
    podman("rm", "--force", "--time", "5", name, timeout=120)
    return True


def _wait(what: str, seconds: float, check) -> None:
    deadline = time.monotonic() + seconds
    while True:
        last = check()
        if last is True:
            return
        if time.monotonic() > deadline:
            raise ContainerError("%s: not within %.0f s (last: %s)" % (what, seconds, last))
        time.sleep(0.5)


def up(name: str, directory: Path, log=sys.stderr) -> Dict[str, object]:
    """A fresh container ``name`` booted and answering SSH; a key made in ``directory`` for it."""
    image = ensure_image(log)
    started = time.monotonic()
    down(name)  # a container left by a run that was killed
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "id_ed25519"
    for path in (key, Path(str(key) + ".pub")):
        if path.exists():
            path.unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    port = free_port()
    # --systemd=always: podman mounts what systemd needs (cgroups, tmpfs on /run) and stops it with SIGRTMIN+3.
    # SYS_PTRACE: the deployment's audit reads /proc/<pid>/numa_maps of a service running as another user, which a
    # container's default capabilities do not allow (the preflight refuses audit: true without it).
    podman("run", "--detach", "--name", name, "--hostname", name, "--systemd=always", "--network=host",
           "--cap-add", "SYS_PTRACE", image, "/sbin/init", timeout=120)

    def booted():
        state = podman("exec", name, "systemctl", "is-system-running", check=False).stdout.strip()
        # degraded: a unit of the base system that cannot run in a container; the roles' units are checked apart.
        return True if state in ("running", "degraded") else state or "no answer"
    _wait("systemd booting in %s" % name, BOOT_SECONDS, booted)
    stand_in_knobs(name)
    public = Path(str(key) + ".pub").read_text()
    setup = ("set -e; umask 077; mkdir -p /root/.ssh; printf '%%s' \"$1\" > /root/.ssh/authorized_keys; "
             "printf 'Port %d\\nListenAddress 127.0.0.1\\nPasswordAuthentication no\\n' > %s; "
             "systemctl enable --now ssh.service >/dev/null 2>&1" % (port, SSHD_DROPIN))
    podman("exec", name, "sh", "-c", setup, "sh", public, timeout=60)
    ssh = ["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
           "%s@127.0.0.1" % USER, "true"]

    def answers():
        done = subprocess.run(ssh, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                              check=False)
        return True if done.returncode == 0 else done.stdout.strip()[-200:] or "exit %d" % done.returncode
    _wait("sshd in %s answering on 127.0.0.1:%d" % (name, port), SSH_SECONDS, answers)
    print("container: %s up in %.1f s, sshd on 127.0.0.1:%d" % (name, time.monotonic() - started, port), file=log)
    # Ports for the scenario's services, free now: on the host's network two checkouts running the scenario at once
    # would otherwise collide.
    return {"name": name, "address": "127.0.0.1", "port": port, "user": USER, "identity_file": str(key),
            "service_ports": [free_port() for _ in range(SERVICE_PORTS)]}


def stand_in_knobs(name: str) -> None:
    """A file of the container's own mounted over each knob of STAND_IN_KNOBS, holding the value a NUMA machine's
    kernel boots with: the container shares the host's kernel, whose /proc/sys podman mounts read-only, so the roles
    set, and a removal puts back, the stand-in, never the host's knob (the QEMU lab sets the kernel's own). The mount
    is made in the container's mount namespace, by an exec with the capabilities the container itself lacks."""
    script = ["set -e; mkdir -p %s" % STAND_IN_DIR]
    for knob, value in STAND_IN_KNOBS.items():
        stand_in = "%s/%s" % (STAND_IN_DIR, os.path.basename(knob))
        script.append("printf '%%s\\n' %s > %s; mount --bind %s %s" % (value, stand_in, stand_in, knob))
    podman("exec", "--privileged", name, "sh", "-c", "; ".join(script), timeout=30)


# --- what the container holds -------------------------------------------------------------------------------

# Run in the container by its python3: every file under the roots (type, mode, owner, and a regular file's sha256),
# the users and groups, the unit files and the loaded units with their states, the knobs.
_SNAPSHOT_SCRIPT = r'''
import hashlib, json, os, stat, subprocess, sys
roots, skipped, knobs = json.loads(sys.argv[1])
files = {}
def skip(path):
    return any(path == s or path.startswith(s.rstrip("/") + "/") for s in skipped)
for root in roots:
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not skip(os.path.join(top, d))]
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        for entry in [top] + [os.path.join(top, n) for n in names + links]:
            if skip(entry) or entry in files:
                continue
            try:
                st = os.lstat(entry)
            except OSError:
                continue
            what = "%o %d:%d" % (st.st_mode, st.st_uid, st.st_gid)
            if stat.S_ISLNK(st.st_mode):
                what += " -> " + os.readlink(entry)
            elif stat.S_ISREG(st.st_mode):
                with open(entry, "rb") as handle:
                    what += " " + hashlib.sha256(handle.read()).hexdigest()
            files[entry] = what
def lines(argv):
    return subprocess.run(argv, stdout=subprocess.PIPE, universal_newlines=True).stdout.splitlines()
units = {}
for line in lines(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager"]):
    words = line.split()
    if len(words) >= 4:
        units[words[0]] = "%s %s" % (words[2], words[3])
unit_files = {}
for line in lines(["systemctl", "list-unit-files", "--no-legend", "--no-pager"]):
    words = line.split()
    if len(words) >= 2:
        unit_files[words[0]] = words[1]
def read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError as exc:
        return "unreadable: %s" % exc.strerror
print(json.dumps({
    "files": files,
    "users": sorted(line.split(":")[0] for line in lines(["getent", "passwd"])),
    "groups": sorted(line.split(":")[0] for line in lines(["getent", "group"])),
    "units": units, "unit_files": unit_files,
    "knobs": {knob: read(knob) for knob in knobs},
}))
'''


def snapshot(name: str) -> Dict[str, object]:
    """What container ``name`` holds now: files (path: "mode uid:gid [sha256|-> target]"), users, groups, units
    (loaded unit: "active sub"), unit_files (unit file: its enablement) and knobs (path: value)."""
    done = podman("exec", name, "python3", "-c", _SNAPSHOT_SCRIPT, json.dumps([ROOTS, SKIPPED, KNOBS]),
                  timeout=120)
    taken = json.loads(done.stdout)
    taken["units"] = {unit: state for unit, state in taken["units"].items() if not unit.startswith(TRANSIENT_UNITS)}
    return taken


def differences(before: Dict[str, object], after: Dict[str, object], ignore: List[str] = ()) -> List[str]:
    """What changed from ``before`` to ``after`` (snapshot()s), one line each: "+ files /etc/x", "- users llama",
    "~ units llama@0.service: inactive dead -> active running"; empty when nothing did. ``ignore`` holds prefixes of
    the items ("/var/lib/systemd/timers/") to leave out."""
    found = []
    for kind in ("files", "users", "groups", "units", "unit_files", "knobs"):
        old, new = before.get(kind, {}), after.get(kind, {})
        if isinstance(old, list):
            old, new = dict.fromkeys(old, ""), dict.fromkeys(new, "")
        for item in sorted(set(old) | set(new)):
            if any(item.startswith(prefix) for prefix in ignore):
                continue
            if item not in old:
                found.append("+ %s %s" % (kind, item))
            elif item not in new:
                found.append("- %s %s" % (kind, item))
            elif old[item] != new[item]:
                found.append("~ %s %s: %s -> %s" % (kind, item, old[item], new[item]))
    return found


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="container.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("image")
    for command in ("up", "down", "snapshot"):
        each = sub.add_parser(command)
        each.add_argument("--name", required=True)
        if command == "up":
            each.add_argument("--dir", required=True, type=Path)
    naming = sub.add_parser("name")
    naming.add_argument("scenario")
    naming.add_argument("project")
    args = parser.parse_args(argv)
    try:
        if args.command == "image":
            print(ensure_image())
        elif args.command == "up":
            print(json.dumps(up(args.name, args.dir)))
        elif args.command == "down":
            print("removed" if down(args.name) else "absent")
        elif args.command == "snapshot":
            print(json.dumps(snapshot(args.name), indent=1, sort_keys=True))
        else:
            print(container_name(args.scenario, args.project))
    except (ContainerError, ee.EEError) as exc:
        print("container: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
