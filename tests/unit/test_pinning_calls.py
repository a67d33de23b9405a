"""Every pinning call numa-pin exec makes, caught in-process with literal CPU and node lists.

``numa-pin exec`` runs here as a service start runs it (``cli.main``, the same parse and code
path), on fake hosts whose sysfs trees sit under tmp_path and whose plans are a strict subset of
the host: a test that compared with "every CPU" could not tell a pinned start from an unpinned
one. Nothing is really pinned or exec'd: the recorders stand at the bottom of kernel.py
(``os.sched_setaffinity`` and the raw ``set_mempolicy`` / ``get_mempolicy`` syscalls, so the
kernel's mode numbers and node bitmasks are checked too) and at ``os.execvp``, and every test
asserts the literal arguments each received and their order. The recorders act as a kernel would:
what set_mempolicy set, get_mempolicy reads back; a refusal is an errno. A recorder that was never
reached fails its test, and a start whose kernel could not do its part must not reach the exec.

Each test names the call of cli.py (run_exec, _apply, _policy_fallbacks) whose removal it catches.
"""

import errno
import os
import stat

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.cli import numa_pin
from ansible_collections.inferops.numa.plugins.module_utils.numa.system import kernel
from ansible_collections.inferops.numa.plugins.module_utils.numa.read import topology

from tests.fixtures import sysfs

GIB_KB = sysfs.GIB_KB
# The plan's variables: taken out of this process's environment for the test, put back after it.
PLAN_VARIABLES = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES",
                  "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "VLLM_WORKER_MULTIPROC_METHOD", "SGLANG_AUTO_NUMA_BIND",
                  "SGLANG_NUMA_BIND_V2", "TLLM_NUMA_AWARE_WORKER_AFFINITY", "LLAMA_ARG_NUMA")
SERVER = "/srv/bin/llama-server"
# The kernel's numbers (include/uapi/linux/mempolicy.h), written out: not read from kernel.py.
MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_WEIGHTED_INTERLEAVE = 1, 2, 3, 6


def host(nodes, distances, gpus=(), weights=None):
    """``nodes`` nodes of 4 CPUs each (node i: CPUs 4i..4i+3), 16 GiB, 15 free; GPUs as (address, node)."""
    machine = sysfs.Machine()
    for node in range(nodes):
        machine.add_cpus(list(range(4 * node, 4 * node + 4)), package=node, core_base=4 * node)
    for node in range(nodes):
        machine.add_node(node, range(4 * node, 4 * node + 4), 16 * GIB_KB, 15 * GIB_KB, distances=distances[node])
    for address, node in gpus:
        machine.add_pci(address, 0x030200, 0x10de, 0x2330, node, range(4 * node, 4 * node + 4))
    for node, weight in (weights or {}).items():
        machine.put("sys/kernel/mm/mempolicy/weighted_interleave/node%d" % node, str(weight))
    return machine.finish(online=range(4 * nodes), nodes=range(nodes), has_cpu=range(nodes),
                          has_memory=range(nodes), total_kb=16 * nodes * GIB_KB, free_kb=15 * nodes * GIB_KB)


def two_nodes():
    """2 nodes, 8 CPUs (node 0: 0-3, node 1: 4-7), one NVIDIA GPU on node 1."""
    return host(2, [(10, 21), (21, 10)], gpus=[("0000:81:00.0", 1)])


def three_nodes(weights=None):
    """3 nodes, 12 CPUs; nodes 0 and 1 near each other (12), node 2 far (32); a GPU on node 0 and one on node 1."""
    return host(3, [(10, 12, 32), (12, 10, 32), (32, 32, 10)], gpus=[("0000:21:00.0", 0), ("0000:81:00.0", 1)],
                weights=weights)


class FakeKernel:
    """The calls kernel.py makes, recorded in order in ``calls``, with the kernel's state behind them.

    ``refuse``: call name -> errno to fail with (for set_mempolicy, only for the given mode);
    ``drop_cpus`` / ``drop_nodes``: what the kernel silently leaves out of what it applies, as it
    does for CPUs or nodes outside the task's cpuset."""

    def __init__(self, cpus, refuse=None, refuse_mode=None, drop_cpus=(), drop_nodes=()):
        self.calls = []
        self.affinity = set(cpus)
        self.mode, self.nodes = 0, []
        self.refuse = refuse or {}
        self.refuse_mode = refuse_mode
        self.drop_cpus, self.drop_nodes = set(drop_cpus), set(drop_nodes)

    def sched_setaffinity(self, pid, cpus):
        self.calls.append(("sched_setaffinity", pid, sorted(cpus)))
        if "sched_setaffinity" in self.refuse:
            raise OSError(self.refuse["sched_setaffinity"], os.strerror(self.refuse["sched_setaffinity"]))
        self.affinity = set(cpus) - self.drop_cpus

    def sched_getaffinity(self, pid):
        return set(self.affinity)

    def syscall(self, call, *args):
        if call == "set_mempolicy":
            mode, mask, maxnode = args
            words = list(mask)
            word_bits = 8 * _ulong_size()
            nodes = [index * word_bits + bit for index, word in enumerate(words) for bit in range(word_bits)
                     if word >> bit & 1]
            self.calls.append(("set_mempolicy", mode.value, nodes, words, maxnode.value))
            if "set_mempolicy" in self.refuse and self.refuse_mode in (None, mode.value):
                return self.refuse["set_mempolicy"]
            self.mode, self.nodes = mode.value, [node for node in nodes if node not in self.drop_nodes]
            return 0
        if call == "get_mempolicy":
            mode, mask = args[0], args[1]
            self.calls.append(("get_mempolicy",))
            mode._obj.value = self.mode
            word_bits = 8 * _ulong_size()
            for index in range(len(mask)):
                mask[index] = 0
            for node in self.nodes:
                mask[node // word_bits] |= 1 << (node % word_bits)
            return 0
        raise AssertionError("numa-pin exec made an unexpected syscall: %s" % call)


def _ulong_size():
    import ctypes

    return ctypes.sizeof(ctypes.c_ulong)


@pytest.fixture
def environ():
    """The plan's variables out of the environment during the test; the environment as it was after it."""
    before = dict(os.environ)
    for name in PLAN_VARIABLES:
        os.environ.pop(name, None)
    yield os.environ
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture
def start(tmp_path, monkeypatch, environ, capsys):
    """start(machine, own args, server argv, **fake kernel options) -> (exit code, calls, stderr):
    numa-pin exec on ``machine`` with every pinning call and the exec recorded in one list."""
    def run(machine, own, server_argv=(SERVER,), **options):
        root = machine.write(str(tmp_path / "host"))
        real_read = topology.read
        online = list(range(len(machine.cpu_ids)))
        fake = FakeKernel(online, **options)

        def read_fake_host(requested_root="/", plan_only=False, cpu_kinds=None):
            assert requested_root == "/", "exec plans this host, not %r" % requested_root
            return real_read(root, plan_only, cpu_kinds)

        def execvp(file, argv):
            fake.calls.append(("execvp", file, list(argv), {name: os.environ[name] for name in PLAN_VARIABLES
                                                            if name in os.environ}))

        monkeypatch.setattr(topology, "read", read_fake_host)
        monkeypatch.setattr(kernel, "_syscall", fake.syscall)
        monkeypatch.setattr(os, "sched_setaffinity", fake.sched_setaffinity)
        monkeypatch.setattr(os, "sched_getaffinity", fake.sched_getaffinity)
        monkeypatch.setattr(os, "execvp", execvp)
        code = numa_pin.main(["exec"] + list(own) + ["--"] + list(server_argv))
        return code, fake.calls, capsys.readouterr().err
    return run


def execs(calls):
    return [call for call in calls if call[0] == "execvp"]


# --- affinity and memory policy: literal lists on a plan that is a strict subset ------------------

def test_node_1_of_two_pins_cpus_4_to_7_and_binds_memory_to_node_1(start):
    """Catches: kernel.set_cpu_affinity (_apply), kernel.set_mempolicy (_apply), os.environ.update and the
    token substitution (run_exec), and the order: both bindings before the exec (they survive execve)."""
    code, calls, err = start(two_nodes(), ["--node", "1", "--gpus", "none"],
                             [SERVER, "-t", "{threads}", "--cpus", "{cpulist}", "--node", "{node}"])
    assert code == 0, err
    assert calls == [
        ("sched_setaffinity", 0, [4, 5, 6, 7]),
        # MPOL_BIND, node 1: bit 1 of one word; maxnode is the word's bits plus one (kernel.nodemask).
        ("set_mempolicy", MPOL_BIND, [1], [0b10], 8 * _ulong_size() + 1),
        ("get_mempolicy",),
        ("execvp", SERVER, [SERVER, "-t", "4", "--cpus", "4-7", "--node", "1"], {"OMP_NUM_THREADS": "4"}),
    ]
    assert err == "numa-pin: instance 0/1: bind memory on node(s) 1, cpus 4-7 (4 threads); exec %s\n" % SERVER


def test_the_gpu_local_plan_pins_to_the_gpus_node_and_shows_only_that_gpu(start):
    """Catches: kernel.set_cpu_affinity, kernel.set_mempolicy, os.environ.update (CUDA_VISIBLE_DEVICES)."""
    code, calls, err = start(two_nodes(), ["--gpus", "1"])
    assert code == 0, err
    assert calls == [
        ("sched_setaffinity", 0, [4, 5, 6, 7]),
        ("set_mempolicy", MPOL_BIND, [1], [0b10], 8 * _ulong_size() + 1),
        ("get_mempolicy",),
        ("execvp", SERVER, [SERVER], {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0",
                                      "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
    ]


def test_a_model_too_big_for_one_node_interleaves_over_the_two_near_nodes_of_three(start):
    """20 GiB on 15 GiB-free nodes: MPOL_INTERLEAVE over nodes 0 and 1 (not the far node 2), CPUs 0-7 of 0-11.
    Catches: kernel.set_cpu_affinity, kernel.set_mempolicy (and a policy or node list passed wrong)."""
    code, calls, err = start(three_nodes(), ["--node", "0", "--gpus", "none", "--model-size", "20G"])
    assert code == 0, err
    assert calls == [
        ("sched_setaffinity", 0, [0, 1, 2, 3, 4, 5, 6, 7]),
        ("set_mempolicy", MPOL_INTERLEAVE, [0, 1], [0b11], 8 * _ulong_size() + 1),
        ("get_mempolicy",),
        ("execvp", SERVER, [SERVER], {"OMP_NUM_THREADS": "8"}),
    ]
    assert "interleave memory on node(s) 0-1, cpus 0-7 (8 threads)" in err


def test_unequal_interleave_weights_set_the_weighted_interleave_mode(start):
    """Catches: kernel.set_mempolicy with the plan's policy (MPOL_WEIGHTED_INTERLEAVE, Linux 6.9) and nodes."""
    code, calls, err = start(three_nodes(weights={0: 2, 1: 1, 2: 1}),
                             ["--node", "0", "--gpus", "none", "--model-size", "20G"])
    assert code == 0, err
    assert calls[:2] == [
        ("sched_setaffinity", 0, [0, 1, 2, 3, 4, 5, 6, 7]),
        ("set_mempolicy", MPOL_WEIGHTED_INTERLEAVE, [0, 1], [0b11], 8 * _ulong_size() + 1),
    ]
    assert [call[0] for call in calls[2:]] == ["get_mempolicy", "execvp"]


def test_policy_preferred_on_node_1_sets_mpol_preferred_with_node_1(start):
    """Catches: kernel.set_mempolicy (MPOL_PREFERRED, exactly one node) and kernel.set_cpu_affinity."""
    code, calls, err = start(three_nodes(), ["--node", "1", "--gpus", "none", "--policy", "preferred"])
    assert code == 0, err
    assert calls[:2] == [
        ("sched_setaffinity", 0, [4, 5, 6, 7]),
        ("set_mempolicy", MPOL_PREFERRED, [1], [0b10], 8 * _ulong_size() + 1),
    ]
    assert [call[0] for call in calls[2:]] == ["get_mempolicy", "execvp"]


def test_a_spanning_vllm_instance_hands_each_worker_its_gpus_cpus_and_node(start, tmp_path, monkeypatch):
    """Two GPUs on nodes 0 and 1 of three: the process gets CPUs 0-7 and memory interleaved over 0-1, and
    vLLM binds worker i with the gpu_map's CPUs and node. Catches: kernel.set_cpu_affinity,
    kernel.set_mempolicy, the engine's binding arguments (_server_command) and variables (os.environ.update)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    numactl = tools / "numactl"
    numactl.write_text("#!/bin/sh\n")
    numactl.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", str(tools))
    code, calls, err = start(three_nodes(), ["--gpus", "2", "--engine", "vllm"], [SERVER, "serve", "/m"])
    assert code == 0, err
    assert calls == [
        ("sched_setaffinity", 0, [0, 1, 2, 3, 4, 5, 6, 7]),
        ("set_mempolicy", MPOL_INTERLEAVE, [0, 1], [0b11], 8 * _ulong_size() + 1),
        ("get_mempolicy",),
        ("execvp", SERVER, [SERVER, "serve", "/m", "--numa-bind", "--numa-bind-nodes", "0", "1",
                            "--numa-bind-cpus", "0-3", "4-7"],
         {"OMP_NUM_THREADS": "8", "CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
          "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}),
    ]


# --- a kernel that could not do its part ----------------------------------------------------------

def test_best_effort_falls_back_to_preferred_on_the_anchor_node_when_bind_is_refused(start):
    """Catches: the fallback step of _policy_fallbacks (and its kernel.set_mempolicy call)."""
    code, calls, err = start(two_nodes(), ["--node", "1", "--gpus", "none", "--best-effort"],
                             refuse={"set_mempolicy": errno.EPERM}, refuse_mode=MPOL_BIND)
    assert code == 0, err
    assert calls == [
        ("sched_setaffinity", 0, [4, 5, 6, 7]),
        ("set_mempolicy", MPOL_BIND, [1], [0b10], 8 * _ulong_size() + 1),
        ("set_mempolicy", MPOL_PREFERRED, [1], [0b10], 8 * _ulong_size() + 1),
        ("get_mempolicy",),
        ("execvp", SERVER, [SERVER], {"OMP_NUM_THREADS": "4"}),
    ]
    assert "best-effort: bind refused (set_mempolicy(bind, nodes 1) failed with EPERM" in err
    assert "best-effort: memory policy degraded to preferred on node(s) 1" in err


@pytest.mark.parametrize("fault, first_calls, words", [
    ({"refuse": {"sched_setaffinity": errno.EPERM}}, [("sched_setaffinity", 0, [4, 5, 6, 7])],
     "sched_setaffinity(CPUs 4-7) failed with EPERM"),
    ({"drop_cpus": [6, 7]}, [("sched_setaffinity", 0, [4, 5, 6, 7])],
     "sched_setaffinity(CPUs 4-7) applied only CPUs 4-5"),
    ({"refuse": {"set_mempolicy": errno.EINVAL}},
     [("sched_setaffinity", 0, [4, 5, 6, 7]), ("set_mempolicy", MPOL_BIND, [1], [0b10], 8 * 8 + 1)],
     "set_mempolicy(bind, nodes 1) failed with EINVAL"),
    ({"drop_nodes": [1]},
     [("sched_setaffinity", 0, [4, 5, 6, 7]), ("set_mempolicy", MPOL_BIND, [1], [0b10], 8 * 8 + 1),
      ("get_mempolicy",)],
     "set_mempolicy(bind, nodes 1) applied only nodes "),
], ids=["affinity refused", "cpus dropped", "bind refused", "node dropped"])
def test_a_strict_start_whose_kernel_did_less_never_reaches_the_server(start, fault, first_calls, words):
    """Catches: the call whose refusal is tested (no call, no refusal: the start would exec unpinned)."""
    assert _ulong_size() == 8  # the node words above are 64-bit (every platform kernel.py supports)
    code, calls, err = start(two_nodes(), ["--node", "1", "--gpus", "none"], **fault)
    assert code == numa_pin.EXIT_KERNEL_REFUSED, err
    assert calls == first_calls and execs(calls) == []
    assert err.startswith("numa-pin: refusing to start the server unpinned: ") and words in err
    assert err.count("\n") == 1


def test_the_a_b_gates_unbound_baseline_keeps_the_plans_threads_and_sets_no_placement(start, environ):
    """Catches: _apply_unless_baseline skipping too much (the plan's threads and port) or too little (any
    pinning call), and the variable passed on to the server."""
    environ["INFEROPS_NUMA_AB_BASELINE"] = "unbound"
    code, calls, err = start(two_nodes(), ["--node", "1", "--gpus", "none"], [SERVER, "-t", "{threads}"])
    assert code == 0, err
    assert calls == [("execvp", SERVER, [SERVER, "-t", "4"], {"OMP_NUM_THREADS": "4"})]
    assert "A/B gate baseline: affinity and memory policy NOT set" in err
    assert "INFEROPS_NUMA_AB_BASELINE" not in environ


def test_any_other_value_of_the_baseline_variable_pins_as_always(start, environ):
    environ["INFEROPS_NUMA_AB_BASELINE"] = "1"
    code, calls, err = start(two_nodes(), ["--node", "1", "--gpus", "none"])
    assert code == 0, err
    assert calls[0] == ("sched_setaffinity", 0, [4, 5, 6, 7])


# --- a container runtime's run command: the plan's flags after `run` -------------------------------

PODMAN = ["/usr/bin/podman", "run", "--rm", "--name", "llama-{instance}", "--network", "host", "img:1",
          "--threads", "{threads}"]


def test_a_podman_instance_is_pinned_itself_and_gets_the_plans_cpuset_after_run(start):
    """numa-pin pins the podman it execs (the container inherits it) and puts the cpuset, the plan's environment
    and the GPU by its CDI name after `run`, the GPU renumbered as the container sees it. Catches: the runtime's
    flags left out (_server_command's container), put after the image, or the host's GPU index kept."""
    code, calls, err = start(two_nodes(), ["--gpus", "1", "--container-runtime", "podman", "--instance", "0"],
                             PODMAN)
    assert code == 0, err
    assert calls[:2] == [("sched_setaffinity", 0, [4, 5, 6, 7]),
                         ("set_mempolicy", MPOL_BIND, [1], [0b10], 8 * _ulong_size() + 1)]
    assert execs(calls) == [("execvp", "/usr/bin/podman", [
        "/usr/bin/podman", "run", "--cpuset-cpus", "4-7", "--cpuset-mems", "1",
        "--env", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "--env", "CUDA_VISIBLE_DEVICES=0", "--env", "OMP_NUM_THREADS=4",
        "--device", "nvidia.com/gpu=0",
        "--rm", "--name", "llama-0", "--network", "host", "img:1", "--threads", "4"],
        {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})]


def test_the_a_b_baseline_of_a_container_has_no_cpuset(start, environ):
    """Catches: the unbound baseline measured inside a cgroup cpuset (bound after all)."""
    environ["INFEROPS_NUMA_AB_BASELINE"] = "unbound"
    code, calls, err = start(two_nodes(), ["--node", "1", "--gpus", "none", "--container-runtime", "podman"], PODMAN)
    assert code == 0, err
    assert [call[0] for call in calls] == ["execvp"]
    assert "--cpuset-cpus" not in calls[0][2] and "--cpuset-mems" not in calls[0][2]
    assert calls[0][2][2:4] == ["--env", "OMP_NUM_THREADS=4"]


def test_docker_cannot_interleave_and_numa_pin_refuses_to_start_it(start):
    """20 GiB over 15 GiB-free nodes interleaves, which docker's cgroup cpuset cannot do: refused before the exec,
    naming the fix. Catches: a docker instance started with its memory merely confined, not interleaved."""
    docker = ["/usr/bin/docker", "run", "--rm", "img:1"]
    code, calls, err = start(three_nodes(), ["--node", "0", "--gpus", "none", "--model-size", "20G",
                                             "--container-runtime", "docker"], docker)
    assert code == 2
    assert execs(calls) == []
    assert "container runtime docker applies only a cgroup cpuset" in err and "runtime podman" in err
    assert err.count("\n") == 1
