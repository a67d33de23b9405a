#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_facts
short_description: Gather NUMA, CPU and GPU topology facts
version_added: "0.1.0"
description:
  - Reads the host's NUMA nodes, CPUs (online, isolated, SMT siblings, packages, L3 groups), memory per node,
    SLIT distances, GPUs/NICs/NVMe devices with their NUMA node, the CPUs and memory nodes this process may use
    (cpuset/cgroup), and the kernel's NUMA knobs from sysfs and procfs.
  - Returns them as C(ansible_facts.numa). Never changes the system.
  - Can run as a facts module during fact gathering, for example
    C(ANSIBLE_FACTS_MODULES=setup,inferops.numa.numa_facts) or C(facts_modules = setup, inferops.numa.numa_facts) in
    C(ansible.cfg).
  - Files that are missing, empty or garbled are reported in C(warnings) and never fail the module.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
  - inferops.numa.host_root.read_only
  - ansible.builtin.action_common_attributes.facts
attributes:
  facts:
    support: full
notes:
  - GPUs are found by PCI class (VGA, 3D, display, processing accelerator), not through C(/sys/class/drm), so NVIDIA
    cards without nvidia-drm are seen. BMC video (ASPEED, Matrox) is not a GPU.
  - A kernel without C(/sys/devices/system/node) is reported as one node 0 holding every online CPU.
"""

EXAMPLES = r"""
- name: Gather NUMA facts
  inferops.numa.numa_facts:

- name: Show the CPUs of node 0
  ansible.builtin.debug:
    msg: "{{ ansible_facts.numa.nodes[0].cpulist }}"

- name: Read a captured machine instead of this one
  inferops.numa.numa_facts:
    root: /srv/dumps/dual-xeon
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: dict
  contains:
    numa:
      description:
        - The topology. Shape documented in the collection's C(docs/facts.md) (schema_version 1).
      returned: always
      type: dict
      contains:
        schema_version:
          description: Version of this structure.
          type: int
          sample: 1
        root:
          description: The O(root) the facts were read under.
          type: str
          sample: /
        node_count:
          description: Number of NUMA nodes, memory-only ones included.
          type: int
          sample: 2
        nodes:
          description:
            - One entry per node, sorted by id, with cpus, cpulist, has_cpus, has_memory, memory_*_kb,
              hugepages, distances, packages and gpus.
            - C(kind) (C(cpus_and_memory), C(cpus_only), C(memory_only), C(empty)), C(memory_class) (C(local),
              C(gpu) for a GPU's own memory, C(near) for a memory-only node HMAT rates at the host's DRAM speed,
              C(far) for other memory-only nodes such as CXL expanders or PMEM, null without memory),
              C(memory_class_from) (C(cpus), C(gpu), C(hmat), C(no_cpus) or null) and C(home_package) (the package
              of its CPUs, or of the CPU nodes nearest to a memory-only node; null when that is not one package).
          type: list
          elements: dict
          sample: [{"id": 1, "cpus": [40, 41, 120, 121], "cpulist": "40-41,120-121", "has_cpus": true,
                    "has_memory": true, "memory_total_kb": 268435456, "memory_free_kb": 188743680,
                    "memory_file_kb": 10485760, "memory_shmem_kb": 0, "memory_available_kb": 199229440,
                    "hugepages": {"2048kB": {"total": 0, "free": 0}}, "distances": {"0": 21, "1": 10},
                    "packages": [1], "gpus": ["0000:81:00.0"]}]
        distances:
          description: SLIT matrix in C(nodes) order.
          type: list
          elements: list
          sample: [[10, 21], [21, 10]]
        cpus:
          description: online, offline, isolated, nohz_full, allowed and mems_allowed as list strings,
            threads_per_core, siblings, packages, l3_groups, caches, and kinds (CPUs by capacity and frequency,
            fastest first; empty when they are alike; docs/facts.md).
          type: dict
          sample: {"online": "0-159", "offline": "", "isolated": "", "nohz_full": "", "allowed": "0-159",
                   "mems_allowed": "0-1", "threads_per_core": 2, "siblings": [[0, 80], [1, 81]],
                   "l3_groups": [{"cpulist": "0-39,80-119", "size_kb": 32768}],
                   "caches": {"l1d_kb": 48, "l2_kb": 2048, "l3_kb": 32768}, "kinds": [],
                   "packages": [{"id": 0, "cpulist": "0-39,80-119", "nodes": [0]}]}
        gpus:
          description: GPUs with address, vendor_id, vendor, device_id, class, numa_node, local_cpulist, pci_path (host
            bridge, then the bridges below it), cuda_index.
          type: list
          elements: dict
          sample: [{"address": "0000:81:00.0", "vendor_id": "0x10de", "vendor": "nvidia", "device_id": "0x2330",
                    "class": "0x030200", "numa_node": 1, "local_cpulist": "40-79,120-159",
                    "pci_path": ["pci0000:80", "0000:80:01.0"], "cuda_index": 0}]
        nics:
          description: Network adapters with address, vendor_id, vendor, device_id, class, numa_node, local_cpulist,
            pci_path, name, rdma_name and rdma_ports (the RDMA device's ports, each with port, state and link_layer).
          type: list
          elements: dict
          sample: [{"address": "0000:41:00.0", "vendor_id": "0x15b3", "vendor": "other", "device_id": "0x101d",
                    "class": "0x020000", "numa_node": 1, "local_cpulist": "40-79,120-159", "name": "ens1f0"}]
        nvme:
          description: NVMe controllers with address, vendor_id, vendor, device_id, class, numa_node, local_cpulist,
            name.
          type: list
          elements: dict
          sample: [{"address": "0000:01:00.0", "vendor_id": "0x144d", "vendor": "other", "device_id": "0xa80a",
                    "class": "0x010802", "numa_node": 0, "local_cpulist": "0-39,80-119", "name": "nvme0"}]
        memory:
          description: total_kb, free_kb and available_kb from /proc/meminfo.
          type: dict
          sample: {"total_kb": 536870912, "free_kb": 398458880, "available_kb": 398458880}
        shape:
          description: How the sockets are split into nodes (sub-NUMA clustering on Intel, NPS on AMD) - packages,
            cpu_nodes_per_package (null when packages differ), sub_numa (a package with more than one CPU node) and
            the memory_only_nodes.
          type: dict
          sample: {"packages": 2, "cpu_nodes_per_package": 3, "sub_numa": true, "memory_only_nodes": [6]}
        memory_tiers:
          description: The kernel's memory tiers (Linux 6.1+), each with its id (lower is faster) and nodes; empty
            without them.
          type: list
          elements: dict
          sample: [{"id": 4, "nodes": [0, 1]}, {"id": 22, "nodes": [2]}]
        kernel:
          description:
            - numa_balancing, zone_reclaim_mode, transparent_hugepage, weighted_interleave (null when absent).
            - features, what the kernel offers memory placement - release, weighted_interleave (Linux 6.9+),
              weighted_interleave_auto (the weights computed from HMAT; null when the kernel has no such switch),
              memory_tiering, demotion_enabled, balancing_tiering_mode (balancing mode 2, Linux 5.18+).
          type: dict
          sample: {"numa_balancing": 1, "zone_reclaim_mode": 0, "transparent_hugepage": "madvise",
                   "weighted_interleave": null,
                   "features": {"release": "6.1.0-41-amd64", "weighted_interleave": false,
                                "weighted_interleave_auto": null, "memory_tiering": true, "demotion_enabled": false,
                                "balancing_tiering_mode": true}}
        warnings:
          description: What could not be read, one line each.
          type: list
          elements: str
          sample: ["sys/devices/system/cpu/cpu5/online: expected 0 or 1, found 'x'; counted as online"]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=host_root_argument_spec(),
        supports_check_mode=True,
    )
    try:
        facts = read(module.params["root"])
    except NumaError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, ansible_facts={"numa": facts})


if __name__ == "__main__":
    main()
