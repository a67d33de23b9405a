"""The kernel calls for real, each in a child interpreter of its own (a policy or a seccomp filter set there dies with
it)."""

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.unit.test_kernel import BUILD, CHILD_PRELUDE, MISSING_CPU, SECCOMP, kernel_at_least


def run_child(body, prelude=CHILD_PRELUDE):
    """Run ``body`` in a fresh Python; return the JSON it prints on its last line."""
    env = dict(os.environ, PYTHONPATH=BUILD)
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


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
