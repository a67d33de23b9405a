#!/usr/bin/env python3
"""QEMU lab machine: an emulated dual-socket, two-NUMA-node Debian guest.

The controller here has one NUMA node, so placement can only be proven on a real
kernel inside QEMU, whose NUMA topology (SRAT/SLIT, a PCI expander on node 1) the
guest kernel reads exactly like hardware.

    labvm.py image                          build (once) the cached guest image, print its dir
    labvm.py up --name N [--numa 2|1|5]     boot (or reuse) guest N, print its connection JSON
    labvm.py relayout --name N --numa 1|2|5 power guest N off and boot its same disk with another topology
    labvm.py info N                         print running guest N's connection JSON (ports, share dir)
    labvm.py budget N SECONDS               a wait budget: SECONDS as measured on the reference machine,
                                            scaled by guest N's calibration, times a safety margin
    labvm.py down --name N                  stop guest N and drop its state
    labvm.py ssh N -- CMD...                run CMD in guest N
    labvm.py reboot-wait N                  reboot guest N, wait until SSH answers again
    labvm.py status                         list guests with their state
    labvm.py molecule-name                  the VM name of this checkout's molecule scenario
                                            ($MOLECULE_SCENARIO_NAME, $MOLECULE_PROJECT_DIRECTORY: default, this one)

Importable from tests: up(), down(), relayout(), instance(), budget(), run_ssh(),
put_file(), wait_for_ssh(), reboot_wait(), status().

Emulation speed differs 2-3x between machines of the same kind, so no wait here or in
the lab's tests is a fixed constant: every boot times a fixed workload in the guest
(calibrate()), and budget() scales a duration measured on the reference machine by it.
Python stdlib only; `image` needs root (mmdebstrap, mke2fs -d keeps ownership).
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Union

# --- image recipe: every constant here feeds the image hash -----------------

RECIPE_VERSION = 1
SUITE = "bookworm"
# Weighted interleave (MPOL_WEIGHTED_INTERLEAVE and its sysfs weights) came in Linux 6.9; bookworm
# ships 6.1, its backports 6.12.
KERNEL_PACKAGE = "linux-image-amd64/bookworm-backports"
VARIANT = "minbase"
# numactl and hwloc are deliberately absent: the collection must place processes
# without them (numa-pin does the syscalls itself).
PACKAGES = [
    KERNEL_PACKAGE, "systemd-sysv", "openssh-server", "python3", "iproute2",
    "ifupdown", "isc-dhcp-client", "udev", "kmod", "procps", "libgomp1", "curl",
    "ca-certificates",
    # Serves numa-pin metrics' textfile on :9100 (numa_host_node_exporter: true in converge.yml).
    "prometheus-node-exporter",
    # Containers in the guest (rootful, --network host only). Without Recommends (mmdebstrap's default) podman
    # brings conmon and containers-common; buildah, slirp4netns, uidmap, fuse-overlayfs and catatonit are not
    # needed for rootful host-network containers on kernel overlayfs. runc, netavark and gpg are named so that apt
    # satisfies podman's "crun | runc", "container-network-stack" and libgpgme11's "gnupg | gpg" with them: crun
    # 1.8.1 needs the D-Bus system bus for systemd cgroups (the guest has none: "crun: cannot open sd-bus"), runc
    # falls back to systemd's private socket; containernetworking-plugins with iptables (47 MB) and all of gnupg
    # (9 MB) are not needed. containers.conf below selects runc.
    "podman", "runc", "netavark", "gpg",
    # docker, for the check that its containers are bound by their cgroup cpuset (tests/test_containers.py): 20.10
    # with containerd and the runc above, ~256 MB installed; not started at boot (DISABLED_UNITS).
    "docker.io",
    # Balances the interrupts numa_irqs does not own: the lab proves the two share a host (test_lab.py, which enables
    # it: not started at boot before, so the checks before it run as they did without it).
    "irqbalance",
]
MIRRORS = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian bookworm-backports main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
]
DISK_SIZE = "3G"
GUEST_SHARE_DIR = "/mnt/lab"
HOSTNAME = "numa-lab"
# Timers and services that only cost boot time (or wake the guest) under TCG.
# Installed but not started at boot: only the check that needs them starts them (dockerd costs ~7 s and ~80 MB).
DISABLED_UNITS = ["docker.service", "docker.socket", "containerd.service", "irqbalance.service"]
MASKED_UNITS = [
    "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer",
    "e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer", "man-db.timer",
    "logrotate.timer", "systemd-tmpfiles-clean.timer", "systemd-timesyncd.service",
    "systemd-firstboot.service", "getty@tty1.service", "getty-static.service",
    # Each took ~6 s under TCG, and nothing in the lab uses loop, dm or fuse.
    "modprobe@loop.service", "modprobe@dm_mod.service", "modprobe@fuse.service",
    # `udevadm settle` before ifup cost ~18 s; eth0 is brought up on hotplug instead.
    "ifupdown-pre.service",
]
GUEST_FILES = {
    "etc/hostname": HOSTNAME + "\n",
    "etc/hosts": "127.0.0.1 localhost\n127.0.1.1 %s\n" % HOSTNAME,
    # The host's share (read-only 9p, see qemu_argv), mounted on first use; nofail: boots without it.
    "etc/fstab": ("/dev/vda / ext4 defaults,noatime 0 1\n"
                  "%s %s 9p trans=virtio,version=9p2000.L,ro,nofail,noauto,x-systemd.automount 0 0\n"
                  % ("labshare", GUEST_SHARE_DIR)),
    "etc/network/interfaces": (
        "auto lo\niface lo inet loopback\n\nallow-hotplug eth0\niface eth0 inet dhcp\n"
    ),
    # Reverse DNS of the slirp peer would stall every login by seconds.
    "etc/ssh/sshd_config.d/lab.conf": (
        "UseDNS no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
    ),
    # The journal on disk is pointless for throw-away overlays.
    "etc/systemd/journald.conf.d/lab.conf": "[Journal]\nStorage=volatile\n",
    # A unit stuck at shutdown would otherwise stall every reboot for 90 s.
    "etc/systemd/system.conf.d/lab.conf": "[Manager]\nDefaultTimeoutStopSec=20s\n",
    # The default initrd carries most drivers and its udev coldplug cost ~14 s
    # under TCG; the guest only needs its virtio disk and ext4 to find root.
    "etc/initramfs-tools/conf.d/lab.conf": "MODULES=list\n",
    "etc/initramfs-tools/modules": "virtio_pci\nvirtio_blk\next4\n",
    # dockerd with the host's network only: no bridge, no iptables rules (the lab's containers use --network host).
    "etc/docker/daemon.json": '{"bridge": "none", "iptables": false, "ip-masq": false}\n',
    # podman 4.3 defaults to crun, which is not installed (see PACKAGES).
    "etc/containers/containers.conf": "[engine]\nruntime = \"runc\"\n",
}
# Python caches no bytecode for zip imports, so each Ansible module run in the guest compiled
# ansible.module_utils again (~4 s of a ~8 s run under TCG); this hook caches it (see the file).
_PYC_HOOK = (Path(__file__).resolve().parent / "guest" / "inferops_lab_pyc.py").read_text()
GUEST_FILES["usr/lib/python3/dist-packages/inferops_lab_pyc.py"] = _PYC_HOOK
GUEST_FILES["usr/lib/python3/dist-packages/inferops-lab-pyc.pth"] = "import inferops_lab_pyc\n"
DPKG_OPTS = [
    "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright", "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
]

# --- runtime constants (not part of the image) -------------------------------

# clocksource=tsc: the kernel otherwise picks the HPET under TCG, and every clock read becomes an
# emulated MMIO access; with the TSC (derived from the host clock under TCG) Python starts ~35 % faster.
# apparmor=0: the image has no AppArmor profiles (nor apparmor_parser), and with the LSM on, dockerd refuses to run a
# container without loading its default profile.
KERNEL_ARGS = ("root=/dev/vda rw console=ttyS0 net.ifnames=0 mitigations=off "
               "clocksource=tsc tsc=reliable apparmor=0")
SSH_USER = "root"
# Boots come before any calibration, so this cap is fixed: over 10x the 60-70 s a boot to SSH takes
# on the reference machine. Waiting stops early when QEMU exits.
BOOT_TIMEOUT = 900.0
# A boot whose console prints nothing for this long while SSH does not answer has hung: seen once under TCG on a
# loaded host, the kernel stopped after "sched_clock: Marking stable" and never went on. A normal boot's console
# is never silent for a minute before sshd answers (the longest gap measured: ~25 s); the guest is then reset
# through QEMU's monitor, at most MAX_RESETS times per wait.
CONSOLE_STALL_SECONDS = 240.0
MAX_RESETS = 2
# The fixed workload timed in the guest at every boot: Python starts (what every Ansible module and
# numa-pin pay) and a pure-Python loop (the guest's CPU speed under TCG).
CALIBRATION_SCRIPT = """
import subprocess, sys, time
start = time.perf_counter()
for _ in range(3):
    subprocess.run([sys.executable, "-I", "-c", "import json, subprocess"], check=True)
middle = time.perf_counter()
total = 0
for i in range(300000):
    total += i * i
print("%.4f %.4f" % ((middle - start) / 3, time.perf_counter() - middle))
"""
# What that workload took on the reference machine (2 cores, Debian 12, QEMU 7.2 TCG, no other load),
# where the reference durations that the lab's waits are given in were measured.
REFERENCE_CALIBRATION = {"python_start_s": 0.5, "cpu_loop_s": 0.5}
# A wait gets this many times the duration it needs, scaled to the guest at hand.
BUDGET_MARGIN = 10
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
SSH_OPTIONS = [
    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
]

PathLike = Union[str, Path]
# A step that takes longer says it is still at it this often (image build, boot and SSH wait, reboot).
PROGRESS_SECONDS = 10.0
PROGRESS_DETAIL = 100


class LabError(Exception):
    """A lab failure whose message names the cause and the fix."""


# --- paths ------------------------------------------------------------------

def cache_root() -> Path:
    """Root of images and run state; INFEROPS_NUMA_CACHE overrides ~/.cache."""
    override = os.environ.get("INFEROPS_NUMA_CACHE")
    if override:
        return Path(override)
    return Path(os.path.expanduser("~/.cache/inferops-numa"))


def recipe() -> Dict[str, object]:
    """Everything that determines the image bytes, hashed into its cache key."""
    return {
        "version": RECIPE_VERSION, "suite": SUITE, "variant": VARIANT,
        "packages": sorted(PACKAGES), "mirrors": MIRRORS, "disk_size": DISK_SIZE,
        "masked_units": sorted(MASKED_UNITS), "disabled_units": sorted(DISABLED_UNITS), "files": GUEST_FILES,
        "dpkg_opts": DPKG_OPTS,
    }


def recipe_hash() -> str:
    blob = json.dumps(recipe(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def image_dir() -> Path:
    return cache_root() / "images" / recipe_hash()


def share_dir(state: Path) -> Path:
    """Host side of the guest's read-only /mnt/lab: put files here to hand them to the guest."""
    return state / "share"


def molecule_vm_name(scenario: str, project: str) -> str:
    """The guest of a molecule scenario in one checkout: a CI clone and a working copy on the same machine
    each boot their own, so neither reuses, nor tears down, a guest the other one converged."""
    checkout = hashlib.sha256(os.path.realpath(project).encode()).hexdigest()[:8]
    return "molecule-%s-%s" % (scenario, checkout)


def state_dir(name: str) -> Path:
    if not NAME_RE.match(name):
        raise LabError("invalid VM name %r: use letters, digits, '.', '_' and '-' "
                       "(at most 63 characters)" % name)
    return cache_root() / "run" / name


# --- progress ---------------------------------------------------------------

@contextlib.contextmanager
def progress(what: str, log, detail: Callable[[], str] = lambda: "",
             every: Optional[float] = None) -> Iterator[None]:
    """Say every ``every`` seconds (PROGRESS_SECONDS) that ``what`` is still going, and how long it took so far,
    until the block ends; ``detail()`` adds what is seen of it (the guest's console)."""
    every = PROGRESS_SECONDS if every is None else every
    started = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every):
            seen = detail()
            print("labvm: %s: %.0f s so far%s" % (what, time.monotonic() - started, "; " + seen if seen else ""),
                  file=log, flush=True)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def serial_last_line(name: str) -> str:
    """The guest console's last line (what the boot is at), cut to PROGRESS_DETAIL characters."""
    lines = [line.strip() for line in serial_tail(name, 3).splitlines() if line.strip()]
    text = "console: " + lines[-1] if lines and lines[-1] != "(no serial.log)" else ""
    return text if len(text) <= PROGRESS_DETAIL else text[:PROGRESS_DETAIL - 3] + "..."


# --- image ------------------------------------------------------------------

def _run(argv: List[str], what: str, log=None, **kwargs) -> subprocess.CompletedProcess:
    """Run a step of the image build; with ``log``, say every PROGRESS_SECONDS that it still runs."""
    try:
        if log is not None:
            with progress("building the lab image: %s" % what, log):
                return subprocess.run(argv, check=True, **kwargs)
        return subprocess.run(argv, check=True, **kwargs)
    except FileNotFoundError:
        raise LabError("%s: %s is not installed; install it (make apt, or apt-get install "
                       "qemu-system-x86 qemu-utils mmdebstrap e2fsprogs openssh-client)"
                       % (what, argv[0]))
    except subprocess.CalledProcessError as exc:
        raise LabError("%s failed (exit %d): %s; see the output above"
                       % (what, exc.returncode, " ".join(argv[:3])))


def _customize_rootfs(rootfs: Path, pubkey: str) -> None:
    """Turn the debootstrapped tree into a bootable, SSH-reachable guest."""
    for rel, content in GUEST_FILES.items():
        target = rootfs / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    # Fixed per image: an uninitialized id would make systemd treat each boot as first boot.
    (rootfs / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    ssh_dir = rootfs / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    os.chmod(str(ssh_dir / "authorized_keys"), 0o600)
    unit_dir = rootfs / "etc/systemd/system"
    for link in unit_dir.glob("*.wants/*"):
        if link.name in DISABLED_UNITS:
            link.unlink()
    for unit in MASKED_UNITS:
        link = unit_dir / unit
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to("/dev/null")


def _copy_boot_files(rootfs: Path, dest: Path) -> None:
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise LabError("no kernel/initrd in %s/boot: linux-image-amd64 did not install; "
                       "check the mmdebstrap output" % rootfs)
    shutil.copyfile(str(kernels[-1]), str(dest / "vmlinuz"))
    shutil.copyfile(str(initrds[-1]), str(dest / "initrd.img"))


def _build_image(tmp: Path, log) -> None:
    rootfs = tmp / "rootfs"
    key = tmp / "id_ed25519"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "inferops-numa-lab",
          "-f", str(key)], "ssh-keygen")
    argv = ["mmdebstrap", "--mode=root", "--variant=" + VARIANT,
            "--include=" + ",".join(PACKAGES),
            "--aptopt=Acquire::Languages \"none\""]
    argv += ["--dpkgopt=" + opt for opt in DPKG_OPTS]
    argv += [SUITE, str(rootfs)] + MIRRORS
    _run(argv, "mmdebstrap (Debian %s, %d packages)" % (SUITE, len(PACKAGES)), log)
    _customize_rootfs(rootfs, (tmp / "id_ed25519.pub").read_text())
    # Rebuild the initrd with the lab's initramfs settings written just above.
    _run(["chroot", str(rootfs), "update-initramfs", "-u", "-k", "all"], "update-initramfs", log)
    _copy_boot_files(rootfs, tmp)
    _run(["mke2fs", "-q", "-F", "-t", "ext4", "-L", "root", "-d", str(rootfs),
          str(tmp / "disk.img"), DISK_SIZE], "mke2fs (the %s disk)" % DISK_SIZE, log)
    shutil.rmtree(str(rootfs))
    # Overlays reference this file as their backing store: it must never change.
    os.chmod(str(tmp / "disk.img"), 0o444)
    (tmp / "recipe.json").write_text(json.dumps(recipe(), indent=2, sort_keys=True) + "\n")


def ensure_image(log=sys.stderr) -> Path:
    """Return the cached image dir for the current recipe, building it if missing.

    Built in a temp dir and renamed into place, so a killed build leaves no half
    image; a lock serializes concurrent builders (two molecule scenarios).
    """
    final = image_dir()
    if (final / "disk.img").is_file():
        return final
    if os.geteuid() != 0:
        raise LabError("building the lab image needs root (mmdebstrap --mode=root and "
                       "mke2fs -d keep file ownership); rerun as root")
    images = final.parent
    images.mkdir(parents=True, exist_ok=True)
    with open(str(images / ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "disk.img").is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-%s-" % final.name, dir=str(images)))
        started = time.monotonic()
        try:
            print("building lab image %s (takes a few minutes)" % final.name, file=log)
            _build_image(tmp, log)
            os.rename(str(tmp), str(final))
        finally:
            if tmp.exists():
                shutil.rmtree(str(tmp), ignore_errors=True)
        print("built lab image in %.0f s" % (time.monotonic() - started), file=log)
    return final


def prune_images() -> List[Path]:
    """Delete cached images of other recipes that no guest boots from; returns them."""
    images = image_dir().parent
    if not images.is_dir():
        return []
    in_use = {image_dir()}
    for row in status():
        if row["running"] and row.get("image"):
            in_use.add(Path(str(row["image"])))
    removed = []
    with open(str(images / ".lock"), "w") as lock:
        # Holding the lock means no build is running, so .tmp-* dirs are leftovers too.
        fcntl.flock(lock, fcntl.LOCK_EX)
        for entry in sorted(images.iterdir()):
            if entry.is_dir() and entry not in in_use:
                shutil.rmtree(str(entry))
                removed.append(entry)
    return removed


# --- processes --------------------------------------------------------------

def _read_int(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def is_our_qemu(pid: int, state: Path) -> bool:
    """True when pid is a QEMU started for this state dir (never trust a bare pid)."""
    try:
        raw = Path("/proc/%d/cmdline" % pid).read_bytes()
    except OSError:
        return False
    args = raw.decode(errors="replace").split("\0")
    # The trailing slash keeps guest "a" from claiming the QEMU of guest "a2".
    inside = str(state) + "/"
    return "qemu-system" in os.path.basename(args[0]) and any(inside in a for a in args)


def running_pid(name: str) -> Optional[int]:
    state = state_dir(name)
    pid = _read_int(state / "qemu.pid")
    if pid is not None and is_our_qemu(pid, state):
        return pid
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accel() -> str:
    # KVM guests hang on these hosts (lab/README.md); opt in explicitly where it works.
    accel = os.environ.get("INFEROPS_NUMA_ACCEL", "tcg")
    if accel not in ("tcg", "kvm"):
        raise LabError("INFEROPS_NUMA_ACCEL=%r: use 'tcg' or 'kvm'" % accel)
    return accel


NUMA_SHAPES = (1, 2, 5)
# numa=5, sub-NUMA clustering as on an SNC2 Xeon or NPS2 EPYC: node N holds CPU N (nodes 0-1 in socket 0, 2-3 in
# socket 1), node 4 is memory without CPUs (a CXL expander) attached to socket 0. MiB per node:
SUB_NUMA_MIB = (640, 640, 640, 640, 512)
# SLIT: 12 between a socket's two halves, 21 across sockets, the expander 17 from its socket and 28 from the other.
SUB_NUMA_DISTANCES = {(0, 1): 12, (2, 3): 12, (0, 2): 21, (0, 3): 21, (1, 2): 21, (1, 3): 21,
                      (0, 4): 17, (1, 4): 17, (2, 4): 28, (3, 4): 28}
# HMAT per (initiator, target): access latency in ns and bandwidth in MB/s. The expander gives half a DRAM node's
# bandwidth from its socket, so weights from HMAT are 2 for every DRAM node and 1 for it.
SUB_NUMA_LOCAL = (100, 20000)
SUB_NUMA_SIBLING = (110, 18000)
SUB_NUMA_REMOTE = (200, 9000)
SUB_NUMA_EXPANDER = {"near": (250, 10000), "far": (350, 5000)}


def _sub_numa_perf(initiator: int, target: int) -> tuple:
    if target == 4:
        return SUB_NUMA_EXPANDER["near" if initiator in (0, 1) else "far"]
    if initiator == target:
        return SUB_NUMA_LOCAL
    return SUB_NUMA_SIBLING if initiator // 2 == target // 2 else SUB_NUMA_REMOTE


def sub_numa_argv() -> List[str]:
    """QEMU's nodes, SLIT and HMAT for numa=5 (HMAT wants every node's initiator, the expander's is node 0)."""
    argv = []  # type: List[str]
    for node, mib in enumerate(SUB_NUMA_MIB):
        argv += ["-object", "memory-backend-ram,size=%dM,id=m%d" % (mib, node)]
        where = "initiator=0" if node == 4 else "cpus=%d,initiator=%d" % (node, node)
        argv += ["-numa", "node,nodeid=%d,memdev=m%d,%s" % (node, node, where)]
    for (source, target), distance in sorted(SUB_NUMA_DISTANCES.items()):
        argv += ["-numa", "dist,src=%d,dst=%d,val=%d" % (source, target, distance)]
    for initiator in range(4):
        for target in range(5):
            latency, bandwidth = _sub_numa_perf(initiator, target)
            argv += ["-numa", "hmat-lb,initiator=%d,target=%d,hierarchy=memory,data-type=access-latency,"
                              "latency=%d" % (initiator, target, latency),
                     "-numa", "hmat-lb,initiator=%d,target=%d,hierarchy=memory,data-type=access-bandwidth,"
                              "bandwidth=%dM" % (initiator, target, bandwidth)]
    return argv


def qemu_argv(image: Path, state: Path, numa: int, port: int, accel: str = "tcg") -> List[str]:
    """The QEMU command line: 4 vCPUs as 2 sockets x 2 cores, two display devices (the lab's GPUs).

    numa=2: two 1 GiB nodes at SLIT distance 21, a display behind a pxb-pcie
    expander on each node (guest addresses 0000:41:00.0 on node 0, 0000:81:00.0 on
    node 1), so a 2-GPU instance spans both nodes, and a virtio NIC beside each (0000:42:00.0, 0000:82:00.0). numa=1: no NUMA tables, both
    displays on the root complex, so the guest reports their numa_node as -1.
    numa=5: SUB_NUMA_SHAPE, each socket split in two and a memory-only node, with HMAT.
    """
    if numa not in NUMA_SHAPES:
        raise LabError("--numa %r: the lab supports %s nodes" % (numa, " or ".join(map(str, NUMA_SHAPES))))
    cpu = "host" if accel == "kvm" else "max"
    argv = ["qemu-system-x86_64", "-name", state.name,
            "-machine", "q35,accel=" + accel + (",hmat=on" if numa == 5 else ""), "-cpu", cpu,
            "-m", "%dM" % sum(SUB_NUMA_MIB) if numa == 5 else "2G",
            "-smp", "4,sockets=2,cores=2,threads=1"]
    if numa == 5:
        argv += sub_numa_argv()
        argv += ["-device", "bochs-display,bus=pcie.0", "-device", "bochs-display,bus=pcie.0"]
    elif numa == 2:
        argv += [
            "-object", "memory-backend-ram,size=1G,id=m0",
            "-object", "memory-backend-ram,size=1G,id=m1",
            "-numa", "node,nodeid=0,cpus=0-1,memdev=m0",
            "-numa", "node,nodeid=1,cpus=2-3,memdev=m1",
            "-numa", "dist,src=0,dst=1,val=21",
            "-device", "pxb-pcie,id=pxb0,bus_nr=64,numa_node=0,bus=pcie.0",
            "-device", "pcie-root-port,id=rp0,bus=pxb0,chassis=2",
            "-device", "bochs-display,bus=rp0",
            # A NIC beside each "GPU" (as on a GPU board): no GPU's traffic to other hosts crosses the socket link.
            "-device", "pcie-root-port,id=rp3,bus=pxb0,chassis=4",
            "-netdev", "user,id=n2,restrict=on",
            "-device", "virtio-net-pci,netdev=n2,bus=rp3",
            "-device", "pxb-pcie,id=pxb1,bus_nr=128,numa_node=1,bus=pcie.0",
            "-device", "pcie-root-port,id=rp1,bus=pxb1,chassis=1",
            "-device", "bochs-display,bus=rp1",
            # A NIC on node 1 (0000:82:00.0, MSI-X): the device whose interrupts test_lab.py has numa_irqs serve.
            "-device", "pcie-root-port,id=rp2,bus=pxb1,chassis=3",
            "-netdev", "user,id=n1,restrict=on",
            "-device", "virtio-net-pci,netdev=n1,bus=rp2",
        ]
    else:
        argv += ["-device", "bochs-display,bus=pcie.0", "-device", "bochs-display,bus=pcie.0"]
    argv += [
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
        "-append", KERNEL_ARGS,
        # Devices on the root complex need bus=pcie.0, or QEMU tries the expander.
        "-drive", "file=%s,format=qcow2,if=none,id=d0,cache=unsafe" % (state / "overlay.qcow2"),
        "-device", "virtio-blk-pci,drive=d0,bus=pcie.0",
        "-netdev", "user,id=n0,hostfwd=tcp:127.0.0.1:%d-:22" % port,
        "-device", "virtio-net-pci,netdev=n0,bus=pcie.0",
        # Big files (models, builds) reach the guest through this read-only share: copying them over
        # SSH ran at ~1.5 MB/s under TCG.
        "-fsdev", "local,id=share,path=%s,security_model=none,readonly=on" % share_dir(state),
        "-device", "virtio-9p-pci,fsdev=share,mount_tag=labshare,bus=pcie.0",
        "-vga", "none", "-display", "none",
        "-serial", "file:%s" % (state / "serial.log"),
        # The human monitor, to reset a guest whose boot hung (wait_for_ssh).
        "-monitor", "unix:%s,server=on,wait=off" % (state / "monitor.sock"),
        "-daemonize", "-pidfile", str(state / "qemu.pid"),
    ]
    return argv


# --- ssh --------------------------------------------------------------------

# A VM name, or the dict `up` returned (its "instance" is the VM name, which the
# helpers need to check that QEMU still runs; molecule's instance names differ).
InstanceRef = Union[str, Dict[str, object]]


def instance(name: str) -> Dict[str, object]:
    """Connection info of a running guest (the JSON `up` printed)."""
    path = state_dir(name) / "instance.json"
    if running_pid(name) is None or not path.is_file():
        raise LabError("lab VM %r is not running; start it with: lab/labvm.py up --name %s"
                       % (name, name))
    return json.loads(path.read_text())


def _info(ref: InstanceRef) -> Dict[str, object]:
    return instance(ref) if isinstance(ref, str) else ref


def ssh_argv(ref: InstanceRef, command: Optional[List[str]] = None,
             connect_timeout: int = 10) -> List[str]:
    info = _info(ref)
    argv = ["ssh"] + SSH_OPTIONS + [
        "-o", "ConnectTimeout=%d" % connect_timeout,
        "-i", str(info["identity_file"]), "-p", str(info["port"]),
        "%s@%s" % (info["user"], info["address"]),
    ]
    if command:
        argv += ["--"] + command
    return argv


def run_ssh(ref: InstanceRef, command: Union[str, List[str]], timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run a shell command in the guest; returns the CompletedProcess (text)."""
    cmd = [command] if isinstance(command, str) else command
    try:
        proc = subprocess.run(ssh_argv(ref, cmd), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LabError("ssh command timed out after %.0f s: %s; the guest is slow under "
                       "TCG, raise the timeout" % (timeout, " ".join(cmd)))
    if check and proc.returncode != 0:
        raise LabError("guest command failed (exit %d): %s\nstdout: %s\nstderr: %s"
                       % (proc.returncode, " ".join(cmd), proc.stdout[-2000:],
                          proc.stderr[-2000:]))
    return proc


def put_file(ref: InstanceRef, local: PathLike, remote: str, mode: str = "0644",
             timeout: float = 120) -> None:
    """Copy a local file into the guest over the SSH channel (no sftp needed)."""
    dest, tmp = shlex.quote(remote), shlex.quote(remote + ".tmp")
    script = "cat > %s && chmod %s %s && mv %s %s" % (tmp, shlex.quote(mode), tmp, tmp, dest)
    try:
        with open(str(local), "rb") as src:
            proc = subprocess.run(ssh_argv(ref, [script]), stdin=src, capture_output=True,
                                  timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LabError("copying %s to the guest timed out after %.0f s; raise the timeout"
                       % (local, timeout))
    if proc.returncode != 0:
        raise LabError("copying %s to the guest's %s failed: %s"
                       % (local, remote, proc.stderr.decode(errors="replace")[-2000:]))


def serial_tail(name: str, lines: int = 40) -> str:
    try:
        text = (state_dir(name) / "serial.log").read_text(errors="replace")
    except OSError:
        return "(no serial.log)"
    return "\n".join(text.splitlines()[-lines:])


def wait_for_ssh(info: Dict[str, object], timeout: float = BOOT_TIMEOUT,
                 not_boot_id: Optional[str] = None, log=sys.stderr) -> str:
    """Poll until the guest runs commands over SSH; returns its boot id.

    slirp accepts TCP on the forwarded port before sshd runs, so only a real
    command proves readiness. not_boot_id waits for a *new* boot after a reboot.
    A console silent for CONSOLE_STALL_SECONDS meanwhile is a hung boot: the guest is reset.
    """
    name = str(info["instance"])
    deadline = time.monotonic() + timeout
    console = ConsoleWatch(state_dir(name) / "serial.log")
    resets = 0
    while True:
        if running_pid(name) is None:
            raise LabError("QEMU for %r exited during boot; serial.log tail:\n%s"
                           % (name, serial_tail(name)))
        try:
            proc = subprocess.run(ssh_argv(info, ["cat", "/proc/sys/kernel/random/boot_id"],
                                           connect_timeout=5),
                                  capture_output=True, text=True, timeout=30,
                                  stdin=subprocess.DEVNULL)
            boot_id = proc.stdout.strip()
            if proc.returncode == 0 and boot_id and boot_id != not_boot_id:
                return boot_id
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            raise LabError("guest %r not reachable over SSH after %.0f s; serial.log tail:\n%s"
                           % (name, timeout, serial_tail(name)))
        if console.silent_for() > CONSOLE_STALL_SECONDS and resets < MAX_RESETS:
            resets += 1
            print("labvm: %s's console silent for %.0f s and no SSH: the boot hung (%s); resetting the guest "
                  "(%d of %d)" % (name, console.silent_for(), serial_last_line(name) or "no console output",
                                  resets, MAX_RESETS), file=log, flush=True)
            monitor_command(name, "system_reset")
            console = ConsoleWatch(state_dir(name) / "serial.log")
        time.sleep(2)


class ConsoleWatch:
    """How long a serial log has not grown."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.size = self._size()
        self.since = clock()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return -1

    def silent_for(self) -> float:
        size = self._size()
        if size != self.size:
            self.size, self.since = size, self.clock()
        return self.clock() - self.since


def monitor_command(name: str, command: str, timeout: float = 10.0) -> str:
    """Send one command to guest NAME's QEMU monitor (its state dir's monitor.sock); returns what it printed."""
    path = str(state_dir(name) / "monitor.sock")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(command.encode() + b"\n")
            time.sleep(0.5)
            sock.settimeout(0.5)
            answer = b""
            with contextlib.suppress(socket.timeout):
                while True:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
    except OSError as err:
        raise LabError("QEMU monitor of %r (%s): %s; the guest was started without one: run `lab/labvm.py "
                       "down --name %s` and boot it again" % (name, path, err.strerror or err, name))
    return answer.decode(errors="replace")


def reboot_wait(ref: InstanceRef, timeout: float = BOOT_TIMEOUT, log=sys.stderr) -> float:
    """Reboot the guest and wait until SSH answers from the new boot; returns seconds."""
    info = _info(ref)
    old = run_ssh(info, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    started = time.monotonic()
    # The connection may drop (or linger) before ssh sees an exit status: the new
    # boot id is the only proof that matters, so the result is ignored.
    try:
        subprocess.run(ssh_argv(info, ["systemctl", "reboot"]), capture_output=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pass
    name = str(info["instance"])
    with progress("rebooting %s, waiting for SSH" % name, log, lambda: serial_last_line(name)):
        wait_for_ssh(info, timeout, not_boot_id=old, log=log)
    return time.monotonic() - started


# --- calibration ----------------------------------------------------------------

def calibrate(ref: InstanceRef) -> Dict[str, float]:
    """Time CALIBRATION_SCRIPT in the guest; factor = how much slower than the reference machine.

    The factor never goes below 1, so a fast machine keeps the reference budgets.
    """
    proc = run_ssh(ref, ["python3", "-I", "-c", shlex.quote(CALIBRATION_SCRIPT)], timeout=BOOT_TIMEOUT)
    try:
        python_start, cpu_loop = (float(word) for word in proc.stdout.split())
    except ValueError:
        raise LabError("the guest's calibration printed %r, not two durations; run lab/labvm.py ssh "
                       "NAME -- python3 to see why" % proc.stdout[-200:])
    factor = max(1.0, python_start / REFERENCE_CALIBRATION["python_start_s"],
                 cpu_loop / REFERENCE_CALIBRATION["cpu_loop_s"])
    return {"python_start_s": python_start, "cpu_loop_s": cpu_loop, "factor": round(factor, 2)}


def budget(ref: InstanceRef, reference_seconds: float) -> float:
    """How long to wait for a step that took reference_seconds on the reference machine."""
    calibration = _info(ref).get("calibration") or {}
    factor = float(calibration.get("factor", 1.0))  # type: ignore[union-attr]
    return BUDGET_MARGIN * reference_seconds * factor


# --- up / down / status -------------------------------------------------------

def _launch(name: str, image: Path, state: Path, numa: int, port: Optional[int]) -> int:
    """Start QEMU daemonized; retries a port another process grabbed meanwhile."""
    attempts = 1 if port else 3
    for _ in range(attempts):
        chosen = port or free_port()
        log = state / "qemu.log"
        with open(str(log), "w") as err:
            proc = subprocess.run(qemu_argv(image, state, numa, chosen, _accel()),
                                  stdout=err, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        if proc.returncode == 0:
            (state / "ssh_port").write_text("%d\n" % chosen)
            return chosen
        message = log.read_text(errors="replace").strip()
        if "hostfwd" not in message and "host forwarding" not in message:
            break
    raise LabError("QEMU failed to start %r: %s" % (name, message or "no output"))


def up(name: str, numa: int = 2, ssh_port: Optional[int] = None,
       timeout: float = BOOT_TIMEOUT, log=sys.stderr) -> Dict[str, object]:
    """Boot guest NAME (or reuse it when already running) and wait for SSH."""
    state = state_dir(name)
    if running_pid(name) is not None and (state / "instance.json").is_file():
        info = json.loads((state / "instance.json").read_text())
        if info.get("numa") != numa:
            raise LabError("lab VM %r already runs with --numa %s; run `lab/labvm.py down "
                           "--name %s` first" % (name, info.get("numa"), name))
        wait_for_ssh(info, timeout)
        return info
    image = ensure_image(log)
    if state.exists():
        shutil.rmtree(str(state))
    state.mkdir(parents=True)
    share_dir(state).mkdir()
    _run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
          "-b", str(image / "disk.img"), str(state / "overlay.qcow2")], "qemu-img create")
    started = time.monotonic()
    port = _launch(name, image, state, numa, ssh_port)
    info = {
        "instance": name, "address": "127.0.0.1", "port": port, "user": SSH_USER,
        "identity_file": str(image / "id_ed25519"), "numa": numa,
        "state_dir": str(state), "image": str(image), "share_dir": str(share_dir(state)),
        "guest_share_dir": GUEST_SHARE_DIR,
    }
    _write_instance(info)
    _boot_and_calibrate(info, timeout, started, log)
    return info


def _boot_and_calibrate(info: Dict[str, object], timeout: float, started: float, log) -> None:
    name = str(info["instance"])
    try:
        with progress("booting %s (TCG), waiting for SSH on port %s" % (name, info["port"]), log,
                      lambda: serial_last_line(name)):
            wait_for_ssh(info, timeout, log=log)
        with progress("timing the calibration workload in %s" % name, log):
            info["calibration"] = calibrate(info)
    except LabError:
        down(name)
        raise
    _write_instance(info)
    print("lab VM %s up with %d NUMA node(s) in %.0f s (ssh port %s); calibration: %s"
          % (name, info["numa"], time.monotonic() - started, info["port"],
             json.dumps(info["calibration"])), file=log)


def _write_instance(info: Dict[str, object]) -> None:
    (Path(str(info["state_dir"])) / "instance.json").write_text(json.dumps(info, indent=2) + "\n")


def relayout(name: str, numa: int, timeout: float = BOOT_TIMEOUT, log=sys.stderr) -> Dict[str, object]:
    """Power guest NAME off cleanly and boot its same disk as a machine with `numa` nodes.

    What was deployed stays (units, plans, users): the guest meets new hardware, as a host does
    after a board or firmware change. The SSH port is kept, so inventories stay valid.
    """
    info = instance(name)
    if info.get("numa") == numa:
        return info
    state = state_dir(name)
    with progress("powering %s off" % name, log, lambda: serial_last_line(name)):
        _power_off(info, timeout)
    started = time.monotonic()
    _launch(name, Path(str(info["image"])), state, numa, int(info["port"]))  # type: ignore[arg-type]
    info = dict(info, numa=numa)
    info.pop("calibration", None)
    _write_instance(info)
    _boot_and_calibrate(info, timeout, started, log)
    return info


def _power_off(info: Dict[str, object], timeout: float) -> None:
    """`systemctl poweroff` in the guest and wait for QEMU to exit: the guest's disk is clean."""
    name = str(info["instance"])
    pid = running_pid(name)
    try:
        subprocess.run(ssh_argv(info, ["sync; systemctl poweroff"]), capture_output=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + timeout
    while pid is not None and is_our_qemu(pid, state_dir(name)):
        if time.monotonic() > deadline:
            raise LabError("guest %r did not power off within %.0f s; serial.log tail:\n%s"
                           % (name, timeout, serial_tail(name)))
        time.sleep(1)


def down(name: str, timeout: float = 30.0) -> bool:
    """Stop guest NAME by its pidfile and delete its state; True if it was running."""
    state = state_dir(name)
    pid = running_pid(name)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while is_our_qemu(pid, state) and time.monotonic() < deadline:
            time.sleep(0.2)
        if is_our_qemu(pid, state):
            os.kill(pid, signal.SIGKILL)
            while is_our_qemu(pid, state):
                time.sleep(0.1)
    if state.exists():
        shutil.rmtree(str(state))
    return pid is not None


def status() -> List[Dict[str, object]]:
    run = cache_root() / "run"
    rows = []
    for state in sorted(run.iterdir()) if run.is_dir() else []:
        if not NAME_RE.match(state.name):
            continue
        pid = running_pid(state.name)
        info_path = state / "instance.json"
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        rows.append({"name": state.name, "running": pid is not None, "pid": pid,
                     "port": info.get("port"), "numa": info.get("numa"),
                     "image": info.get("image")})
    return rows


# --- CLI --------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labvm.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_image = sub.add_parser("image", help="build the cached guest image (once), print its dir")
    p_image.add_argument("--prune", action="store_true",
                         help="also delete cached images of older recipes")
    p_up = sub.add_parser("up", help="boot or reuse a guest, print connection JSON")
    p_up.add_argument("--name", required=True)
    p_up.add_argument("--numa", type=int, choices=NUMA_SHAPES, default=2)
    p_up.add_argument("--ssh-port", default="auto", help="host port for SSH, or 'auto'")
    p_up.add_argument("--timeout", type=float, default=BOOT_TIMEOUT)
    p_up.add_argument("--json-out", help="also write the connection JSON to this file")
    p_relayout = sub.add_parser("relayout", help="boot a guest's same disk with another NUMA topology")
    p_relayout.add_argument("--name", required=True)
    p_relayout.add_argument("--numa", type=int, choices=NUMA_SHAPES, required=True)
    p_relayout.add_argument("--timeout", type=float, default=BOOT_TIMEOUT)
    p_budget = sub.add_parser("budget", help="seconds to wait for a step that took SECONDS on the "
                                             "reference machine, scaled by the guest's calibration")
    p_budget.add_argument("name")
    p_budget.add_argument("seconds", type=float)
    p_info = sub.add_parser("info", help="print a running guest's connection JSON")
    p_info.add_argument("name")
    p_down = sub.add_parser("down", help="stop a guest and remove its state")
    p_down.add_argument("--name", required=True)
    p_ssh = sub.add_parser("ssh", help="run a command in a guest (interactive without one)")
    p_ssh.add_argument("name")
    p_ssh.add_argument("cmd", nargs=argparse.REMAINDER)
    p_rb = sub.add_parser("reboot-wait", help="reboot a guest and wait for SSH")
    p_rb.add_argument("name")
    p_rb.add_argument("--timeout", type=float, default=BOOT_TIMEOUT)
    sub.add_parser("status", help="list guests")
    sub.add_parser("molecule-name", help="the VM name of this checkout's molecule scenario")
    return parser


def _port_arg(value: str) -> Optional[int]:
    if value == "auto":
        return None
    if not value.isdigit() or not 1024 <= int(value) <= 65535:
        raise LabError("--ssh-port %r: give 'auto' or a port number 1024-65535" % value)
    return int(value)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "image":
            print(ensure_image())
            if args.prune:
                for path in prune_images():
                    print("removed %s" % path, file=sys.stderr)
        elif args.command == "up":
            info = up(args.name, args.numa, _port_arg(args.ssh_port), args.timeout)
            text = json.dumps(info, indent=2)
            if args.json_out:
                Path(args.json_out).write_text(text + "\n")
            print(text)
        elif args.command == "relayout":
            print(json.dumps(relayout(args.name, args.numa, args.timeout), indent=2))
        elif args.command == "budget":
            print("%d" % round(budget(args.name, args.seconds)))
        elif args.command == "info":
            print(json.dumps(instance(args.name), indent=2))
        elif args.command == "down":
            print("stopped" if down(args.name) else "not running")
        elif args.command == "ssh":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            argv_ssh = ssh_argv(args.name, cmd or None)
            if not cmd:
                argv_ssh.insert(1, "-t")
            os.execvp(argv_ssh[0], argv_ssh)
        elif args.command == "reboot-wait":
            print("rebooted in %.0f s" % reboot_wait(args.name, args.timeout))
        elif args.command == "status":
            for row in status():
                print(json.dumps(row))
        elif args.command == "molecule-name":
            checkout = os.environ.get("MOLECULE_PROJECT_DIRECTORY") or str(Path(__file__).resolve().parent.parent)
            print(molecule_vm_name(os.environ.get("MOLECULE_SCENARIO_NAME") or "default", checkout))
    except LabError as exc:
        print("labvm: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
