#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_preflight
short_description: Check every input of the numa_host and inference_service roles, and the host, before any change
version_added: "1.0.0"
description:
  - On the controller, checks the roles' variables (C(numa_host_*), C(inference_service_*)) and every entry of
    C(inference_service_list) against the roles' own argument specs, one value at a time, so that every problem is
    named at once; a key no spec has is named with the valid key closest to it, and so is a variable of the play
    very close to a role's option (C(inference_services_list)). The checked values come back converted
    (C(-e numa_host_metrics=false) is the boolean false on every ansible-core); NaN and the infinities are no number.
  - Each entry's C(name) is checked with the rule the role names its units by (C(systemd_unit_prefix)), its
    C(health_url) as an http or https URL with a host, its C(ab_gate) against the A/B gate's own options and bounds
    (C(inputs/gate.py), as M(inferops.numa.numa_rollout) checks them), and a C({port}) or C(ab_gate) without
    C(port_base) is refused.
  - On the host, checks what a deployment needs there, read-only - systemd as PID 1, each service planned (its
    layout gives instances, the model fits), its server binary executable, the plan's CPUs and memory nodes
    allowed by system.slice's cpuset, C(set_mempolicy) allowed, the balancing knob writable when it is to be set,
    and, when a service audits and runs as another user, root's C(CAP_SYS_PTRACE), without which it cannot read that
    user's C(/proc/<pid>/numa_maps). A GPU of a plan with no NIC on its node, on a host with NICs, is a warning
    (RV(host_warnings)), not a problem.
  - Fails with one line per problem (host, service, key, cause, fix) and changes nothing. Playbook
    C(inferops.numa.site) runs it on every host before any change (C(--tags preflight) runs only it); both roles run
    it at their entry, and a second run in the same play run with the same inputs skips the host checks.
  - In check mode a host whose PID 1 is not systemd is no problem. The dry run goes on to plan every instance and
    render its unit, and RV(without_systemd) says in one line what would need systemd; a real run refuses there.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
  - inferops.numa.host_root.read_only
options:
  services:
    description:
      - The service entries to check on the host, defaults merged. Default, and what the roles use, the host's
        C(inference_service_list) with C(inference_service_defaults) and the role's defaults merged and checked.
    type: list
    elements: dict
  balancing:
    description: The balancing state the run is to set (C(keep) skips the knob's check); default C(numa_host_balancing).
    type: str
"""

EXAMPLES = r"""
- name: Check every input and every host before any change
  hosts: all
  any_errors_fatal: true
  gather_facts: false
  tasks:
    - name: Preflight
      inferops.numa.numa_preflight:
      register: numa_preflight

# A problem is one line:
#   gpu-7: service llama: page_cahce: no such key; did you mean page_cache?
#   gpu-7: numa_host_metrics_period_seconds: 5 is out of range; give a value from 10 to 86400
#   gpu-7: service llama: command: /opt/llama/llama-server is not an executable file here; install the server ...
#   gpu-7: inference_services_list: no such variable; did you mean inference_service_list?
#   gpu-7: service llama: ab_gate: rouns: no such key; did you mean rounds?
"""

RETURN = r"""
problems:
  description: Every problem found, one line each, host first. Empty when the preflight passed.
  returned: always
  type: list
  elements: str
settings:
  description: The roles' variables as checked and converted, by name (absent when the preflight failed).
  returned: success
  type: dict
  sample: {"numa_host_metrics": false, "numa_host_metrics_period_seconds": 60}
entries:
  description: C(inference_service_list) with every entry's defaults merged and its values converted.
  returned: success
  type: list
  elements: dict
host_warnings:
  description:
    - What the host's checks found that works but costs, one line each, said as warnings and never failing the run;
      a GPU of a plan with no NIC on its node, on a host with NICs, whose traffic to other hosts crosses the socket
      link.
  returned: success
  type: list
  elements: str
  sample: ["service vllm: vllm@1.service: GPU(s) 0000:92:00.0 have no NIC on their node: their traffic to other
    hosts (NCCL, UCX) crosses the socket link; give the instance GPUs on a node with a NIC, or put one there"]
host_checked:
  description: Whether the host's checks ran (false when an earlier preflight of this run checked the same inputs).
  returned: success
  type: bool
without_systemd:
  description:
    - The one line saying PID 1 here is not systemd and what needs it, or null on a host booted with systemd.
    - A real run fails with it among RV(problems). In check mode it is no problem, only said once as a warning, so a
      dry run plans every instance and renders its unit on a machine without systemd (a container, a build box);
      the roles then skip what asks systemd (the instances' states, enabling them, the audit).
  returned: success
  type: str
  sample: "systemd: PID 1 here is bash, not systemd; starting, restarting, enabling and auditing the instances, and
    the metrics timer, need it: run the roles on a host booted with systemd (--check plans here without it)"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.preflight import host_findings, systemd_problems
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec={**host_root_argument_spec(),
                       "services": {"type": "list", "elements": "dict"},
                       "balancing": {"type": "str"}},
        supports_check_mode=True,
    )
    try:
        problems, warnings = host_findings(module.params["root"], module.params["services"] or [],
                                           module.params["balancing"] or "keep")
    except NumaError as exc:
        module.fail_json(msg=str(exc), problems=[str(exc)])
    # Named apart as well: the action lets a dry run (check mode) go on without systemd, saying this line once.
    without = systemd_problems(module.params["root"])
    module.exit_json(changed=False, problems=problems, host_warnings=warnings,
                     without_systemd=without[0] if without else None)


if __name__ == "__main__":
    main()
