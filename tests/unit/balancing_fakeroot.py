"""A fake host root for the numa_balancing tests: /proc/sys knobs, sysctl files, tuned profiles."""
import os
from typing import Dict, Optional

VMSTAT_TEMPLATE = "nr_free_pages 1000\nnuma_hit 5\nnuma_pte_updates {pte}\nnuma_hint_faults {faults}\npgfault 9\n"


class FakeRoot:
    """Builds files under ``path``; every method returns self so a test reads as one recipe."""

    def __init__(self, path: str) -> None:
        self.path = str(path)

    def real(self, rel: str) -> str:
        return os.path.join(self.path, rel.lstrip("/"))

    def file(self, rel: str, text: str) -> "FakeRoot":
        os.makedirs(os.path.dirname(self.real(rel)), exist_ok=True)
        with open(self.real(rel), "w") as handle:
            handle.write(text)
        return self

    def symlink(self, rel: str, target: str) -> "FakeRoot":
        os.makedirs(os.path.dirname(self.real(rel)), exist_ok=True)
        os.symlink(target, self.real(rel))
        return self

    def knobs(self, balancing: Optional[int] = 1, zone_reclaim: Optional[int] = 0) -> "FakeRoot":
        """The two /proc/sys files; None leaves one out (a kernel without it)."""
        os.makedirs(self.real("/proc/sys/kernel"), exist_ok=True)
        os.makedirs(self.real("/proc/sys/vm"), exist_ok=True)
        if balancing is not None:
            self.file("/proc/sys/kernel/numa_balancing", "%d\n" % balancing)
        if zone_reclaim is not None:
            self.file("/proc/sys/vm/zone_reclaim_mode", "%d\n" % zone_reclaim)
        return self

    def vmstat(self, pte: int = 100, faults: int = 50) -> "FakeRoot":
        return self.file("/proc/vmstat", VMSTAT_TEMPLATE.format(pte=pte, faults=faults))

    def debian(self) -> "FakeRoot":
        """Debian 12's stock layout: 99-sysctl.conf -> ../sysctl.conf, vendor files in /usr/lib."""
        self.file("/etc/sysctl.conf", "#kernel.domainname = example.com\n")
        self.symlink("/etc/sysctl.d/99-sysctl.conf", "../sysctl.conf")
        self.file("/etc/sysctl.d/README.sysctl", "kernel.numa_balancing = 1\n")
        self.file("/usr/lib/sysctl.d/50-pid-max.conf", "kernel.pid_max = 4194304\n")
        return self.file("/usr/lib/sysctl.d/99-protect-links.conf", "fs.protected_symlinks = 1\n")

    def tuned(self, active: str, profiles: Dict[str, str], main: Optional[str] = None) -> "FakeRoot":
        """``profiles`` maps a directory such as /usr/lib/tuned/NAME to its tuned.conf text."""
        self.file("/etc/tuned/active_profile", active + "\n")
        for directory, text in profiles.items():
            self.file(directory + "/tuned.conf", text)
        if main is not None:
            self.file("/etc/tuned/tuned-main.conf", main)
        return self

    def read(self, rel: str) -> str:
        with open(self.real(rel)) as handle:
            return handle.read()

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.real(rel))
