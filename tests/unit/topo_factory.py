"""Build topology dicts in the numa_facts contract's shape (docs/facts.md) for tests.

``make_topology`` fills every derived field (node cpulists, per-node distances and
GPUs, packages, cuda indexes, totals) from a few node/GPU descriptions, so tests
state only what matters to them. The presets model machines the planner must get
right.
"""
from typing import Any, Dict, List, Optional, Sequence

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.cpulist import format_cpulist
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.gpu_vendors import index_facts

GIB = 1024 ** 3
GIB_KB = 1024 * 1024


def make_node(node_id: int, cpus: Sequence[int] = (), total_gib: float = 64, available_gib: Optional[float] = None,
              packages: Optional[Sequence[int]] = None, has_memory: bool = True,
              memory_nodes: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """One node; available defaults to 90% of total. Memory sizes in GiB, stored in kB. ``memory_nodes``:
    the nodes serving a node without memory of its own, as the reader derives them (HMAT or SLIT)."""
    total_kb = int(total_gib * GIB_KB) if has_memory else 0
    available_kb = int((available_gib if available_gib is not None else total_gib * 0.9) * GIB_KB)
    available_kb = available_kb if has_memory else 0
    file_kb = available_kb // 4
    return {
        "id": node_id,
        "cpus": sorted(cpus),
        "has_cpus": bool(cpus),
        "has_memory": has_memory,
        "memory_total_kb": total_kb,
        # MemFree + FilePages - Shmem == available, as the contract defines it.
        "memory_free_kb": available_kb - file_kb,
        "memory_file_kb": file_kb,
        "memory_shmem_kb": 0,
        "memory_available_kb": available_kb,
        "hugepages": {"2048kB": {"total": 0, "free": 0}},
        "packages": sorted(packages if packages is not None else ([0] if cpus else [])),
        "memory_nodes": list(memory_nodes) if memory_nodes is not None else ([node_id] if has_memory else []),
        "memory_from": "local" if has_memory else ("hmat" if memory_nodes else None),
    }


def make_gpu(address: str, numa_node: Optional[int], vendor: str = "nvidia",
             cuda_index: Optional[int] = None, klass: str = "0x030200",
             memory_node: Optional[int] = None, pci_path: Sequence[str] = ()) -> Dict[str, Any]:
    vendor_ids = {"nvidia": "0x10de", "amd": "0x1002", "intel": "0x8086", "other": "0x1234"}
    return {"address": address, "vendor_id": vendor_ids.get(vendor, "0xffff"), "vendor": vendor,
            "device_id": "0x0001", "class": klass, "numa_node": numa_node,
            "locality": None if numa_node is None else "numa_node", "local_cpulist": "", "pci_path": list(pci_path),
            "cuda_index": cuda_index, "memory_node": memory_node}


def make_nic(address: str, numa_node: Optional[int], name: str, rdma_name: Optional[str] = None,
             pci_path: Sequence[str] = (), port_states: Sequence[str] = ("ACTIVE",)) -> Dict[str, Any]:
    """A NIC; with an RDMA device, one InfiniBand port per state of ``port_states``, numbered from 1."""
    ports = [{"port": number, "state": state, "link_layer": "InfiniBand"}
             for number, state in enumerate(port_states, 1)] if rdma_name else []
    return {"address": address, "vendor_id": "0x15b3", "vendor": "other", "device_id": "0x101d",
            "class": "0x020700" if rdma_name else "0x020000", "numa_node": numa_node,
            "locality": None if numa_node is None else "numa_node", "local_cpulist": "", "pci_path": list(pci_path),
            "name": name, "rdma_name": rdma_name, "rdma_ports": ports}


def make_topology(nodes: List[Dict[str, Any]], distances: Optional[List[List[int]]] = None,
                  gpus: Sequence[Dict[str, Any]] = (), nics: Sequence[Dict[str, Any]] = (),
                  allowed: str = "", mems_allowed: str = "",
                  siblings: Optional[List[List[int]]] = None,
                  weighted_interleave: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """A full contract dict. distances is a matrix in node order (default 10 local, 21 remote);
    siblings the SMT groups (default: every CPU its own core)."""
    nodes = sorted(nodes, key=lambda node: node["id"])
    ids = [node["id"] for node in nodes]
    if distances is None:
        distances = [[10 if a == b else 21 for b in ids] for a in ids]
    online = sorted(cpu for node in nodes for cpu in node["cpus"])
    siblings = siblings if siblings is not None else [[cpu] for cpu in online]
    gpus = [dict(gpu) for gpu in sorted(gpus, key=lambda gpu: gpu["address"])]
    _fill_cuda_indexes(gpus)
    for row, node in zip(distances, nodes):
        node["cpulist"] = format_cpulist(node["cpus"])
        node["distances"] = {str(other): distance for other, distance in zip(ids, row)}
        node["gpus"] = [gpu["address"] for gpu in gpus if gpu["numa_node"] == node["id"]]
        node["gpu_memory_of"] = [gpu["address"] for gpu in gpus if gpu.get("memory_node") == node["id"]]
    return {
        "schema_version": 1,
        "root": "/",
        "node_count": len(nodes),
        "warnings": [],
        "nodes": nodes,
        "distances": distances,
        "cpus": {
            "online": format_cpulist(online), "offline": "", "isolated": "", "nohz_full": "",
            "allowed": allowed, "mems_allowed": mems_allowed,
            "threads_per_core": max([len(group) for group in siblings] or [1]),
            "siblings": sorted(sorted(group) for group in siblings),
            "packages": _packages(nodes),
            "l3_groups": [],
            "caches": {"l1d_kb": None, "l2_kb": None, "l3_kb": None},
        },
        "gpus": gpus,
        "nics": [dict(nic) for nic in nics],
        "nvme": [],
        "memory": {"total_kb": sum(node["memory_total_kb"] for node in nodes),
                   "free_kb": sum(node["memory_free_kb"] for node in nodes),
                   "available_kb": sum(node["memory_available_kb"] for node in nodes)},
        "kernel": {"numa_balancing": 1, "zone_reclaim_mode": 0, "transparent_hugepage": "madvise",
                   "weighted_interleave": weighted_interleave},
    }


def _fill_cuda_indexes(gpus: List[Dict[str, Any]]) -> None:
    """The reader's rule (gpu_vendors.index_facts); an index a test gave stays."""
    for gpu in gpus:
        if gpu["cuda_index"] is None:
            gpu.update(index_facts(gpu, gpus))


def _packages(nodes: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    packages = {}
    for node in nodes:
        for package in node["packages"]:
            entry = packages.setdefault(package, {"id": package, "cpus": [], "nodes": []})
            entry["cpus"].extend(node["cpus"])
            entry["nodes"].append(node["id"])
    return [{"id": entry["id"], "cpulist": format_cpulist(entry["cpus"]), "nodes": entry["nodes"]}
            for _, entry in sorted(packages.items())]


def smt_pairs(cores: int) -> List[List[int]]:
    """Intel-style numbering: core c has threads c and c + cores."""
    return [[core, core + cores] for core in range(cores)]


# ---------------------------------------------------------------- presets ---

def dual_socket_gpu(available_gib: Sequence[float] = (230, 230), **overrides: Any) -> Dict[str, Any]:
    """2 sockets x 40 cores, SMT2 (cpus 0-159), 256 GiB per node, two NVIDIA GPUs on
    node 1. (The board's BMC display never reaches the planner: the reader drops it.)"""
    nodes = [
        make_node(0, list(range(0, 40)) + list(range(80, 120)), 256, available_gib[0], [0]),
        make_node(1, list(range(40, 80)) + list(range(120, 160)), 256, available_gib[1], [1]),
    ]
    gpus = [make_gpu("0000:81:00.0", 1), make_gpu("0000:c1:00.0", 1)]
    return make_topology(nodes, gpus=gpus, siblings=smt_pairs(80), **overrides)


def amd_nps4(gpus: Sequence[Dict[str, Any]] = (), available_gib: float = 60, **overrides: Any) -> Dict[str, Any]:
    """2 sockets in NPS4 mode: 8 nodes of 16 cores (SMT2, cpus 0-255), 64 GiB each;
    distance 10 local, 12 same socket, 32 across sockets."""
    nodes = []
    for node in range(8):
        cpus = list(range(node * 16, node * 16 + 16)) + list(range(128 + node * 16, 128 + node * 16 + 16))
        nodes.append(make_node(node, cpus, 64, available_gib, [node // 4]))
    distances = [[10 if a == b else (12 if a // 4 == b // 4 else 32) for b in range(8)] for a in range(8)]
    return make_topology(nodes, distances=distances, gpus=gpus, siblings=smt_pairs(128), **overrides)


def grace_like(**overrides: Any) -> Dict[str, Any]:
    """One Grace CPU node (72 cores, 480 GiB) plus CPU-less nodes 1-8 of GPU memory;
    the GPU reports numa_node 1 (a CPU-less node), as on GH200."""
    nodes = [make_node(0, range(72), 480, 400, [0])]
    nodes.append(make_node(1, (), 96, 95))
    nodes.extend(make_node(node, (), 0.5, 0.5) for node in range(2, 9))
    ids = range(9)
    distances = [[10 if a == b else (40 if 0 in (a, b) else 80) for b in ids] for a in ids]
    return make_topology(nodes, distances=distances, gpus=[make_gpu("0009:01:00.0", 1)], **overrides)


def cxl_memory(**overrides: Any) -> Dict[str, Any]:
    """2 CPU nodes (16 cpus, 64 GiB each) and node 2: 512 GiB of CXL memory, no CPUs,
    distance 14 from node 0 (nearer than node 1)."""
    nodes = [make_node(0, range(0, 16), 64, 60, [0]), make_node(1, range(16, 32), 64, 60, [1]),
             make_node(2, (), 512, 500)]
    distances = [[10, 21, 14], [21, 10, 24], [14, 24, 10]]
    return make_topology(nodes, distances=distances, **overrides)


def dgx_like(**overrides: Any) -> Dict[str, Any]:
    """2 sockets x 56 cores SMT2 (cpus 0-223), 1 TiB per node, 8 NVIDIA GPUs whose PCI addresses
    alternate between the sockets (as on many 8-GPU boards), and one InfiniBand NIC per GPU pair."""
    nodes = [make_node(0, list(range(0, 56)) + list(range(112, 168)), 1024, 900, [0]),
             make_node(1, list(range(56, 112)) + list(range(168, 224)), 1024, 900, [1])]
    buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
    gpus = [make_gpu("0000:%s:00.0" % bus, index % 2) for index, bus in enumerate(buses)]
    nics = [make_nic("0000:%02x:00.0" % (0x17 + 0x10 * index), index % 2, "ibp%d" % index, "mlx5_%d" % index)
            for index in range(4)]
    return make_topology(nodes, gpus=gpus, nics=nics, siblings=smt_pairs(112), **overrides)


def dgx_switches(**overrides: Any) -> Dict[str, Any]:
    """dgx_like's sockets with its GPUs and NICs behind PCIe switches, as on an 8-GPU board: each socket's host
    bridge has two root ports, each with a switch holding two GPUs and one RDMA NIC (ibp<s><k>, mlx5_<2s+k>); socket
    1's second switch also holds an Ethernet NIC without RDMA."""
    topology = dgx_like(**overrides)
    gpus, nics = [], []
    for socket in range(2):
        for switch in range(2):
            bus = 0x10 + 0x80 * socket + 0x20 * switch  # the switch's upstream port's bus; its downstream ports' next
            bridges = ["pci0000:%02x" % (0x10 + 0x80 * socket), "0000:%02x:%02x.0" % (0x10 + 0x80 * socket, switch + 1),
                       "0000:%02x:00.0" % bus]
            for port in range(3):  # two GPUs, then the NIC, each below its own downstream port
                below = bridges + ["0000:%02x:%02x.0" % (bus + 1, port)]
                if port < 2:
                    gpus.append(make_gpu("0000:%02x:00.0" % (bus + 2 + port), socket, pci_path=below))
                else:
                    nics.append(make_nic("0000:%02x:00.0" % (bus + 4), socket, "ibp%d%d" % (socket, switch),
                                         "mlx5_%d" % (2 * socket + switch), below))
    nics.append(make_nic("0000:b5:00.0", 1, "eth0", None, ["pci0000:90", "0000:90:02.0", "0000:b0:00.0",
                                                           "0000:b1:03.0"]))
    topology["gpus"], topology["nics"] = gpus, nics
    for node in topology["nodes"]:
        node["gpus"] = [gpu["address"] for gpu in gpus if gpu["numa_node"] == node["id"]]
    _fill_cuda_indexes(topology["gpus"])
    return topology


def nps4_eight_gpus(**overrides: Any) -> Dict[str, Any]:
    """amd_nps4 with one GPU on each of its 8 nodes (an 8-GPU EPYC board in NPS4 mode)."""
    return amd_nps4(gpus=[make_gpu("0000:%02x:00.0" % (0x10 + 0x20 * node), node) for node in range(8)], **overrides)


def gb200_like(**overrides: Any) -> Dict[str, Any]:
    """Two Grace CPU nodes (72 cores, 480 GiB each), each with two GPUs whose HBM the driver onlines
    as CPU-less nodes 2-5 (numa_status), farther than the other Grace."""
    nodes = [make_node(0, range(72), 480, 400, [0]), make_node(1, range(72, 144), 480, 400, [1])]
    nodes.extend(make_node(node, (), 186, 180, [], has_memory=True) for node in range(2, 6))
    ids = range(6)
    distances = [[10 if a == b else 40 if {a, b} == {0, 1} else 80 for b in ids] for a in ids]
    gpus = [make_gpu("%04x:01:00.0" % (index + 8), index // 2, memory_node=index + 2) for index in range(4)]
    return make_topology(nodes, distances=distances, gpus=gpus, **overrides)


def memoryless_cpu_nodes(**overrides: Any) -> Dict[str, Any]:
    """CPU nodes 0-1 without memory, served (HMAT) by CPU-less memory nodes 2-3; one GPU on each CPU node."""
    nodes = [make_node(0, range(0, 16), has_memory=False, packages=[0], memory_nodes=[2]),
             make_node(1, range(16, 32), has_memory=False, packages=[1], memory_nodes=[3]),
             make_node(2, (), 128, 120, []), make_node(3, (), 128, 120, [])]
    distances = [[10, 21, 12, 24], [21, 10, 24, 12], [12, 24, 10, 21], [24, 12, 21, 10]]
    gpus = [make_gpu("0000:41:00.0", 0), make_gpu("0000:c1:00.0", 1)]
    return make_topology(nodes, distances=distances, gpus=gpus, **overrides)


def one_node_vm(**overrides: Any) -> Dict[str, Any]:
    """A 4-vCPU, 8 GiB VM without NUMA: one node 0."""
    return make_topology([make_node(0, range(4), 8, 6, [0])], **overrides)


def cgroup_restricted() -> Dict[str, Any]:
    """dual_socket_gpu inside a cpuset: cpus 40-59,120-139 and memory of node 1 only."""
    return dual_socket_gpu(allowed="40-59,120-139", mems_allowed="1")
