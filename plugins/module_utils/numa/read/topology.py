"""Read a host's NUMA, CPU and GPU topology from sysfs/procfs.

Every path is ``<root>/sys/...`` or ``<root>/proc/...`` (like hwloc's
``HWLOC_FSROOT``), so the same reader runs on the live host and on a captured
dump. This is the only place in the project that parses sysfs topology; the
files other modules read too (the node directory, ``/proc/self/status``) go
through kernel_files.py, and GPU vendors come from gpu_vendors.py's table.

``read()`` never raises for what it finds: missing, empty or garbage files
become entries in ``warnings`` and the value is left out (null/empty); a value that
contradicts the rest of the topology (a device's node that is not one, a GPU memory
node with CPUs) is warned and the next source is asked. A warning is one line of
printable ASCII naming the file and the problem, and quotes at most a short excerpt
of what the file holds (kernel_files.excerpt). Only a ``root`` that is not a
directory is an error. Under a root other than ``/`` every path stays inside the
root (kernel_files.Root), and every number and list is bounded by what a kernel
can print. The result is a plain JSON-able
dict whose shape is the ``numa_facts`` contract (schema_version 1, see
docs/facts.md).

numa-pin reads the topology at every service start and for ``facts``: files are
parsed with string methods, not ``re`` (several ms to import, with its enum and
functools), and ``typing`` is imported for type checkers only.
"""
from __future__ import annotations

import errno
import os
import stat

from ..base.cpulist import (DIGITS, HEX_DIGITS, MAX_CPUS, MAX_NODES, format_cpulist, is_kernel_number,
                            is_pci_address, parse_cpulist, parse_integer)
from ..base.errors import NumaError
from ..base.gpu_vendors import index_facts, vendor_name
from .kernel_files import MAX_FILE_BYTES, NODE_DIR, Root, excerpt, numbered, parse_status, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

    # What a memory node delivers: bandwidth (any unit, the same for every node compared) and latency (ns;
    # None when unknown: HMAT's latency files may be missing or 0).
    Figures = Tuple[float, Optional[float]]

SCHEMA_VERSION = 1

CPU_DIR = "sys/devices/system/cpu"
PCI_DIR = "sys/bus/pci/devices"
NVIDIA_GPUS_DIR = "proc/driver/nvidia/gpus"

# PCI base class + subclass of compute/display devices: VGA, 3D controller,
# other display controller, processing accelerator.
GPU_CLASSES = frozenset((0x0300, 0x0302, 0x0380, 0x1200))
# Board management controllers show up as VGA devices but run no model.
BMC_VENDORS = frozenset(("0x1a03", "0x102b"))  # ASPEED, Matrox
# Ethernet, InfiniBand, fabric (Omni-Path). A device of any other class with an RDMA device (``infiniband/``: the
# "serial bus" InfiniBand HCAs of QLogic, the "other network" ConnectX-3) is a NIC as well: NCCL and UCX send
# through it.
NIC_CLASSES = frozenset((0x0200, 0x0207, 0x0208))
NVME_CLASS = 0x010802
# An RDMA port's state as sysfs prints it, "4: ACTIVE": the kernel's ib_port_state number, then its name (the
# index here). Only an ACTIVE port carries traffic; UCX and NCCL skip the others.
PORT_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
# An RDMA port's link_layer as sysfs prints it: InfiniBand, or Ethernet for RoCE.
LINK_LAYERS = frozenset(("InfiniBand", "Ethernet", "Unknown"))
# RDMA ports are numbered by a byte, from 1: a directory under ports/ named otherwise is none.
MAX_RDMA_PORT = 255

# The meminfo fields the facts are made of (system-wide and per node).
_MEMINFO_USED = frozenset(("MemTotal", "MemFree", "MemAvailable", "FilePages", "Shmem", "Cached", "Buffers"))
# A meminfo line is "[Node N] Name: value [kB]", its name made of these.
_MEMINFO_NAME = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_()"
# The choice a kernel marks in brackets, as in "always [madvise] never", is made of these.
_CHOICE_NAME = "abcdefghijklmnopqrstuvwxyz_"
_KB_PER_UNIT = {"K": 1, "M": 1024, "G": 1024 * 1024}
# A SLIT entry is one byte (255: unreachable).
_MAX_DISTANCE = 255
# /proc/mounts lists every mount of the namespace: a container host has thousands.
_MAX_MOUNTS_BYTES = 16 * MAX_FILE_BYTES
_STATUS = "proc/self/status"
_THP_ENABLED = "sys/kernel/mm/transparent_hugepage/enabled"
_WEIGHTS_DIR = "sys/kernel/mm/mempolicy/weighted_interleave"
MEMORY_TIERING_DIR = "sys/devices/virtual/memory_tiering"
# A node's kind, by (has CPUs, has memory).
KINDS = {(True, True): "cpus_and_memory", (True, False): "cpus_only", (False, True): "memory_only",
         (False, False): "empty"}


class _Reader:
    """File access under a root prefix that records what could not be read."""

    def __init__(self, tree: Root, plan_only: bool = False, cpu_kinds: bool = True) -> None:
        self.tree = tree
        self.warnings = []  # type: List[str]
        # Skip what neither placement.plan() nor numa-pin exec uses (see read()).
        self.plan_only = plan_only
        self.cpu_kinds = cpu_kinds
        # Bounds of every CPU and node number read, once the possible ones are known.
        self.cpu_limit = MAX_CPUS
        self.node_limit = MAX_NODES
        # The files read that not every user may read: no warning quotes them (see quote()).
        self._private = set()  # type: Set[str]

    def exists(self, rel: str) -> bool:
        return self.tree.exists(rel)

    def listdir(self, rel: str) -> List[str]:
        try:
            return sorted(self.tree.listdir(rel))
        except OSError as exc:
            self._unreadable(rel, exc, required=False)
            return []

    def text(self, rel: str, required: bool = True, limit: int = MAX_FILE_BYTES) -> Optional[str]:
        """File content stripped of whitespace and NULs; None when unreadable."""
        try:
            data, mode = self.tree.read_with_mode(rel, limit)
        except OSError as exc:
            self._unreadable(rel, exc, required)
            return None
        if not mode & stat.S_IROTH:
            self._private.add(rel)
        return data.replace(b"\x00", b"").decode("utf-8", "replace").strip()

    def quote(self, rel: str, content: str) -> str:
        """What a warning may show of ``content``, read from ``rel``."""
        return excerpt(content, world_readable=rel not in self._private)

    def integer(self, rel: str, required: bool = True) -> Optional[int]:
        raw = self.text(rel, required)
        if raw is None:
            return None
        number = parse_integer(raw)
        if number is None:
            self.warn("%s: expected an integer, found %s" % (rel, self.quote(rel, raw)))
        return number

    def cpus(self, rel: str, required: bool = True, limit: Optional[int] = None) -> Optional[List[int]]:
        """A kernel cpulist file ("0-3,8"), or a nodelist one with ``limit`` node_limit; None when
        unreadable or garbage."""
        raw = self.text(rel, required)
        if raw is None:
            return None
        return self.parse_list(rel, raw, limit or self.cpu_limit)

    def parse_list(self, rel: str, raw: str, limit: int) -> Optional[List[int]]:
        """``raw``, read from ``rel``, as a CPU or node list of numbers below ``limit``; None when it is none."""
        try:
            return parse_cpulist(raw, limit)
        except NumaError:  # its message quotes the text whole: the warning quotes an excerpt instead
            self.warn("%s: not a CPU/node list of numbers below %d: %s" % (rel, limit, self.quote(rel, raw)))
            return None

    def link(self, rel: str) -> Optional[str]:
        """The text of the symbolic link ``rel`` (never followed); None when it is none, unreadable or absent."""
        try:
            return self.tree.link_text(rel)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOENT):  # EINVAL: a directory, as some captures copy them
                self.warn("%s: cannot read the link (%s)" % (rel, exc.strerror or exc))
            return None

    def nodes(self, rel: str) -> Optional[List[int]]:
        """A kernel nodelist file (``has_memory``: "0-1,8"); None when absent, unreadable or garbage."""
        return self.cpus(rel, required=False, limit=self.node_limit)

    def _unreadable(self, rel: str, exc: OSError, required: bool) -> None:
        # An optional file may be absent; a loop, a FIFO or a denied read is news either way.
        if required or exc.errno != errno.ENOENT:
            self.warn("%s: cannot read (%s)" % (rel, exc.strerror or exc))

    def warn(self, message: str) -> None:
        # The paths a warning names hold names from the tree, which may hold any character but "/".
        self.warnings.append(printable(message))


def read(root: str = "/", plan_only: bool = False, cpu_kinds: Optional[bool] = None) -> Dict[str, Any]:
    """Return the topology of the machine whose filesystem root is ``root``.

    ``plan_only`` reads just what placement.plan() and numa-pin exec use, for the start of
    every service: ``l3_groups``, ``caches``, each node's ``hugepages``, ``nics`` and ``nvme``
    stay empty, and ``kernel`` holds only ``weighted_interleave``; ``cpus.kinds`` (a few files
    per CPU) only when ``cpu_kinds`` asks for it (a request for the fast cores).
    """
    with _opened(root) as tree:
        return _read_tree(root, _Reader(tree, plan_only, not plan_only if cpu_kinds is None else cpu_kinds))


def memory_tiers(root: str = "/") -> List[Dict[str, Any]]:
    """The kernel's memory tiers alone (``memory_tiers`` of read()), fastest first: numa_balancing's state
    ``auto`` decides from them without reading the rest of the host."""
    with _opened(root) as tree:
        reader = _Reader(tree, False)
        reader.node_limit = _possible(reader, NODE_DIR + "/possible", MAX_NODES)
        return _read_memory_tiers(reader)


def _opened(root: str) -> Root:
    try:
        return Root(root)
    except OSError:
        raise NumaError(
            "topology root %r is not a directory: pass the folder that holds the "
            "captured sys/ and proc/ trees (or / for this host)" % root
        ) from None


def _read_tree(root: str, reader: _Reader) -> Dict[str, Any]:
    reader.cpu_limit = _possible(reader, CPU_DIR + "/possible", MAX_CPUS)
    reader.node_limit = _possible(reader, NODE_DIR + "/possible", MAX_NODES)
    cpus = _read_cpus(reader)
    online = set(cpus["_online"])
    system_meminfo = _parse_meminfo(reader, "proc/meminfo")
    nodes = _read_nodes(reader, online, system_meminfo)
    _attach_packages(nodes, cpus["_package_of"])
    pci = _read_pci(reader, nodes)
    nodes_by_id = {node["id"]: node for node in nodes}
    for gpu in pci["gpus"]:
        gpu["memory_node"] = _gpu_memory_node(reader, gpu, nodes_by_id)
    for node in nodes:
        node["gpus"] = [gpu["address"] for gpu in pci["gpus"] if gpu["numa_node"] == node["id"]]
        node["gpu_memory_of"] = [gpu["address"] for gpu in pci["gpus"] if gpu["memory_node"] == node["id"]]
    _attach_memory_nodes(reader, nodes)
    # A start (plan_only) reads HMAT's figures only where they decide a class the planner uses: a memory-only node
    # that is no GPU's memory; so numa-pin exec and numa_plan spill to the same nodes.
    figures_needed = not reader.plan_only or any(_class_from_figures(node) for node in nodes)
    for node in nodes:
        node["hmat"] = (_hmat_performance(reader, node["id"]) if figures_needed and node["has_memory"] else None)
    _attach_kinds(nodes)
    cpus["packages"] = _packages(cpus["_package_of"], nodes)
    for private in ("_online", "_package_of"):
        del cpus[private]
    node_keys = [str(node["id"]) for node in nodes]  # the keys of each node's distances
    return {
        "schema_version": SCHEMA_VERSION,
        "root": root,
        "node_count": len(nodes),
        "nodes": nodes,
        "distances": [list(map(node["distances"].get, node_keys)) for node in nodes],
        "cpus": cpus,
        "gpus": pci["gpus"],
        "nics": pci["nics"],
        "nvme": pci["nvme"],
        "memory": {
            "total_kb": system_meminfo.get("MemTotal"),
            "free_kb": system_meminfo.get("MemFree"),
            "available_kb": system_meminfo.get("MemAvailable"),
        },
        "shape": _shape(nodes, cpus["packages"]),
        "memory_tiers": [] if reader.plan_only else _read_memory_tiers(reader),
        "kernel": _read_kernel_knobs(reader),
        "warnings": reader.warnings,
    }


def _possible(reader: _Reader, rel: str, cap: int) -> int:
    """One past the highest CPU or node the kernel can ever number (its ``possible`` list)."""
    possible = reader.cpus(rel, required=False, limit=cap)
    return possible[-1] + 1 if possible else cap


# --- CPUs -----------------------------------------------------------------


def _read_cpus(reader: _Reader) -> Dict[str, Any]:
    present = _cpu_ids(reader)
    online = reader.cpus(CPU_DIR + "/online", required=False)
    if online is None:
        online = [cpu for cpu in present if _cpu_is_online(reader, cpu)]
    package_of = {}  # type: Dict[int, int]
    for cpu in online:
        package = reader.integer("%s/cpu%d/topology/physical_package_id" % (CPU_DIR, cpu), required=False)
        package_of[cpu] = package if package is not None and package >= 0 else 0
    siblings = _sibling_groups(reader, online, package_of)
    allowed, mems_allowed = _read_allowed(reader)
    return {
        "online": format_cpulist(online),
        "offline": _list_file(reader, CPU_DIR + "/offline"),
        "isolated": _list_file(reader, CPU_DIR + "/isolated"),
        "nohz_full": _list_file(reader, CPU_DIR + "/nohz_full"),
        "allowed": allowed,
        "mems_allowed": mems_allowed,
        "threads_per_core": max((len(group) for group in siblings), default=1),
        "siblings": siblings,
        "l3_groups": [] if reader.plan_only else _l3_groups(reader, online),
        "caches": {} if reader.plan_only else _cache_sizes(reader, online),
        "kinds": _cpu_kinds(reader, online) if reader.cpu_kinds else [],
        "_online": online,
        "_package_of": package_of,
    }


def _cpu_ids(reader: _Reader) -> List[int]:
    return _within(reader, numbered(reader.listdir(CPU_DIR), "cpu"), reader.cpu_limit, CPU_DIR + "/cpu")


def _within(reader: _Reader, ids: List[int], limit: int, name: str) -> List[int]:
    """The numbered entries (``<name><N>``) the kernel could have made; a warning names the others."""
    if ids and ids[-1] >= limit:
        reader.warn("%s%d: past the last possible number, %d; ignored" % (name, ids[-1], limit - 1))
        return [number for number in ids if number < limit]
    return ids


def _cpu_is_online(reader: _Reader, cpu: int) -> bool:
    # cpu0 usually has no "online" file (it cannot be taken offline); an
    # empty one (truncated capture) says nothing either.
    state = reader.text("%s/cpu%d/online" % (CPU_DIR, cpu), required=False)
    if not state:
        return True
    if state not in ("0", "1"):
        rel = "%s/cpu%d/online" % (CPU_DIR, cpu)
        reader.warn("%s: expected 0 or 1, found %s; counted as online" % (rel, reader.quote(rel, state)))
    return state != "0"


# What sets CPU kinds apart, as hwloc's cpukinds read it from sysfs, strongest first: the scheduler's capacity
# (asymmetric arm64, x86 hybrid parts on recent kernels), then the highest and the base frequency cpufreq reports
# (hybrid parts, Priority Core Turbo's high-priority cores, cores the platform caps).
KIND_FILES = (("capacity", "cpu_capacity"), ("max_freq_khz", "cpufreq/cpuinfo_max_freq"),
              ("base_freq_khz", "cpufreq/base_frequency"))
# Maximum frequencies this close are one kind, as hwloc counts them: Turbo Boost Max 3.0 gives a few cores of a
# kind some 5 % more, a preference for one busy thread, not a faster kind for a server's many.
SAME_MAX_FREQ = 0.9
# Above any capacity (1024 at most) or frequency (kHz) a kernel reports: a bigger number is garbage.
_MAX_KIND_VALUE = 10 ** 9


def _cpu_kinds(reader: _Reader, online: List[int]) -> List[Dict[str, Any]]:
    """The online CPUs grouped by what KIND_FILES say of each (maximum frequencies within SAME_MAX_FREQ of a
    kind's highest counted as one), fastest first: ``rank`` 0 has the highest capacity, then maximum, then base
    frequency. A CPU that says nothing is of no kind (as in hwloc: not known to be slower). [] when the CPUs that
    say something are all alike."""
    values = {cpu: tuple(_kind_value(reader, "%s/cpu%d/%s" % (CPU_DIR, cpu, name)) for _field, name in KIND_FILES)
              for cpu in online}
    kinds = []  # type: List[Tuple[Tuple[Optional[int], ...], List[int]]]
    for cpu in sorted((cpu for cpu in online if values[cpu] != (None,) * len(KIND_FILES)),
                      key=lambda cpu: [(value is not None, value or 0) for value in values[cpu]], reverse=True):
        mine = [cpus for key, cpus in kinds if _same_kind(key, values[cpu])]
        if mine:
            mine[0].append(cpu)
        else:
            kinds.append((values[cpu], [cpu]))
    if len(kinds) < 2:
        return []
    return [dict(zip([field for field, _name in KIND_FILES], key), cpulist=format_cpulist(sorted(cpus)), rank=rank)
            for rank, (key, cpus) in enumerate(kinds)]


def _same_kind(kind: Tuple[Optional[int], ...], cpu: Tuple[Optional[int], ...]) -> bool:
    """Whether a CPU's values (ranked after the kind's first, its highest) are the kind's."""
    (capacity, max_freq, base_freq), (cpu_capacity, cpu_max, cpu_base) = kind, cpu
    if (capacity, base_freq, max_freq is None) != (cpu_capacity, cpu_base, cpu_max is None):
        return False
    return max_freq is None or cpu_max >= max_freq * SAME_MAX_FREQ


def _kind_value(reader: _Reader, rel: str) -> Optional[int]:
    number = reader.integer(rel, required=False)
    if number is not None and not 0 < number < _MAX_KIND_VALUE:
        reader.warn("%s: expected a positive number below %d, found %d" % (rel, _MAX_KIND_VALUE, number))
        return None
    return number


def _list_file(reader: _Reader, rel: str) -> str:
    # Kernels 6.x print "(null)" in nohz_full when booted without nohz_full=: no CPUs.
    if (reader.text(rel, required=False) or "").strip() == "(null)":
        return ""
    values = reader.cpus(rel, required=False)
    return format_cpulist(values or [])


def _sibling_groups(reader: _Reader, online: List[int], package_of: Dict[int, int]) -> List[List[int]]:
    """SMT sibling groups (one per physical core) of the online CPUs."""
    if not online:
        return []
    probe = "%s/cpu%d/topology/thread_siblings_list" % (CPU_DIR, online[0])
    if not reader.exists(probe):
        # Older kernels (and some captures) have no sibling lists at all.
        return sorted(_cpus_by_core_id(reader, online, package_of).values())
    online_set = set(online)
    grouped = set()  # type: Set[int]
    groups = []
    for cpu in online:
        if cpu in grouped:
            continue
        members = reader.cpus("%s/cpu%d/topology/thread_siblings_list" % (CPU_DIR, cpu), required=False) or [cpu]
        group = sorted((set(members) & online_set - grouped) | {cpu})
        grouped.update(group)
        groups.append(group)
    return sorted(groups)


def _cpus_by_core_id(reader: _Reader, online: List[int], package_of: Dict[int, int]) -> Dict[Tuple[int, int], List[int]]:
    """Fallback for kernels without thread_siblings_list: same (package, core_id)."""
    cores = {}  # type: Dict[Tuple[int, int], List[int]]
    for cpu in online:
        core = reader.integer("%s/cpu%d/topology/core_id" % (CPU_DIR, cpu), required=False)
        key = (package_of[cpu], core if core is not None else -1 - cpu)
        cores.setdefault(key, []).append(cpu)
    return cores


def _cache_levels(reader: _Reader, cpu: int) -> Iterable[Tuple[str, int, str]]:
    """(index dir, level, type) for each cache of ``cpu``."""
    base = "%s/cpu%d/cache" % (CPU_DIR, cpu)
    for index in reader.listdir(base):
        if not index.startswith("index"):
            continue
        level = reader.integer("%s/%s/level" % (base, index), required=False)
        if level is None:
            continue
        kind = reader.text("%s/%s/type" % (base, index), required=False) or ""
        yield "%s/%s" % (base, index), level, kind


def _cache_size_kb(reader: _Reader, index_dir: str) -> Optional[int]:
    raw = reader.text(index_dir + "/size", required=False)
    if not raw:
        return None
    digits = _leading_digits(raw)
    number = parse_integer(digits) if digits else None
    if number is None:
        reader.warn("%s/size: unrecognised cache size %s" % (index_dir, reader.quote(index_dir + "/size", raw)))
        return None
    unit = raw[len(digits):].lstrip()[:1]  # "32K", "1024 K" or bytes
    return number * _KB_PER_UNIT[unit] if unit in _KB_PER_UNIT else number // 1024


def _leading_digits(text: str) -> str:
    end = 0
    while end < len(text) and text[end] in "0123456789":
        end += 1
    return text[:end]


def _l3_groups(reader: _Reader, online: List[int]) -> List[Dict[str, Any]]:
    """CPUs sharing a last-level (L3) cache; read once per group, not per CPU."""
    covered = set()  # type: Set[int]
    groups = []
    online_set = set(online)
    for cpu in online:
        if cpu in covered:
            continue
        for index_dir, level, _kind in _cache_levels(reader, cpu):
            if level != 3:
                continue
            shared = reader.cpus(index_dir + "/shared_cpu_list", required=False) or [cpu]
            members = sorted(set(shared) & online_set | {cpu})
            covered.update(members)
            groups.append({"cpulist": format_cpulist(members), "size_kb": _cache_size_kb(reader, index_dir)})
            break
    return groups


def _cache_sizes(reader: _Reader, online: List[int]) -> Dict[str, Optional[int]]:
    """Largest L1d, L2 and L3 of the first online CPU (what one thread sees)."""
    sizes = {"l1d_kb": None, "l2_kb": None, "l3_kb": None}  # type: Dict[str, Optional[int]]
    if not online:
        return sizes
    for index_dir, level, kind in _cache_levels(reader, online[0]):
        if level == 1 and kind == "Instruction":
            continue
        key = {1: "l1d_kb", 2: "l2_kb", 3: "l3_kb"}.get(level)
        size = _cache_size_kb(reader, index_dir)
        if key and size is not None and (sizes[key] is None or size > sizes[key]):
            sizes[key] = size
    return sizes


def _read_allowed(reader: _Reader) -> Tuple[str, str]:
    """Cpus_allowed_list and Mems_allowed_list of the reading process.

    Falls back to the cpuset the process sits in when status has no such lines
    (old kernels, and captures that kept only the cgroup tree).
    """
    fields = parse_status(reader.text(_STATUS, required=False) or "")
    cpus = _status_field(fields, "Cpus_allowed_list")
    mems = _status_field(fields, "Mems_allowed_list")
    if cpus is None or mems is None:
        fallback_cpus, fallback_mems = _cpuset_limits(reader)
        cpus = cpus or fallback_cpus
        mems = mems or fallback_mems
    return _normalised_list(reader, cpus, reader.cpu_limit), _normalised_list(reader, mems, reader.node_limit)


def _status_field(fields: Dict[str, str], name: str) -> Optional[Tuple[str, str]]:
    """(the value of the status line ``name``, the file it came from); None without the line."""
    return (fields[name], _STATUS) if name in fields else None


def _normalised_list(reader: _Reader, sourced: Optional[Tuple[str, str]], limit: int) -> str:
    """A list (value, the file it came from) as format_cpulist prints it; "" when absent, blank or garbage."""
    if sourced is None or not sourced[0].strip():
        return ""
    values = reader.parse_list(sourced[1], sourced[0].strip(), limit)
    return format_cpulist(values) if values is not None else ""


def _cpuset_limits(reader: _Reader) -> Tuple[Optional[Tuple[str, str]], Optional[Tuple[str, str]]]:
    """The CPUs and the nodes of the cpuset the process sits in, each with the file it came from."""
    rel = "proc/self/cpuset"
    path = reader.text(rel, required=False)
    if not path:
        return None, None
    if not path.startswith("/") or "/../" in path + "/":
        # The kernel prints the cgroup's absolute path, which never climbs.
        reader.warn("%s: %s is not a cgroup path; cpuset unknown" % (rel, reader.quote(rel, path)))
        return None, None
    for mount in _cpuset_mounts(reader):
        directory = os.path.join(mount, path.lstrip("/"))
        cpus = _first_text(reader, directory, ("cpuset.cpus.effective", "cpuset.cpus", "cpus"))
        mems = _first_text(reader, directory, ("cpuset.mems.effective", "cpuset.mems", "mems"))
        if cpus is not None or mems is not None:
            return cpus, mems
    return None, None


def _cpuset_mounts(reader: _Reader) -> List[str]:
    mounts = []
    for line in (reader.text("proc/mounts", required=False, limit=_MAX_MOUNTS_BYTES) or "").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mountpoint, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype in ("cpuset", "cgroup2") or (fstype == "cgroup" and "cpuset" in options):
            mounts.append(mountpoint.lstrip("/"))
    return mounts or ["dev/cpuset", "sys/fs/cgroup/cpuset", "sys/fs/cgroup"]


def _first_text(reader: _Reader, directory: str, names: Iterable[str]) -> Optional[Tuple[str, str]]:
    """(the content of the first file of ``names`` in ``directory`` that can be read, its path)."""
    for name in names:
        rel = os.path.join(directory, name)
        value = reader.text(rel, required=False)
        if value is not None:
            return value, rel
    return None


# --- NUMA nodes -----------------------------------------------------------


def _read_nodes(reader: _Reader, online: Set[int], system_meminfo: Dict[str, int]) -> List[Dict[str, Any]]:
    ids = _within(reader, numbered(reader.listdir(NODE_DIR), "node"), reader.node_limit, NODE_DIR + "/node")
    if not ids:
        return [_single_node(reader, online, system_meminfo)]
    # An empty mask file is a truncated capture, not "no node has CPUs".
    has_cpu = reader.nodes(NODE_DIR + "/has_cpu") or None
    has_memory = reader.nodes(NODE_DIR + "/has_memory") or None
    # The kernel prints one distance per online node, in node id order.
    online_nodes = reader.nodes(NODE_DIR + "/online") or ids
    missing = sorted(set(ids) - set(online_nodes))
    if missing:
        reader.warn("%s/online: leaves out node(s) %s, which have a directory; their distances are unknown"
                    % (NODE_DIR, format_cpulist(missing)))
    distance_keys = [str(node) for node in online_nodes]
    nodes = [_read_node(reader, node_id, online, distance_keys) for node_id in ids]
    _drop_cpus_listed_twice(reader, nodes)
    for node in nodes:
        if has_cpu is not None:
            node["has_cpus"] = node["id"] in has_cpu and bool(node["cpus"])
        if has_memory is not None:
            node["has_memory"] = node["id"] in has_memory
    return nodes


def _drop_cpus_listed_twice(reader: _Reader, nodes: List[Dict[str, Any]]) -> None:
    """A CPU belongs to exactly one node; broken firmware tables can list it in several.

    Keep it in the first node that lists it, so no CPU is handed out twice.
    """
    owner = {}  # type: Dict[int, int]
    for node in nodes:
        mine = []
        for cpu in node["cpus"]:
            if cpu in owner:
                continue
            owner[cpu] = node["id"]
            mine.append(cpu)
        if len(mine) != len(node["cpus"]):
            reader.warn("node%d: CPUs %s are also listed by a lower node; firmware NUMA tables are inconsistent, "
                        "kept them there" % (node["id"], format_cpulist(set(node["cpus"]) - set(mine))))
            node["cpus"] = mine
            node["cpulist"] = format_cpulist(mine)
            node["has_cpus"] = bool(mine)


def _single_node(reader: _Reader, online: Set[int], system_meminfo: Dict[str, int]) -> Dict[str, Any]:
    """A kernel without NUMA sysfs (non-NUMA build, many VMs): one node 0."""
    meminfo = dict(system_meminfo)
    # /proc/meminfo has no FilePages; per node it is page cache plus buffers.
    meminfo["FilePages"] = meminfo.get("Cached", 0) + meminfo.get("Buffers", 0)
    cpus = sorted(online)
    node = _node_record(0, cpus, meminfo, {"0": 10})
    node["hugepages"] = _read_hugepages(reader, "sys/kernel/mm/hugepages")
    return node


def _read_node(reader: _Reader, node_id: int, online: Set[int], distance_keys: List[str]) -> Dict[str, Any]:
    base = "%s/node%d" % (NODE_DIR, node_id)
    cpus = reader.cpus(base + "/cpulist", required=False)
    if cpus is None:
        cpus = _parse_cpumap(reader, base + "/cpumap")
    if cpus is None:
        reader.warn("%s: neither cpulist nor cpumap readable; node listed without CPUs" % base)
        cpus = []
    meminfo = _parse_meminfo(reader, base + "/meminfo")
    node = _node_record(node_id, sorted(set(cpus) & online), meminfo, _read_distances(reader, base, distance_keys))
    if not reader.plan_only:
        node["hugepages"] = _read_hugepages(reader, base + "/hugepages")
    return node


def _node_record(node_id: int, cpus: List[int], meminfo: Dict[str, int], distances: Dict[str, int]) -> Dict[str, Any]:
    free = meminfo.get("MemFree", 0)
    file_pages = meminfo.get("FilePages", 0)
    shmem = meminfo.get("Shmem", 0)
    total = meminfo.get("MemTotal", 0)
    return {
        "id": node_id,
        "cpus": cpus,
        "cpulist": format_cpulist(cpus),
        "has_cpus": bool(cpus),
        "has_memory": total > 0,
        "memory_total_kb": total,
        "memory_free_kb": free,
        "memory_file_kb": file_pages,
        "memory_shmem_kb": shmem,
        # Page cache can be reclaimed to make room; shmem/tmpfs pages cannot.
        "memory_available_kb": free + max(0, file_pages - shmem),
        "hugepages": {},
        "distances": distances,
        "packages": [],
        "gpus": [],
        "gpu_memory_of": [],
        "memory_nodes": [node_id] if total > 0 else [],
        "memory_from": "local" if total > 0 else None,
    }


def _attach_memory_nodes(reader: _Reader, nodes: List[Dict[str, Any]]) -> None:
    """Each node's ``memory_nodes``: whose memory its CPUs allocate from. A node with memory serves
    itself; a CPU node without memory is served by the memory nodes HMAT ranks best for it
    (``access0``: its targets, or the memory nodes naming it an initiator), else by the nearest
    memory nodes by SLIT (the kernel's fallback order)."""
    with_memory = [node["id"] for node in nodes if node["has_memory"]]
    for node in nodes:
        node["memory_nodes"] = [node["id"]] if node["has_memory"] else []
        node["memory_from"] = "local" if node["has_memory"] else None
        if node["has_memory"] or not node["has_cpus"] or not with_memory:
            continue
        hmat = _hmat_memory_nodes(reader, node["id"], with_memory)
        nearest = _nearest(node["distances"], with_memory)
        node["memory_nodes"], node["memory_from"] = (hmat, "hmat") if hmat else (nearest, "slit" if nearest else None)
        if not node["memory_nodes"]:
            reader.warn("node%d: has CPUs but no memory, and neither HMAT nor SLIT names the node that serves it"
                        % node["id"])


def _hmat_memory_nodes(reader: _Reader, initiator: int, with_memory: List[int]) -> List[int]:
    """The memory nodes HMAT pairs with ``initiator`` (numaperf: nodeX/accessN/targets/nodeY and
    nodeY/accessN/initiators/nodeX): class access0 (any initiator), else access1 (CPUs only)."""
    for access in ("access0", "access1"):
        targets = set(numbered(reader.listdir("%s/node%d/%s/targets" % (NODE_DIR, initiator, access)), "node"))
        for target in with_memory:
            if target not in targets and "node%d" % initiator in reader.listdir(
                    "%s/node%d/%s/initiators" % (NODE_DIR, target, access)):
                targets.add(target)
        if targets & set(with_memory):
            return sorted(targets & set(with_memory))
    return []


# HMAT's figures for a memory node from its best initiators (numaperf: access0/initiators), units as sysfs gives them.
HMAT_FIGURES = ("read_bandwidth", "write_bandwidth", "read_latency", "write_latency")  # MB/s, MB/s, ns, ns


def _hmat_performance(reader: _Reader, node: int) -> Optional[Dict[str, int]]:
    """What HMAT says node ``node``'s memory delivers to its best initiators; None without HMAT figures."""
    base = "%s/node%d/access0/initiators" % (NODE_DIR, node)
    figures = {name: reader.integer("%s/%s" % (base, name), required=False) for name in HMAT_FIGURES}
    known = {name: value for name, value in figures.items() if value is not None and value > 0}
    return known or None


def _nearest(distances: Dict[str, int], candidates: List[int]) -> List[int]:
    """The candidates at the smallest known distance (all of them when they tie)."""
    known = {node: distances[str(node)] for node in candidates if str(node) in distances}
    if not known:
        return []
    closest = min(known.values())
    return sorted(node for node, distance in known.items() if distance == closest)


def _parse_cpumap(reader: _Reader, rel: str) -> Optional[List[int]]:
    """A hex CPU mask in comma-separated 32-bit words, most significant first; None when unreadable."""
    raw = reader.text(rel, required=False)
    if raw is None:
        return None
    words = raw.split(",")[::-1] if raw else []  # least significant first
    if any(not 0 < len(word) <= 8 or word.strip(HEX_DIGITS) for word in words):
        reader.warn("%s: not a hex CPU mask: %s" % (rel, reader.quote(rel, raw)))
        return []
    cpus = []
    for index, word in enumerate(words):
        value = int(word, 16)
        if value and 32 * index + value.bit_length() > reader.cpu_limit:
            reader.warn("%s: sets a CPU past the last possible one, %d" % (rel, reader.cpu_limit - 1))
            return []
        while value:  # the set bits only: a word of a large machine's node mask is mostly zero
            lowest = value & -value
            cpus.append(32 * index + lowest.bit_length() - 1)
            value ^= lowest
    return cpus


def _parse_meminfo(reader: _Reader, rel: str) -> Dict[str, int]:
    """The _MEMINFO_USED fields of a meminfo file: a large machine has one file per node."""
    raw = reader.text(rel)
    values = {}  # type: Dict[str, int]
    for line in (raw or "").splitlines():
        words = line.partition(":")[0].split()
        # The word before the colon names the field: only the used fields' lines are parsed.
        entry = _meminfo_entry(line) if words and words[-1] in _MEMINFO_USED else None
        if entry:
            values[entry[0]] = entry[1]
    if raw is not None and "MemTotal" not in values:
        reader.warn("%s: no MemTotal line; memory sizes unknown" % rel)
    return values


def _meminfo_entry(line: str) -> Optional[Tuple[str, int]]:
    """("MemFree", 123) from "MemFree:  123 kB" or a node's "Node 0 MemFree:  123 kB"; else None."""
    fields = line.split()
    if len(fields) > 2 and fields[0] == "Node" and fields[1].isdecimal():
        del fields[:2]
    if not 2 <= len(fields) <= 3 or fields[2:] not in ([], ["kB"]):
        return None
    name = fields[0][:-1]
    value = parse_integer(fields[1])
    if not fields[0].endswith(":") or not name or name.strip(_MEMINFO_NAME) or value is None or value < 0:
        return None
    return name, value


def _read_distances(reader: _Reader, base: str, keys: List[str]) -> Dict[str, int]:
    """{"0": 10, "1": 21, ...}: the node's distance to each node of ``keys`` (the online nodes' ids)."""
    raw = reader.text(base + "/distance")
    if raw is None:
        return {}
    words = raw.split()
    # A distance is at most 3 digits: checked as text, so 64 nodes' 4096 numbers cost one int() each.
    values = [int(word) if 0 < len(word) <= 3 and not word.strip(DIGITS) else -1 for word in words]
    if any(not 0 <= value <= _MAX_DISTANCE for value in values):
        reader.warn("%s/distance: not a list of distances 0-%d: %s"
                    % (base, _MAX_DISTANCE, reader.quote(base + "/distance", raw)))
        return {}
    if len(values) != len(keys):
        reader.warn("%s/distance: %d values for %d nodes; distances ignored" % (base, len(values), len(keys)))
        return {}
    return dict(zip(keys, values))


def _read_hugepages(reader: _Reader, rel: str) -> Dict[str, Dict[str, Optional[int]]]:
    pools = {}
    for name in reader.listdir(rel):
        if not name.startswith("hugepages-"):
            continue
        pool = "%s/%s" % (rel, name)
        pools[name[len("hugepages-"):]] = {
            "total": reader.integer(pool + "/nr_hugepages"),
            "free": reader.integer(pool + "/free_hugepages"),
        }
    return pools


def _attach_kinds(nodes: List[Dict[str, Any]]) -> None:
    """Each node's ``kind`` (what it holds), ``memory_class`` (whose memory it is, how fast), ``memory_class_from``
    (what gave the class) and ``home_package``.

    A node without CPUs but with memory is a memory-only node: a GPU's own memory (it names the GPU in
    ``gpu_memory_of``, or the GPU sits on it, as coherent GPU memory is onlined), or memory whose class comes from
    HMAT's figures (memory_classes: ``near`` at the host's DRAM speed, else ``far``), or without figures ``far``
    (CXL expanders, HBM or PMEM onlined as a node). Its home package is that of the CPU nodes nearest to it
    (SLIT), when they all sit in one package; a node with CPUs in one package has that one; else None.
    """
    package_of_node = {node["id"]: node["packages"][0] for node in nodes if len(node["packages"]) == 1}
    with_cpus = [node["id"] for node in nodes if node["has_cpus"]]
    classes = memory_classes(nodes, {node["id"]: _figures(node["hmat"]) for node in nodes if node.get("hmat")})
    for node in nodes:
        node["kind"] = KINDS[(node["has_cpus"], node["has_memory"])]
        node["memory_class"], node["memory_class_from"] = (
            (None, None) if not node["has_memory"] else ("local", "cpus") if node["has_cpus"]
            else ("gpu", "gpu") if node["gpu_memory_of"] or node["gpus"]
            else (classes[node["id"]], "hmat") if node["id"] in classes else ("far", "no_cpus"))
        if node["has_cpus"]:
            node["home_package"] = package_of_node.get(node["id"])
            continue
        homes = {package_of_node.get(nearest) for nearest in _nearest(node["distances"], with_cpus)}
        node["home_package"] = homes.pop() if len(homes) == 1 else None


# A memory-only node is DRAM-class (``near``) when it delivers at least this share of the host's DRAM bandwidth and
# at most this multiple of its latency. DRAM nodes of one host differ by DIMM population and the firmware's rounding,
# well within both; CXL expanders and PMEM deliver half a socket's DRAM bandwidth or (much) less at 1.7 to 3 times
# its latency (some 100 ns against 170-350 ns), so each bound alone already leaves them ``far``. HBM beside DRAM
# (more bandwidth, a little more latency) is ``near``.
NEAR_BANDWIDTH_SHARE = 0.6
NEAR_LATENCY_FACTOR = 1.5


def _figures(hmat: Mapping[str, int]) -> Optional[Figures]:
    """HMAT's figures as the weights take them: the lower of read and write bandwidth, and the higher latency;
    None without a bandwidth."""
    bandwidths = [hmat[name] for name in ("read_bandwidth", "write_bandwidth") if name in hmat]
    latencies = [hmat[name] for name in ("read_latency", "write_latency") if name in hmat]
    return (float(min(bandwidths)), float(max(latencies)) if latencies else None) if bandwidths else None


def _class_from_figures(node: Mapping[str, Any]) -> bool:
    """Whether figures decide the node's class: memory without CPUs that is no GPU's memory."""
    return bool(node["has_memory"] and not node["has_cpus"] and not node["gpu_memory_of"] and not node["gpus"])


def memory_classes(nodes: Sequence[Mapping[str, Any]], figures: Mapping[int, Optional[Figures]]) -> Dict[int, str]:
    """``near`` or ``far`` for each memory-only node that is no GPU's memory and has figures, by the host's DRAM.

    The host's DRAM is its nodes with CPUs and memory that have figures; when none has (CPU-less initiators: HMAT
    pairs the memory with initiators that are no CPU node), the memory-only nodes' best bandwidth. The reference is
    the best bandwidth and the lowest latency among them; latency is compared only when both sides know it. Without a
    reference, or for a node without figures, the node is left out (the caller keeps its old rule)."""
    known = {node_id: found for node_id, found in figures.items() if found is not None and found[0] > 0}
    graded = [node for node in nodes if _class_from_figures(node) and node["id"] in known]
    dram = [known[node["id"]] for node in nodes if node["has_cpus"] and node["has_memory"] and node["id"] in known]
    if not dram and graded:
        best = max(known[node["id"]][0] for node in graded)
        dram = [known[node["id"]] for node in graded if known[node["id"]][0] == best]
    if not dram:
        return {}
    bandwidth = max(found[0] for found in dram)
    latencies = [found[1] for found in dram if found[1]]
    latency = min(latencies) if latencies else None
    classes = {}
    for node in graded:
        node_bandwidth, node_latency = known[node["id"]]
        slow = (node_bandwidth < NEAR_BANDWIDTH_SHARE * bandwidth
                or bool(latency and node_latency and node_latency > NEAR_LATENCY_FACTOR * latency))
        classes[node["id"]] = "far" if slow else "near"
    return classes


def _shape(nodes: List[Dict[str, Any]], packages: List[Dict[str, Any]]) -> Dict[str, Any]:
    """How the sockets are split: CPU nodes per package (SNC on Intel, NPS on AMD: more than one is a
    sub-NUMA split), and the memory-only nodes beside them."""
    with_cpus = {node["id"] for node in nodes if node["has_cpus"]}
    counts = sorted({len([n for n in package["nodes"] if n in with_cpus]) for package in packages})
    per_package = counts[0] if len(counts) == 1 else None
    return {"packages": len(packages), "cpu_nodes_per_package": per_package,
            "sub_numa": any(count > 1 for count in counts),
            "memory_only_nodes": [node["id"] for node in nodes if node["kind"] == "memory_only"]}


def _read_memory_tiers(reader: _Reader) -> List[Dict[str, Any]]:
    """The kernel's memory tiers (Linux 6.1+, ``memory_tierN/nodelist``): a lower id is a faster tier."""
    if not reader.exists(MEMORY_TIERING_DIR):
        return []
    tiers = []
    for tier in numbered(reader.listdir(MEMORY_TIERING_DIR), "memory_tier"):
        nodes = reader.nodes("%s/memory_tier%d/nodelist" % (MEMORY_TIERING_DIR, tier))
        if nodes is not None:
            tiers.append({"id": tier, "nodes": nodes})
    return tiers


def _attach_packages(nodes: List[Dict[str, Any]], package_of: Dict[int, int]) -> None:
    for node in nodes:
        node["packages"] = sorted({package_of[cpu] for cpu in node["cpus"] if cpu in package_of})


def _packages(package_of: Dict[int, int], nodes: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    members = {}  # type: Dict[int, List[int]]
    for cpu, package in sorted(package_of.items()):
        members.setdefault(package, []).append(cpu)
    nodes_of = {}  # type: Dict[int, List[int]]
    for node in nodes:  # one pass: a large machine has a hundred packages and dozens of nodes
        for package in node["packages"]:
            nodes_of.setdefault(package, []).append(node["id"])
    return [
        {
            "id": package,
            "cpulist": format_cpulist(cpus),
            "nodes": nodes_of.get(package, []),
        }
        for package, cpus in sorted(members.items())
    ]


# --- PCI devices ----------------------------------------------------------


def _read_pci(reader: _Reader, nodes: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    found = {"gpus": [], "nics": [], "nvme": []}  # type: Dict[str, List[Dict[str, Any]]]
    for address in reader.listdir(PCI_DIR):
        base = "%s/%s" % (PCI_DIR, address)
        device_class = reader.integer(base + "/class", required=False)
        if device_class is None:
            continue
        # Only a display device's vendor matters (a BMC's is no GPU): no read for the others.
        vendor = reader.text(base + "/vendor", required=False) if device_class >> 8 in GPU_CLASSES else None
        kind = _device_kind(device_class, vendor) or ("nic" if reader.listdir(base + "/infiniband") else None)
        # The per-GPU map names each GPU's NICs, so numa-pin exec reads them too; NVMe is facts only.
        if kind is None or (kind == "nvme" and reader.plan_only):
            continue
        record = _pci_record(reader, base, address, device_class, nodes)
        if kind == "gpu":
            found["gpus"].append(record)
        else:
            record["name"] = _device_name(reader, base, "net" if kind == "nic" else "nvme")
            if kind == "nic":
                # The RDMA device (mlx5_0) is what NCCL_IB_HCA and UCX_NET_DEVICES name.
                record["rdma_name"] = _device_name(reader, base, "infiniband")
                record["rdma_ports"] = _rdma_ports(reader, base, record["rdma_name"])
            found["nics" if kind == "nic" else "nvme"].append(record)
    for gpu in found["gpus"]:
        gpu.update(index_facts(gpu, found["gpus"]))
    return found


def _device_kind(device_class: int, vendor: Optional[str]) -> Optional[str]:
    if device_class >> 8 in GPU_CLASSES:
        return None if (vendor or "").lower() in BMC_VENDORS else "gpu"
    if device_class >> 8 in NIC_CLASSES:
        return "nic"
    if device_class == NVME_CLASS:
        return "nvme"
    return None


def _pci_record(reader: _Reader, base: str, address: str, device_class: int,
                nodes: List[Dict[str, Any]]) -> Dict[str, Any]:
    vendor = _pci_id(reader, base + "/vendor")
    local_cpus, cpus_source = _local_cpus(reader, base)
    numa_node, locality = _pci_node(reader, base, local_cpus, cpus_source, nodes)
    return {
        "address": address,
        "vendor_id": vendor,
        "vendor": vendor_name(vendor),
        "device_id": _pci_id(reader, base + "/device"),
        "class": "0x%06x" % device_class,
        "numa_node": numa_node,
        "locality": locality,
        "local_cpulist": format_cpulist(local_cpus or []),
        "pci_path": _pci_path(reader, base, address),
    }


def _pci_path(reader: _Reader, base: str, address: str) -> List[str]:
    """The device's way up to the CPU, from its sysfs link (``../../../devices/pci0000:17/0000:17:00.0/
    0000:18:00.0/0000:19:04.0``): its host bridge (``pci0000:17``), then each bridge below it, the root port first;
    [] when the link says nothing of that. Two devices that share a bridge talk through a PCIe switch, not the CPU."""
    text = reader.link(base)
    parts = (text or "").split("/")
    hosts = [index for index, part in enumerate(parts) if _is_host_bridge(part)]
    if not hosts:
        return []
    path = parts[hosts[0]:]
    if path[-1] != address or not all(is_pci_address(part) for part in path[1:]):
        reader.warn("%s: a link that does not lead from a host bridge to %s through PCI addresses: %s" % (
            base, address, reader.quote(base, text or "")))
        return []
    return path[:-1]


def _is_host_bridge(name: str) -> bool:
    """``pci0000:17``: a PCI host bridge's directory, by domain and bus."""
    domain, bus = name[3:].partition(":")[::2]
    return name[:3] == "pci" and 4 <= len(domain) <= 8 and len(bus) == 2 and not (domain + bus).strip(HEX_DIGITS)


def _pci_id(reader: _Reader, rel: str) -> Optional[str]:
    """A PCI vendor or device id as sysfs prints it ("0x10de"), in lower case; None when absent or
    anything else (the facts carry the id, never what else a file holds)."""
    raw = reader.text(rel, required=False)
    if not raw:
        return None
    if len(raw) == 6 and raw[:2] == "0x" and not raw[2:].strip(HEX_DIGITS):
        return raw.lower()
    reader.warn("%s: not a PCI id (0x and 4 hex digits): %s" % (rel, reader.quote(rel, raw)))
    return None


def _local_cpus(reader: _Reader, base: str) -> Tuple[Optional[List[int]], str]:
    """(the device's local CPUs, the file that listed them): ``local_cpulist``, else the ``local_cpus``
    mask (all that old kernels and some firmware give); None for the CPUs when neither is readable."""
    cpus = reader.cpus(base + "/local_cpulist", required=False)
    if cpus is not None:
        return cpus, "local_cpulist"
    return _parse_cpumap(reader, base + "/local_cpus"), "local_cpus"


def _pci_node(reader: _Reader, base: str, local_cpus: Optional[List[int]], cpus_source: str,
              nodes: List[Dict[str, Any]]) -> Tuple[Optional[int], Optional[str]]:
    """(the device's node, the file that told it): ``numa_node`` when it names a node of the topology,
    else the one node its local CPUs fall on (``cpus_source`` listed them); (None, None) when neither says."""
    numa_node = _named_node(reader, base + "/numa_node", nodes)
    if numa_node is not None:
        return numa_node, "numa_node"
    numa_node = _node_from_cpus(local_cpus, nodes)
    return (numa_node, cpus_source) if numa_node is not None else (None, None)


def _named_node(reader: _Reader, rel: str, nodes: List[Dict[str, Any]]) -> Optional[int]:
    """The node a device's ``numa_node`` names; None for -1 (the kernel knows none) and, warned, for a
    node the topology does not have: the device's local CPUs are asked instead."""
    numa_node = reader.integer(rel, required=False)
    if numa_node is None or numa_node < 0:
        return None
    if numa_node >= reader.node_limit:
        reader.warn("%s: %d is past the last possible node, %d; the device's node is taken from its local CPUs"
                    % (rel, numa_node, reader.node_limit - 1))
        return None
    if all(node["id"] != numa_node for node in nodes):
        reader.warn("%s: names node %d, which is not among the topology's nodes (%s); the device's node is "
                    "taken from its local CPUs" % (rel, numa_node, format_cpulist(node["id"] for node in nodes)))
        return None
    return numa_node


def _gpu_memory_node(reader: _Reader, gpu: Dict[str, Any], nodes_by_id: Dict[int, Dict[str, Any]]) -> Optional[int]:
    """The node holding the GPU's own memory, where the driver onlines it as system memory
    (GH200/GB200 HBM, POWER9 NVLink GPUs): NVIDIA's ``numa_status`` says ``Node: N`` and
    ``Status: online``. That node has no CPUs: a numa_status naming a node the topology lacks, or one
    with CPUs, is warned and names none."""
    if gpu["vendor"] != "nvidia":
        return None
    rel = "%s/%s/numa_status" % (NVIDIA_GPUS_DIR, gpu["address"])
    fields = parse_status(reader.text(rel, required=False) or "")
    node = parse_integer(fields.get("Node", ""))
    if node is None or node < 0 or fields.get("Status") != "online":
        return None
    if node not in nodes_by_id:
        reader.warn("%s: names node %d, which the topology does not list; GPU memory node unknown" % (rel, node))
        return None
    if nodes_by_id[node]["has_cpus"]:
        reader.warn("%s: names node %d, which has CPUs (%s), while the driver onlines a GPU's memory as a node "
                    "without CPUs; GPU memory node unknown" % (rel, node, nodes_by_id[node]["cpulist"]))
        return None
    return node


def _node_from_cpus(local_cpus: Optional[List[int]], nodes: List[Dict[str, Any]]) -> Optional[int]:
    """The one node whose CPUs the device's local CPUs fall on, if exactly one."""
    if not local_cpus:
        return None
    wanted = set(local_cpus)
    touching = [node["id"] for node in nodes if wanted & set(node["cpus"])]
    return touching[0] if len(touching) == 1 and len(nodes) > 1 else None


def _device_name(reader: _Reader, base: str, subdir: str) -> Optional[str]:
    names = reader.listdir(base + "/" + subdir)
    return names[0] if names else None


def _rdma_ports(reader: _Reader, base: str, rdma_name: Optional[str]) -> List[Dict[str, Any]]:
    """The ports of the NIC's RDMA device (``infiniband/mlx5_0/ports/1``, which UCX names ``mlx5_0:1``), by number,
    each with its ``state`` and ``link_layer`` (None, warned, when garbage); [] without an RDMA device or ports.
    sysfs has each port as a directory: a link there is not the kernel's, so it is warned and not followed."""
    if rdma_name is None:
        return []
    ports_dir = "%s/infiniband/%s/ports" % (base, rdma_name)
    if _planted_link(reader, ports_dir):
        return []
    names = reader.listdir(ports_dir)
    numbers = [number for number in numbered(names, "") if 1 <= number <= MAX_RDMA_PORT]
    others = sorted(set(names) - {str(number) for number in numbers})
    if others:
        reader.warn("%s: entries that are no port number from 1 to %d, skipped: %s" % (
            ports_dir, MAX_RDMA_PORT, reader.quote(ports_dir, ", ".join(others))))
    ports = []
    for number in numbers:
        port_dir = "%s/%d" % (ports_dir, number)
        if not _planted_link(reader, port_dir):
            ports.append({"port": number, "state": _port_field(reader, port_dir + "/state", parse_port_state),
                          "link_layer": _port_field(reader, port_dir + "/link_layer", _link_layer)})
    return ports


def _planted_link(reader: _Reader, rel: str) -> bool:
    """Whether ``rel``, a directory in sysfs, is a symbolic link (warned: not followed)."""
    text = reader.link(rel)
    if text is None:
        return False
    reader.warn("%s: a link (to %s) where sysfs has a directory; not followed" % (rel, reader.quote(rel, text)))
    return True


def _port_field(reader: _Reader, rel: str, parse: Callable[[str], Optional[str]]) -> Optional[str]:
    raw = reader.text(rel, required=False)
    value = parse(raw) if raw is not None else None
    if raw is not None and value is None:
        reader.warn("%s: not what the kernel prints there: %s" % (rel, reader.quote(rel, raw)))
    return value


def parse_port_state(text: str) -> Optional[str]:
    """``4: ACTIVE`` -> ``ACTIVE``: the name of an RDMA port's state where its number is the kernel's for that name
    (PORT_STATES); None for anything else."""
    number, separator, name = text.partition(": ")
    if not separator or not is_kernel_number(number) or int(number) >= len(PORT_STATES):
        return None
    return name if PORT_STATES[int(number)] == name else None


def _link_layer(text: str) -> Optional[str]:
    return text if text in LINK_LAYERS else None


# --- kernel knobs -----------------------------------------------------------


def _read_kernel_knobs(reader: _Reader) -> Dict[str, Any]:
    if reader.plan_only:
        return {"weighted_interleave": _read_interleave_weights(reader)}
    return {
        "numa_balancing": reader.integer("proc/sys/kernel/numa_balancing", required=False),
        "zone_reclaim_mode": reader.integer("proc/sys/vm/zone_reclaim_mode", required=False),
        "transparent_hugepage": _thp_mode(reader),
        "weighted_interleave": _read_interleave_weights(reader),
        "features": _read_features(reader),
    }


def _read_features(reader: _Reader) -> Dict[str, Any]:
    """What the kernel offers memory placement: weighted interleave (6.9) and its ``auto`` weights (from
    HMAT, 6.16), memory tiers (6.1), demotion of cold pages to a slower tier, and balancing mode 2, which
    promotes hot pages between tiers without balancing across sockets (5.18)."""
    release = reader.text("proc/sys/kernel/osrelease", required=False)
    version = _release_version(release)
    return {
        "release": release.strip() if release else None,
        "weighted_interleave": reader.exists(_WEIGHTS_DIR),
        "weighted_interleave_auto": _boolean_file(reader, _WEIGHTS_DIR + "/auto"),
        "memory_tiering": reader.exists(MEMORY_TIERING_DIR),
        "demotion_enabled": _boolean_file(reader, "sys/kernel/mm/numa/demotion_enabled"),
        "balancing_tiering_mode": None if version is None else version >= (5, 18),
    }


def _release_version(release: Optional[str]) -> Optional[Tuple[int, int]]:
    """(major, minor) of a kernel release such as "6.12.43+deb13-amd64"; None when it does not start so."""
    parts = (release or "").strip().split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    minor = _leading_digits(parts[1])
    return (int(parts[0]), int(minor)) if minor else None


def _boolean_file(reader: _Reader, rel: str) -> Optional[bool]:
    """A sysfs boolean ("true"/"false", "1"/"0", "Y"/"N"); None when absent or anything else."""
    text = reader.text(rel, required=False)
    word = (text or "").strip().lower()
    return True if word in ("true", "1", "y") else False if word in ("false", "0", "n") else None


def _thp_mode(reader: _Reader) -> Optional[str]:
    """The transparent hugepage mode the kernel marks ("madvise"); None when absent or unmarked."""
    text = reader.text(_THP_ENABLED, required=False)
    if not text:
        return None
    choice = _marked_choice(text)
    if choice is None:
        reader.warn("%s: no [mode] marked: %s" % (_THP_ENABLED, reader.quote(_THP_ENABLED, text)))
    return choice


def _marked_choice(text: str) -> Optional[str]:
    """The first bracketed name of a kernel choice file: "always [madvise] never" -> "madvise"."""
    start = text.find("[")
    while start >= 0:
        end = text.find("]", start)
        if end < 0:
            return None
        name = text[start + 1:end]
        if name and not name.strip(_CHOICE_NAME):
            return name
        start = text.find("[", start + 1)
    return None


def _read_interleave_weights(reader: _Reader) -> Optional[Dict[str, int]]:
    base = _WEIGHTS_DIR
    if not reader.exists(base):
        return None
    weights = {}
    for node in _within(reader, numbered(reader.listdir(base), "node"), reader.node_limit, base + "/node"):
        weight = reader.integer("%s/node%d" % (base, node))
        if weight is not None:
            weights[str(node)] = weight
    return weights
