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
  - ansible.builtin.action_common_attributes.facts
options:
  root:
    description:
      - Filesystem prefix under which C(sys/) and C(proc/) are read, like hwloc's C(HWLOC_FSROOT).
      - Point it at a captured sysfs dump to see what another machine looks like.
    type: path
    default: /
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: [linux]
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
        node_count:
          description: Number of NUMA nodes, memory-only ones included.
          type: int
          sample: 2
        nodes:
          description: One entry per node, sorted by id, with cpus, cpulist, has_cpus, has_memory, memory_*_kb,
            hugepages, distances, packages and gpus.
          type: list
          elements: dict
        distances:
          description: SLIT matrix in C(nodes) order.
          type: list
          elements: list
          sample: [[10, 21], [21, 10]]
        cpus:
          description: online, offline, isolated, nohz_full, allowed and mems_allowed as list strings,
            threads_per_core, siblings, packages, l3_groups, caches.
          type: dict
        gpus:
          description: GPUs with address, vendor_id, vendor, device_id, class, numa_node, local_cpulist, cuda_index.
          type: list
          elements: dict
        nics:
          description: Network adapters with address, class, numa_node, name.
          type: list
          elements: dict
        nvme:
          description: NVMe controllers with address, class, numa_node, name.
          type: list
          elements: dict
        memory:
          description: total_kb, free_kb and available_kb from /proc/meminfo.
          type: dict
        kernel:
          description: numa_balancing, zone_reclaim_mode, transparent_hugepage, weighted_interleave (null when absent).
          type: dict
        warnings:
          description: What could not be read, one line each.
          type: list
          elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.topology import read


def main() -> None:
    module = AnsibleModule(
        argument_spec={"root": {"type": "path", "default": "/"}},
        supports_check_mode=True,
    )
    try:
        facts = read(module.params["root"])
    except NumaError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, ansible_facts={"numa": facts})


if __name__ == "__main__":
    main()
