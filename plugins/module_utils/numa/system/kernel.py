"""The one place that makes the kernel's NUMA syscalls, and sets CPU affinity.

A thin layer: it turns node lists into the kernel's bitmasks, calls through libc's
``syscall(2)`` and turns a failing errno into a ``KernelCallError`` whose message
names what was asked, the likely cause and the fix. It reads nothing from /proc or
/sys: callers that know the allowed nodes or CPUs pass them as the ``allowed`` hint
so that messages can name them.

A memory policy belongs to the calling thread (and is inherited by children and kept
across execve): set it in the thread that later allocates or execs the server.

The numa-pin helper imports this module on every server start, so ``ctypes`` and
``array`` are imported inside the functions that use them, ``typing`` only for type
checkers (it costs 6-12 ms to import here), ``platform`` not at all, and the list
formatter (which needs ``re``) only to build an error message.
"""
from __future__ import annotations

import errno
import os
import struct

from ..base.errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes
    from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_INTERLEAVE = 3
MPOL_LOCAL = 4
MPOL_PREFERRED_MANY = 5
MPOL_WEIGHTED_INTERLEAVE = 6

POLICY_MODES = {
    "default": MPOL_DEFAULT,
    "preferred": MPOL_PREFERRED,
    "bind": MPOL_BIND,
    "interleave": MPOL_INTERLEAVE,
    "local": MPOL_LOCAL,
    "preferred-many": MPOL_PREFERRED_MANY,
    "weighted-interleave": MPOL_WEIGHTED_INTERLEAVE,
}  # type: Dict[str, int]
_MODE_NAMES = {number: name for name, number in POLICY_MODES.items()}
# Policies the kernel rejects with EINVAL when given nodes, or without them.
_NO_NODES = ("default", "local")
_ONE_NODE = ("preferred",)
# Kernels older than these reject the mode itself with EINVAL.
_MIN_KERNEL = {"preferred-many": "5.15", "weighted-interleave": "6.9"}

# get_mempolicy ORs MPOL_F_STATIC_NODES, MPOL_F_RELATIVE_NODES and
# MPOL_F_NUMA_BALANCING into the mode it returns.
_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)

# Bits in every mask we hand the kernel for reading back, and one past the highest
# node id accepted. No kernel config allows more than 1024 nodes (NODES_SHIFT <= 10);
# get_mempolicy needs a buffer of at least nr_node_ids bits, so this leaves margin.
MAX_NODES = 4096
# One past the highest CPU id accepted: above every kernel's NR_CPUS (8192 at most),
# and it keeps a typo from making Python build a gigabyte affinity mask.
MAX_CPUS = 1 << 16

# From the kernel's tables: arch/x86/entry/syscalls/syscall_64.tbl,
# include/uapi/asm-generic/unistd.h (arm64, riscv64, loongarch64),
# arch/powerpc/kernel/syscalls/syscall.tbl and arch/s390/kernel/syscalls/syscall.tbl.
_GENERIC = {"mbind": 235, "get_mempolicy": 236, "set_mempolicy": 237, "migrate_pages": 238, "move_pages": 239}
_POWERPC = {"mbind": 259, "get_mempolicy": 260, "set_mempolicy": 261, "migrate_pages": 258, "move_pages": 301}
SYSCALL_NUMBERS = {
    "x86_64": {"mbind": 237, "set_mempolicy": 238, "get_mempolicy": 239, "migrate_pages": 256, "move_pages": 279},
    "aarch64": _GENERIC,
    "riscv64": _GENERIC,
    "loongarch64": _GENERIC,
    "ppc64": _POWERPC,
    "ppc64le": _POWERPC,
    "s390x": {"mbind": 268, "get_mempolicy": 269, "set_mempolicy": 270, "migrate_pages": 287, "move_pages": 310},
}  # type: Dict[str, Dict[str, int]]

# openat2(2) (Linux 5.6) shares one number on every architecture above, as every syscall added since Linux 5.1.
SYS_OPENAT2 = 437
# linux/openat2.h: resolve the path as if the directory fd were "/"; refuse /proc's magic links.
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
# Where openat2 is missing: an older kernel, or a seccomp filter (container runtimes answer ENOSYS or EPERM).
_NO_OPENAT2 = (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG)

_LIBC = None
_OPEN_HOW = {}  # type: Dict[int, bytes]
_RAW_SYSCALL = None  # type: Optional[Tuple[Any, Any]]


class KernelCallError(NumaError):
    """A syscall failed or did less than asked; ``errno`` is the kernel's error number,
    ``call`` the syscall's name. A NumaError, so the edges report it like any other."""

    def __init__(self, call: str, err: int, message: str) -> None:
        super().__init__(message)
        self.call = call
        self.errno = err


def libc() -> ctypes.CDLL:
    """This process's C library (loaded once; ``syscall`` returns a C long)."""
    global _LIBC
    if _LIBC is None:
        import ctypes

        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        _LIBC = lib
    return _LIBC


def open_in_root(root_fd: int, rel: str, flags: int) -> int:
    """An fd of ``rel`` resolved as if ``root_fd`` were ``/``: links and ``..`` never leave it (a chroot's
    lookup, done by the kernel in one call). OSError with the kernel's errno."""
    how = _OPEN_HOW.get(flags)
    if how is None:
        # struct open_how {u64 flags, mode, resolve}, passed as the bytes it is made of.
        how = _OPEN_HOW[flags] = struct.pack("=QQQ", flags, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    syscall, get_errno = _raw_syscall()
    fd = syscall(SYS_OPENAT2, root_fd, rel.encode("utf-8", "surrogateescape"), how, len(how))
    if fd < 0:
        err = get_errno()
        raise OSError(err, os.strerror(err), rel)
    return fd


def _raw_syscall() -> Tuple[Any, Any]:
    """(libc's syscall returning a C int, its errno getter) from ``_ctypes`` itself: a reader under --root
    opens a thousand files through it, and ``import ctypes`` (its Python half) costs 5 ms here, a
    sixth of a whole ``numa-pin facts --root``; these three lines of it are all openat2 needs."""
    global _RAW_SYSCALL
    if _RAW_SYSCALL is None:
        import _ctypes

        class CInt(_ctypes._SimpleCData):  # type: ignore[misc,name-defined]
            _type_ = "i"

        class Syscall(_ctypes.CFuncPtr):  # type: ignore[misc,name-defined]
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = CInt

        this_program = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[attr-defined]
        _RAW_SYSCALL = Syscall(_ctypes.dlsym(this_program, "syscall")), _ctypes.get_errno  # type: ignore[attr-defined]
    return _RAW_SYSCALL


def has_open_in_root(root_fd: int) -> bool:
    """Whether open_in_root works here: 64-bit, an architecture of SYSCALL_NUMBERS, Linux 5.6 or later, and
    no seccomp filter refusing openat2."""
    try:
        syscall_numbers()
    except NumaError:
        return False
    try:
        os.close(open_in_root(root_fd, ".", os.O_PATH | os.O_CLOEXEC))
    except OSError as error:
        if error.errno in _NO_OPENAT2:
            return False
        raise
    return True


def syscall_numbers() -> Dict[str, int]:
    """Syscall numbers of mbind, get/set_mempolicy and move_pages on this machine."""
    import sys

    machine = _machine()
    # uname reports the kernel's arch: a 32-bit Python on a 64-bit kernel would
    # get the 64-bit numbers, which mean other calls in its own table.
    table = SYSCALL_NUMBERS.get(machine) if sys.maxsize > 2 ** 32 else None
    if table is None:
        userland = "" if sys.maxsize > 2 ** 32 else " with a 32-bit Python"
        raise NumaError(
            "NUMA memory policy is unavailable on architecture %r%s: inferops.numa knows the "
            "syscall numbers of set_mempolicy, get_mempolicy and move_pages only for 64-bit %s. "
            "Run the server without a memory policy there (policy 'default'), or add the numbers "
            "from the kernel's syscall table to kernel.py" % (machine, userland, ", ".join(sorted(SYSCALL_NUMBERS))))
    return table


def nodemask(nodes: Iterable[int]) -> Tuple[ctypes.Array[ctypes.c_ulong], int]:
    """Node ids -> (array of unsigned long with those bits set, maxnode to pass with it)."""
    import ctypes

    ids = _ids(nodes, "node", MAX_NODES)
    word = ctypes.sizeof(ctypes.c_ulong) * 8
    mask = (ctypes.c_ulong * (ids[-1] // word + 1 if ids else 1))()
    for node in ids:
        mask[node // word] |= 1 << (node % word)
    # The kernel's get_nodes() starts with --maxnode and then reads maxnode bits, so it
    # reads one bit less than it is told: passing the array's bit count would silently
    # drop its top bit (node 63, 127, ...). One more makes it read every bit we wrote;
    # bits past the kernel's own MAX_NUMNODES are accepted as long as they are zero.
    return mask, len(mask) * word + 1


def set_mempolicy(policy: str, nodes: Sequence[int], allowed: Optional[Iterable[int]] = None) -> None:
    """Set the calling thread's memory policy, e.g. ``("bind", [0])``.

    The kernel quietly drops nodes outside the task's cpuset or without memory as
    long as one is left; that is raised here as an error too, after the narrower
    policy has taken effect, so that a caller never runs with less than it planned.
    ``allowed`` (the nodes the caller knows are usable, e.g. Mems_allowed_list) only
    improves the messages.
    """
    import ctypes

    mode = _mode(policy)
    ids = _ids(nodes, "node", MAX_NODES)
    _check_node_count(policy, ids)
    mask, maxnode = nodemask(ids)
    err = _syscall("set_mempolicy", ctypes.c_long(mode), mask, ctypes.c_ulong(maxnode))
    if err:
        raise _failure("set_mempolicy", err, "%s, nodes %s" % (policy, _fmt(ids)), allowed, policy)
    applied = get_mempolicy()[1]
    if applied != ids:
        raise KernelCallError("set_mempolicy", errno.EINVAL, (
            "set_mempolicy(%s, nodes %s) applied only nodes %s: the kernel dropped nodes %s as "
            "offline, without memory or outside this task's cpuset mems%s. Fix: choose nodes from "
            "Mems_allowed_list in /proc/self/status, or widen the cgroup's cpuset.mems / the "
            "unit's AllowedMemoryNodes=" % (policy, _fmt(ids), _fmt(applied), _fmt(set(ids) - set(applied)),
                                            _allowed_text(allowed))))


def get_mempolicy() -> Tuple[str, List[int]]:
    """The calling thread's policy name and nodes, e.g. ``("bind", [0])``.

    A mode this module has no name for comes back as ``"mode-<number>"``.
    """
    import ctypes

    mode = ctypes.c_int(0)
    word = ctypes.sizeof(ctypes.c_ulong) * 8
    mask = (ctypes.c_ulong * (MAX_NODES // word))()
    # maxnode is one more than the buffer's bits for the same reason as in nodemask().
    err = _syscall("get_mempolicy", ctypes.byref(mode), mask, ctypes.c_ulong(MAX_NODES + 1),
                   None, ctypes.c_ulong(0))
    if err:
        raise _failure("get_mempolicy", err, "", None, "")
    number = mode.value & ~_MODE_FLAGS
    nodes = [index * word + bit for index, value in enumerate(mask) if value
             for bit in range(word) if value >> bit & 1]
    return _MODE_NAMES.get(number, "mode-%d" % number), nodes


def set_cpu_affinity(cpus: Iterable[int], allowed: Optional[Iterable[int]] = None) -> None:
    """Pin the calling thread to exactly ``cpus``.

    Like set_mempolicy, the kernel silently drops offline CPUs or CPUs outside the
    cpuset as long as one is left; that is raised as an error after the narrower
    affinity has taken effect. ``allowed`` (e.g. Cpus_allowed_list) improves messages.
    """
    ids = _ids(cpus, "CPU", MAX_CPUS)
    if not ids:
        raise NumaError("set_cpu_affinity got no CPUs: the task would have nowhere to run; "
                        "pass the plan's CPU list")
    try:
        os.sched_setaffinity(0, ids)
    except OSError as exc:
        raise _failure("sched_setaffinity", exc.errno or 0, "CPUs %s" % _fmt(ids), allowed, "") from None
    applied = sorted(os.sched_getaffinity(0))
    if applied != ids:
        raise KernelCallError("sched_setaffinity", errno.EINVAL, (
            "sched_setaffinity(CPUs %s) applied only CPUs %s: the kernel dropped CPUs %s as offline "
            "or outside this task's cpuset%s. Fix: choose CPUs from Cpus_allowed_list in "
            "/proc/self/status, or widen the cgroup's cpuset.cpus / the unit's AllowedCPUs="
            % (_fmt(ids), _fmt(applied), _fmt(set(ids) - set(applied)), _allowed_text(allowed))))


def query_page_nodes(addresses: Sequence[int]) -> List[int]:
    """The node of the page at each address in this process, or a negative errno.

    ``-ENOENT``: the page is not present (never touched, or not mapped in yet);
    ``-EFAULT``: nothing is mapped there. Uses move_pages(2) with no target nodes,
    which only reports and moves nothing.
    """
    import array
    import ctypes

    count = len(addresses)
    if not count:
        return []
    # unsigned long has pointer width on every 64-bit Linux (32-bit Pythons were
    # refused above), so this is the kernel's ``const void **pages``.
    pages = array.array("L", addresses)
    status = array.array("i", [0]) * count
    err = _syscall("move_pages", ctypes.c_long(0), ctypes.c_ulong(count),
                   ctypes.c_void_p(pages.buffer_info()[0]), None,
                   ctypes.c_void_p(status.buffer_info()[0]), ctypes.c_long(0))
    if err:
        raise _failure("move_pages", err, "%d pages" % count, None, "")
    return status.tolist()


def migrate_pages(pid: int, from_nodes: Sequence[int], to_nodes: Sequence[int]) -> int:
    """Move process ``pid``'s pages on ``from_nodes`` to ``to_nodes``; the number of pages left where they were.

    The pages the process maps alone, and as root (CAP_SYS_NICE) the shared ones too. The kernel
    keeps the relative order of the two node sets (migrate_pages(2)): with one target node every
    page goes there.
    """
    import ctypes

    sources = _ids(from_nodes, "node", MAX_NODES)
    targets = _ids(to_nodes, "node", MAX_NODES)
    # Both masks as wide as the one maxnode passed with them: that of the union.
    union, maxnode = nodemask(sources + targets)
    source, target = type(union)(), type(union)()
    word = ctypes.sizeof(ctypes.c_ulong) * 8
    for mask, ids in ((source, sources), (target, targets)):
        for node in ids:
            mask[node // word] |= 1 << (node % word)
    left = libc().syscall(ctypes.c_long(syscall_numbers()["migrate_pages"]), ctypes.c_long(pid),
                          ctypes.c_ulong(maxnode), source, target)
    if left == -1:
        raise _failure("migrate_pages", ctypes.get_errno(), "pid %d, nodes %s -> %s" % (
            pid, _fmt(sources), _fmt(targets)), None, "")
    return left


def _syscall(call: str, *args: object) -> int:
    """0, or the errno of a failed call. Every argument is a C long or pointer:
    syscall(2) reads all of them as longs."""
    import ctypes

    number = syscall_numbers()[call]
    if libc().syscall(ctypes.c_long(number), *args) == -1:
        return ctypes.get_errno()
    return 0


def _machine() -> str:
    # What platform.machine() returns on Linux, without importing platform: it pulls
    # in re, enum and collections, 5-8 ms here, more than the helper's budget.
    return os.uname().machine


def _mode(policy: str) -> int:
    if policy not in POLICY_MODES:
        raise NumaError("unknown memory policy %r: use one of %s"
                        % (policy, ", ".join(sorted(POLICY_MODES))))
    return POLICY_MODES[policy]


def _check_node_count(policy: str, ids: List[int]) -> None:
    if policy in _NO_NODES and ids:
        raise NumaError("memory policy %r takes no nodes but got %s: drop the nodes, or use "
                        "'bind' or 'preferred' to name them" % (policy, _fmt(ids)))
    if policy in _ONE_NODE and len(ids) != 1:
        raise NumaError("memory policy 'preferred' takes exactly one node but got %s: name one "
                        "node, or use 'preferred-many' for several" % (_fmt(ids) or "none"))
    if policy not in _NO_NODES and not ids:
        raise NumaError("memory policy %r needs at least one node: name the nodes, or use "
                        "'default' or 'local'" % policy)


def _ids(values: Iterable[int], kind: str, limit: int) -> List[int]:
    ids = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise NumaError("%s id %r is not a number of 0 or more: pass %s ids as integers, "
                            "like 0 or 3" % (kind, value, kind))
        if value >= limit:
            raise NumaError("%s %d is beyond the %d %ss any Linux kernel supports: pass %s ids as "
                            "the kernel numbers them (see lscpu / numactl --hardware)"
                            % (kind, value, limit, kind, kind))
        ids.add(value)
    return sorted(ids)


def _fmt(ids: Iterable[int]) -> str:
    # cpulist imports re and typing; only messages need it.
    from ..base.cpulist import format_cpulist

    return format_cpulist(ids)


def _allowed_text(allowed: Optional[Iterable[int]]) -> str:
    return "" if allowed is None else " (allowed here: %s)" % (_fmt(allowed) or "none")


def _failure(call: str, err: int, request: str, allowed: Optional[Iterable[int]], policy: str) -> KernelCallError:
    """The error for ``call(request)`` failing with ``err``: cause and fix."""
    name = errno.errorcode.get(err, "errno %d" % err)
    asked = "%s(%s) failed with %s" % (call, request, name)
    if err == errno.EPERM:
        why = ("a seccomp filter blocks it: container runtimes' default profiles allow NUMA syscalls "
               "only with CAP_SYS_NICE, and systemd units need @resources in SystemCallFilter=. Fix: "
               "run outside the sandbox, add --cap-add SYS_NICE, or drop SystemCallFilter=~@resources "
               "(or add SystemCallFilter=@resources) in the unit")
    elif err == errno.ENOSYS:
        config = "CONFIG_NUMA and CONFIG_MIGRATION" if call == "move_pages" else "CONFIG_NUMA"
        why = ("this kernel has no %s (built without %s, or a seccomp filter answers ENOSYS). "
               "Fix: run the server with policy 'default' here, or boot a kernel with %s" % (call, config, config))
    elif err == errno.EFAULT:
        why = ("the kernel could not access a buffer passed to it: a bug in inferops.numa's kernel.py; "
               "report it with this message")
    elif err == errno.EINVAL and call == "set_mempolicy":
        why = ("none of the nodes is usable: they do not exist, have no memory, or lie outside this "
               "task's cpuset mems%s. Fix: choose nodes from Mems_allowed_list in /proc/self/status, "
               "or widen the cgroup's cpuset.mems / the unit's AllowedMemoryNodes=" % _allowed_text(allowed))
        if policy in _MIN_KERNEL:
            why += "; policy %r also needs Linux >= %s" % (policy, _MIN_KERNEL[policy])
    elif err == errno.EINVAL and call == "sched_setaffinity":
        why = ("none of the CPUs is online and inside this task's cpuset%s. Fix: choose CPUs from "
               "Cpus_allowed_list in /proc/self/status, or widen the cgroup's cpuset.cpus / the "
               "unit's AllowedCPUs=" % _allowed_text(allowed))
    else:
        why = "%s; check the arguments and the kernel log (dmesg)" % os.strerror(err)
    return KernelCallError(call, err, "%s: %s" % (asked, why))
