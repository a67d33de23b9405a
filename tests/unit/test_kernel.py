"""kernel.py: bitmasks, syscall tables, and the real syscalls on this (one-node) host.

Calls that change the calling thread's policy or affinity run in a child Python, so
the test process keeps its own.
"""
import ctypes
import errno
import mmap
import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.system import kernel
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build")
PAGE = mmap.PAGESIZE
WORD = ctypes.sizeof(ctypes.c_ulong) * 8
MISSING_CPU = 4000  # no test host has this CPU

CHILD_PRELUDE = """
import json, os, sys
from ansible_collections.inferops.numa.plugins.module_utils.numa.system import kernel

def attempt(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except kernel.KernelCallError as exc:
        return {"call": exc.call, "errno": exc.errno, "message": str(exc)}
    return {"ok": True}
"""

SECCOMP = """
import ctypes

class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

def fail_syscall(number, err):
    # load seccomp_data.nr; if it is `number` return SECCOMP_RET_ERRNO|err, else allow
    insns = (Insn * 4)(Insn(0x20, 0, 0, 0), Insn(0x15, 0, 1, number),
                       Insn(0x06, 0, 0, 0x00050000 | err), Insn(0x06, 0, 0, 0x7fff0000))
    prog = Prog(4, insns)
    libc = ctypes.CDLL(None, use_errno=True)
    ulong = ctypes.c_ulong
    assert libc.prctl(ulong(38), ulong(1), ulong(0), ulong(0), ulong(0)) == 0  # PR_SET_NO_NEW_PRIVS
    assert libc.prctl(ulong(22), ulong(2), ctypes.byref(prog), ulong(0), ulong(0)) == 0  # SECCOMP_MODE_FILTER
"""


def mask_bits(mask):
    return {index * WORD + bit for index, value in enumerate(mask) for bit in range(WORD) if value >> bit & 1}


def kernel_at_least(version):
    release = tuple(int(part) for part in os.uname().release.split("-")[0].split(".")[:2])
    return release >= version


def test_nodemask_sets_sparse_node_bits():
    mask, maxnode = kernel.nodemask([1023, 0, 250, 8, 8])
    assert mask_bits(mask) == {0, 8, 250, 1023}
    assert len(mask) == 1024 // WORD
    assert mask[0] == 1 | 1 << 8
    assert mask[250 // WORD] == 1 << (250 % WORD)
    assert mask[-1] == 1 << (WORD - 1)
    # the kernel reads maxnode - 1 bits: exactly the array's bits
    assert maxnode - 1 == len(mask) * WORD


def test_nodemask_keeps_the_top_bit_of_a_word_and_handles_no_nodes():
    mask, maxnode = kernel.nodemask([WORD - 1])
    assert (len(mask), maxnode, mask_bits(mask)) == (1, WORD + 1, {WORD - 1})
    mask, maxnode = kernel.nodemask([])
    assert (len(mask), maxnode, mask_bits(mask)) == (1, WORD + 1, set())


@pytest.mark.parametrize("bad", [-1, "0", True, 1.0, kernel.MAX_NODES])
def test_nodemask_rejects_what_is_not_a_node_id(bad):
    with pytest.raises(NumaError, match="node"):
        kernel.nodemask([0, bad])


def test_policy_modes_are_the_kernel_numbers():
    assert kernel.POLICY_MODES == {
        "default": kernel.MPOL_DEFAULT, "preferred": kernel.MPOL_PREFERRED, "bind": kernel.MPOL_BIND,
        "interleave": kernel.MPOL_INTERLEAVE, "local": kernel.MPOL_LOCAL,
        "preferred-many": kernel.MPOL_PREFERRED_MANY, "weighted-interleave": kernel.MPOL_WEIGHTED_INTERLEAVE}
    assert sorted(kernel.POLICY_MODES.values()) == list(range(7))


def test_syscall_tables_match_the_kernel_headers():
    numbers = kernel.SYSCALL_NUMBERS
    assert numbers["x86_64"] == {"mbind": 237, "set_mempolicy": 238, "get_mempolicy": 239, "migrate_pages": 256,
                                 "move_pages": 279}
    assert numbers["aarch64"] == {"mbind": 235, "get_mempolicy": 236, "set_mempolicy": 237, "migrate_pages": 238,
                                  "move_pages": 239}
    assert kernel.syscall_numbers() == numbers[os.uname().machine]


def test_unknown_architecture_is_a_numa_error(monkeypatch):
    monkeypatch.setattr(kernel, "_machine", lambda: "sparc64")
    with pytest.raises(NumaError, match="sparc64.*unavailable|unavailable.*sparc64"):
        kernel.syscall_numbers()
    with pytest.raises(NumaError, match="sparc64") as caught:
        kernel.set_mempolicy("bind", [0])
    assert not isinstance(caught.value, kernel.KernelCallError)


@pytest.mark.parametrize("policy, nodes", [
    ("default", [0]), ("local", [0]), ("bind", []), ("preferred", [7, 8]), ("fastest", [0])])
def test_policy_and_node_count_are_checked_before_the_call(policy, nodes):
    # every case would also fail in the kernel, so a missing check cannot change this process
    with pytest.raises(NumaError) as caught:
        kernel.set_mempolicy(policy, nodes)
    assert not isinstance(caught.value, kernel.KernelCallError)
    assert policy in str(caught.value)


@pytest.mark.parametrize("cpus, words", [([], "no CPUs"), ([-1], "CPU id -1"), ([kernel.MAX_CPUS], "beyond")])
def test_affinity_arguments_are_checked_before_the_call(cpus, words):
    before = os.sched_getaffinity(0)
    with pytest.raises(NumaError, match=words) as caught:
        kernel.set_cpu_affinity(cpus)
    assert not isinstance(caught.value, kernel.KernelCallError)
    assert os.sched_getaffinity(0) == before


def test_touched_pages_are_on_node_0():
    region = mmap.mmap(-1, 16 * PAGE)
    region.write(b"x" * len(region))
    anchor = ctypes.c_char.from_buffer(region)
    base = ctypes.addressof(anchor)
    try:
        assert kernel.query_page_nodes([base + index * PAGE for index in range(16)]) == [0] * 16
    finally:
        del anchor
        region.close()


def test_untouched_and_unmapped_pages_give_negative_errnos():
    region = mmap.mmap(-1, 4 * PAGE)
    anchor = ctypes.c_char.from_buffer(region)
    base = ctypes.addressof(anchor)
    del anchor
    untouched = kernel.query_page_nodes([base + index * PAGE for index in range(4)])
    assert all(status in (-errno.ENOENT, -errno.EFAULT) for status in untouched), untouched
    region.close()
    assert kernel.query_page_nodes([base]) == [-errno.EFAULT]
    assert kernel.query_page_nodes([]) == []
