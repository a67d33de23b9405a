"""kernel.py: bitmasks, syscall tables, and the real syscalls on this (one-node) host.

Calls that change the calling thread's policy or affinity run in a child Python, so
the test process keeps its own.
"""
import ctypes
import errno
import json
import mmap
import os
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa import kernel
from ansible_collections.inferops.numa.plugins.module_utils.numa.errors import NumaError

BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build")
PAGE = mmap.PAGESIZE
WORD = ctypes.sizeof(ctypes.c_ulong) * 8
MISSING_CPU = 4000  # no test host has this CPU

CHILD_PRELUDE = """
import json, os, sys
from ansible_collections.inferops.numa.plugins.module_utils.numa import kernel

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


def run_child(body, prelude=CHILD_PRELUDE):
    """Run ``body`` in a fresh Python; return the JSON it prints on its last line."""
    env = dict(os.environ, PYTHONPATH=BUILD)
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


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


def test_policy_modes_round_trip_through_the_kernel():
    cases = [["bind", [0]], ["preferred", [0]], ["interleave", [0]], ["local", []], ["default", []]]
    if kernel_at_least((5, 15)):
        cases.append(["preferred-many", [0]])
    if kernel_at_least((6, 9)):
        cases.append(["weighted-interleave", [0]])
    result = run_child("""
        got = []
        for policy, nodes in %r:
            kernel.set_mempolicy(policy, nodes)
            got.append(list(kernel.get_mempolicy()))
        print(json.dumps(got))
        """ % (cases,))
    assert result == cases


def test_get_mempolicy_strips_mode_flags():
    # a parent (numactl, systemd) may have set the policy with MPOL_F_STATIC_NODES
    result = run_child("""
        import ctypes
        mask, maxnode = kernel.nodemask([0])
        mode = kernel.MPOL_BIND | 1 << 15
        assert kernel._syscall("set_mempolicy", ctypes.c_long(mode), mask, ctypes.c_ulong(maxnode)) == 0
        print(json.dumps(kernel.get_mempolicy()))
        """)
    assert result == ["bind", [0]]


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


def test_bind_shows_in_get_mempolicy_and_numa_maps():
    result = run_child("""
        import ctypes, mmap
        kernel.set_mempolicy("bind", [0])
        policy = kernel.get_mempolicy()
        heap = mmap.mmap(-1, 64 * mmap.PAGESIZE)
        heap.write(b"x" * len(heap))
        addr = ctypes.addressof(ctypes.c_char.from_buffer(heap))
        start = None
        with open("/proc/self/maps") as maps:
            for line in maps:
                low, high = (int(value, 16) for value in line.split()[0].split("-"))
                if low <= addr < high:
                    start = low
        with open("/proc/self/numa_maps") as numa_maps:
            line = [entry for entry in numa_maps if int(entry.split()[0], 16) == start][0]
        print(json.dumps({"policy": policy, "line": line.strip()}))
        """)
    assert result["policy"] == ["bind", [0]]
    fields = dict(item.split("=", 1) for item in result["line"].split()[2:] if "=" in item)
    assert result["line"].split()[1] == "bind:0", result["line"]
    assert int(fields["N0"]) >= 64, result["line"]


def test_bind_to_a_missing_node_names_it_and_changes_nothing():
    result = run_child("""
        before = kernel.get_mempolicy()
        failure = attempt(kernel.set_mempolicy, "bind", [7], allowed=[0])
        print(json.dumps({"failure": failure, "same": kernel.get_mempolicy() == before}))
        """)
    failure = result["failure"]
    assert (failure.get("call"), failure.get("errno")) == ("set_mempolicy", errno.EINVAL), failure
    assert "nodes 7" in failure["message"]
    assert "allowed here: 0" in failure["message"]
    assert "Mems_allowed_list" in failure["message"] and "AllowedMemoryNodes=" in failure["message"]
    assert result["same"]


def test_bind_that_the_kernel_narrows_is_an_error():
    failure = run_child("""print(json.dumps(attempt(kernel.set_mempolicy, "bind", [0, 7])))""")
    assert (failure.get("call"), failure.get("errno")) == ("set_mempolicy", errno.EINVAL), failure
    assert "applied only nodes 0" in failure["message"] and "dropped nodes 7" in failure["message"]


@pytest.mark.parametrize("policy, nodes", [
    ("default", [0]), ("local", [0]), ("bind", []), ("preferred", [7, 8]), ("fastest", [0])])
def test_policy_and_node_count_are_checked_before_the_call(policy, nodes):
    # every case would also fail in the kernel, so a missing check cannot change this process
    with pytest.raises(NumaError) as caught:
        kernel.set_mempolicy(policy, nodes)
    assert not isinstance(caught.value, kernel.KernelCallError)
    assert policy in str(caught.value)


def test_affinity_to_a_missing_cpu_is_a_clear_error():
    result = run_child("""
        before = sorted(os.sched_getaffinity(0))
        missing = attempt(kernel.set_cpu_affinity, [%d], allowed=before)
        unchanged = sorted(os.sched_getaffinity(0)) == before
        narrowed = attempt(kernel.set_cpu_affinity, [0, %d])
        pinned = attempt(kernel.set_cpu_affinity, [0])
        print(json.dumps({"missing": missing, "unchanged": unchanged, "narrowed": narrowed,
                          "pinned": pinned, "now": sorted(os.sched_getaffinity(0))}))
        """ % (MISSING_CPU, MISSING_CPU))
    missing = result["missing"]
    assert (missing.get("call"), missing.get("errno")) == ("sched_setaffinity", errno.EINVAL), missing
    assert "CPUs %d" % MISSING_CPU in missing["message"]
    assert "allowed here:" in missing["message"] and "AllowedCPUs=" in missing["message"]
    assert result["unchanged"]
    assert "applied only CPUs 0" in result["narrowed"]["message"]
    assert "dropped CPUs %d" % MISSING_CPU in result["narrowed"]["message"]
    assert result["pinned"] == {"ok": True} and result["now"] == [0]


@pytest.mark.parametrize("cpus, words", [([], "no CPUs"), ([-1], "CPU id -1"), ([kernel.MAX_CPUS], "beyond")])
def test_affinity_arguments_are_checked_before_the_call(cpus, words):
    before = os.sched_getaffinity(0)
    with pytest.raises(NumaError, match=words) as caught:
        kernel.set_cpu_affinity(cpus)
    assert not isinstance(caught.value, kernel.KernelCallError)
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("call, err, words", [
    ("set_mempolicy", errno.EPERM, ["seccomp", "SystemCallFilter=", "SYS_NICE"]),
    ("set_mempolicy", errno.ENOSYS, ["CONFIG_NUMA", "'default'"]),
    ("move_pages", errno.ENOSYS, ["CONFIG_MIGRATION"]),
])
def test_blocked_syscalls_explain_the_fix(call, err, words):
    failure = run_child("""
        fail_syscall(kernel.syscall_numbers()[%r], %d)
        if %r == "move_pages":
            print(json.dumps(attempt(kernel.query_page_nodes, [id(fail_syscall)])))
        else:
            print(json.dumps(attempt(kernel.set_mempolicy, "bind", [0])))
        """ % (call, err, call), prelude=CHILD_PRELUDE + SECCOMP)
    assert (failure.get("call"), failure.get("errno")) == (call, err), failure
    assert errno.errorcode[err] in failure["message"]
    for word in words:
        assert word in failure["message"]


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
