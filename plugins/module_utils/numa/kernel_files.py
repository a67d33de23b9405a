"""The one reader of each kernel file that several modules read, under a root prefix.

Every reader takes ``root``, the folder holding ``proc/`` and ``sys/`` (``/`` for this
host, a captured or fake tree in tests), like hwloc's ``HWLOC_FSROOT``:

- ``/proc/<pid>/status`` and a thread's ``/proc/<pid>/task/<tid>/status``
  (topology: this process's cpuset; audit: a service's threads and RSS);
- ``/proc/<pid>/maps`` (audit: which mappings are program images; pagecache: who
  maps a model);
- ``/proc/vmstat`` and ``<node>/numastat``, both ``name value`` lines (numastat:
  allocation counters; balancing: the scanner's counters);
- the ``node<N>`` entries of a sysfs directory (topology, numastat).

kernel.py makes the syscalls; this module only reads. numa-pin exec imports it at
every server start (through topology and pagecache), so ``typing`` is imported for
type checkers only.
"""
from __future__ import annotations

import os

from .errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple, Union

    # (start address, permissions, device "major:minor" in hex, inode, path or "")
    MapsEntry = Tuple[int, str, str, str, str]

NODE_DIR = "sys/devices/system/node"
VMSTAT = "proc/vmstat"


def proc_text(root: str, pid: Union[int, str], name: str, tid: Optional[int] = None) -> Optional[str]:
    """``/proc/<pid>/<name>`` (a thread's with ``tid``); None once the process is gone.

    ``pid`` may be ``"self"``.
    """
    parts = [str(pid)] + (["task", str(tid)] if tid is not None else []) + [name]
    path = os.path.join(root, "proc", *parts)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        raise NumaError("cannot read %s: permission denied; run as root (become: true) or as the "
                        "process's user" % path) from None
    except OSError as exc:
        raise NumaError("cannot read %s (%s): check that procfs is mounted under %s"
                        % (path, exc.strerror or exc, root)) from None


def _parse_status(text: str) -> Dict[str, str]:
    """``/proc/<pid>/status`` -> {"Name": "llama-server", "Cpus_allowed_list": "0-3", "VmRSS": "812 kB", ...}."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def read_status(root: str, pid: Union[int, str], tid: Optional[int] = None) -> Optional[Dict[str, str]]:
    """The fields of a process's (or thread's) status file; None once it is gone."""
    text = proc_text(root, pid, "status", tid)
    return None if text is None else _parse_status(text)


def parse_maps(text: str) -> List[MapsEntry]:
    """``/proc/<pid>/maps`` -> one (start, perms, device, inode, path) per mapping; path "" when anonymous.

    The path is the sixth column to the end of the line; it may hold spaces.
    """
    entries = []  # type: List[MapsEntry]
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5:
            continue
        try:
            start = int(fields[0].partition("-")[0], 16)
        except ValueError:
            continue
        entries.append((start, fields[1], fields[3], fields[4], fields[5].strip() if len(fields) == 6 else ""))
    return entries


def read_counter_file(root: str, rel: str) -> Dict[str, int]:
    """The ``name value`` lines of a counter file (``proc/vmstat``, a node's ``numastat``); {} when unreadable."""
    try:
        with open(os.path.join(root, rel), encoding="ascii", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    counts = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdecimal():
            counts[parts[0]] = int(parts[1])
    return counts


def read_vmstat(root: str) -> Dict[str, int]:
    """Every counter of ``/proc/vmstat``; {} when unreadable."""
    return read_counter_file(root, VMSTAT)


def node_ids(root: str, rel: str = NODE_DIR) -> List[int]:
    """The N of every ``node<N>`` entry of a sysfs directory, ascending; [] when it cannot be listed."""
    try:
        names = os.listdir(os.path.join(root, rel))
    except OSError:
        return []
    # isdecimal is what the regex \d matches and what int() takes; no re on the start path.
    return sorted(int(name[4:]) for name in names if name.startswith("node") and name[4:].isdecimal())
