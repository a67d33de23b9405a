#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_metrics
short_description: A host's NUMA metrics snapshot, and where its services would run
version_added: "1.0.0"
description:
  - Reads what C(numa-pin metrics) exports, as data instead of Prometheus text; changes nothing.
  - Per host C(kernel.numa_balancing), each node's CPUs, GPUs, memory and allocation counters; per instance
    that a deployment recorded (C(<plan_dir>/<service>@<i>.plan.json), written by the inference_service role)
    where its pages are against its plan (anon and file), its remote bytes, whether its threads keep to the plan's
    CPUs, the plan's age and drift below its C(min_local_percent).
  - With O(services) it also plans those inference_service_list entries on the host without deploying them, with
    the function the inference_service role deploys them with (the P(inferops.numa.numa_service_requests#filter)
    filter), one instance per node with CPUs (C(per_node)), per package over all of its nodes (C(per_socket)), per
    GPU (C(per_gpu)), per group of GPUs (C(gpu_groups)), or one (C(single)).
  - C(playbooks/fleet_report.yml) runs it on every host of an inventory, one module run per host.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
  - inferops.numa.host_root.read_only
options:
  plan_dir:
    description: Where the plan records are; default C(/etc/inferops-numa) under O(root).
    type: path
  services:
    description:
      - Entries of C(inference_service_list) to plan here (C(name), C(layout), C(model) or C(model_size),
        C(gpus), C(policy), ...), their defaults merged as the role merges them (C(fleet_report.yml) passes them
        through the P(inferops.numa.numa_service_entries#filter) filter for that); other keys are ignored.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Read the NUMA metrics of this host
  inferops.numa.numa_metrics:
  register: numa

- name: Say which instances drifted
  ansible.builtin.debug:
    msg: "{{ numa.instances | selectattr('drift') | map(attribute='unit') | list }}"

- name: Plan a service on a captured machine without deploying it
  inferops.numa.numa_metrics:
    root: /srv/dumps/2x-epyc
    services:
      - {name: llama, layout: per_node, model_size: 14G}
"""

RETURN = r"""
host:
  description: C(numa_balancing), C(node_count), C(cpu_count), C(gpu_count) and per node C(id), C(cpus), C(gpus),
    C(memory_total_bytes), C(memory_free_bytes) and C(counters) (numastat numa_hit, numa_miss, ...).
  returned: success
  type: dict
instances:
  description:
    - One per plan record; C(unit), C(service), C(policy), C(nodes), C(up), C(local_ratio) (C(anon), C(file),
      C(judged)), C(resident_bytes), C(remote_bytes), C(affinity_match), C(plan_age_seconds), C(drift), C(message).
    - For an interleaved instance C(interleave_ratio), the share of its pages on each node of its plan, and for a
      weighted-interleave one C(interleave_weight_ratio), the share the kernel's weights give each node.
    - For a running instance C(memory_bandwidth), its memory traffic as the hardware counts it for its own resctrl
      group; C(group), C(local_bytes), C(total_bytes) (cumulative, None where not counted) and C(reason) when
      there is none.
    - C(off_plan_thread_ratio), the share of its threads last seen on a CPU outside its plan; C(tokens_per_second),
      the A/B gate's measured rate of the placement running; C(bytes_per_token), the weights a token reads (the
      service's, else the model's size); C(roofline), the rate its memory nodes allow and the measured share of it
      (C(bound_tokens_per_second), C(share), C(source), C(reason); docs/metrics.md).
  returned: success
  type: list
  elements: dict
planned:
  description: Per instance of O(services) C(unit), C(policy), C(nodes), C(cpulist), C(threads), C(gpus), C(port), or
    C(error) saying why it cannot be placed.
  returned: success
  type: list
  elements: dict
topology:
  description: Nodes with C(cpulist), C(cpus), C(memory_total_bytes) and C(gpus); C(gpus_without_node), C(cpus_online).
  returned: success
  type: dict
read_warnings:
  description: What could not be read (an untrusted plan record, missing counters, the topology reader's warnings).
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch.fleet import host_page
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec


def main() -> None:
    module = AnsibleModule(argument_spec={**host_root_argument_spec(), "plan_dir": {"type": "path"},
                                          "services": {"type": "list", "elements": "dict", "default": []}},
                           supports_check_mode=True)
    try:
        page = host_page(module.params["root"], module.params["plan_dir"], module.params["services"])
    except NumaError as exc:
        module.fail_json(msg=str(exc))
    read_warnings = page.pop("warnings")
    module.exit_json(changed=False, read_warnings=read_warnings, **page)


if __name__ == "__main__":
    main()
