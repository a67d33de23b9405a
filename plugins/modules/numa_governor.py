#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_governor
short_description: Set the cpufreq governor of the CPUs inference servers run on, persisted, and put the original back
version_added: "1.2.0"
description:
  - A decode step is a burst of a few milliseconds per token. A governor that ramps the clock with load (C(powersave)
    under intel_pstate, C(schedutil), C(ondemand)) answers each burst late; C(performance) holds the clock up.
  - cpufreq governs by policy (C(/sys/devices/system/cpu/cpufreq/policyN), one C(scaling_governor) for the CPUs of its
    C(related_cpus)), so the module sets the policies of the CPUs asked for. A policy that also clocks CPUs outside
    O(cpus) gets the governor all the same, and a reason names them.
  - With O(persist), a systemd-tmpfiles drop-in C(/etc/tmpfiles.d/60-inferops-numa-governor.conf) sets the same
    governor at every boot, before any service starts. Nothing is written where the policies already run it.
  - A host without cpufreq (most VMs) changes nothing; the result says so.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
options:
  governor:
    description:
      - The governor to run, one the policies offer (C(scaling_available_governors)), such as V(performance).
      - V(original) puts back what was there before this module's first change on the host. That first change
        records, once, each policy's governor and what stood at the drop-in's path in
        C(/var/lib/inferops-numa/originals/numa_governor.json), a file only root may read in a directory only root may
        write; later runs add a policy they newly set, never overwrite one. V(original) writes them back, puts the
        drop-in back byte for byte or removes it, checks the kernel holds them, and deletes the record. With no
        record it changes nothing and says so; a record that cannot be trusted is refused, naming the cause and the
        fix. O(cpus) and O(persist) are not used with it.
    type: str
    required: true
  cpus:
    description:
      - The CPUs whose policies are set, a CPU list such as C(0-27,56-83); every policy when left out.
      - CPUs that no policy governs (offline, not this host's) fail the module, naming them.
    type: str
  persist:
    description:
      - Set the governor again at every boot with the tmpfiles.d drop-in; V(false) removes the collection's drop-in.
    type: bool
    default: true
  gates:
    description:
      - The instances whose tokens/s judge a change, as M(inferops.numa.numa_rollout) takes them (C(unit), C(port),
        C(engine), C(ab_gate); other keys are ignored).
      - Each running one is measured before and after the change (the A/B gate of a placement change); when one is
        slower beyond its noise band (or gains less than its C(min_gain_percent)) every policy and the drop-in are
        put back, the change is recorded in C(/etc/inferops-numa/governor.rejected) and later runs keep the
        governors as they are until the request changes. An instance that cannot be measured before the change
        fails the module with nothing changed; after it, the change is taken back first.
      - Not used with O(governor=original), which puts the governors back unmeasured and removes the record.
    type: list
    elements: dict
    default: []
  request_seconds:
    description: How long one measuring request of O(gates) may take.
    type: float
    default: 600
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The drop-in's text and each policy's governor, before and after (with O(governor=original), what is put
      back).
  platform:
    platforms: [linux]
notes:
  - Other power managers set governors too (tuned, power-profiles-daemon, C(cpupower.service)); the module checks the
    kernel holds its value after writing and fails naming them when it does not.
"""

EXAMPLES = r"""
- name: Hold the clock up on every CPU, now and at every boot
  inferops.numa.numa_governor:
    governor: performance

- name: Only on socket 1's CPUs, where the servers run
  inferops.numa.numa_governor:
    governor: performance
    cpus: 28-55,84-111

- name: Only if the instance on socket 1 is not slower with it (measured before and after; put back if it is)
  inferops.numa.numa_governor:
    governor: performance
    cpus: 28-55,84-111
    gates:
      - unit: llama@1.service
        port: 8081
        engine: llama.cpp
        ab_gate: {rounds: 5}

- name: Put back the governors and the drop-in the host had before the first change
  inferops.numa.numa_governor:
    governor: original
"""

RETURN = r"""
governor:
  description: The governor set (or V(original) when the originals were put back).
  returned: always
  type: str
  sample: performance
policies:
  description: Each policy set, by name, with its CPUs and its governor before and after the run.
  returned: always
  type: dict
  sample: {"policy0": {"cpus": "0-1", "before": "powersave", "after": "performance"}}
supported:
  description: Whether the host has cpufreq policies.
  returned: always
  type: bool
  sample: true
dropin:
  description: The tmpfiles.d drop-in's path.
  returned: always
  type: str
  sample: /etc/tmpfiles.d/60-inferops-numa-governor.conf
reasons:
  description: Which policies, and what setting them means beyond O(cpus).
  returned: always
  type: list
  elements: str
  sample: ["governor performance on policy0, policy1 (CPUs 0-3)"]
ab_gate:
  description: The A/B gate's verdict for each running instance of O(gates), by unit, when the governor changed
    (medians before and after, the gain, the noise band, C(kept)).
  returned: always
  type: dict
  sample: {"llama@1.service": {"before_tokens_per_second": 12.1, "after_tokens_per_second": 13.0, "kept": true}}
rolled_back:
  description: Whether the A/B gate found an instance slower and the governors were put back.
  returned: always
  type: bool
  sample: false
msg:
  description: What was (or would be) changed, and why.
  returned: always
  type: str
  sample: "set policy0 powersave -> performance; write /etc/tmpfiles.d/60-inferops-numa-governor.conf (governor ...)"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import governor, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import ab_gate
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.systemctl import run_command
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec

ARGUMENT_SPEC = {
    "governor": {"type": "str", "required": True},
    "cpus": {"type": "str"},
    "persist": {"type": "bool", "default": True},
    "gates": {"type": "list", "elements": "dict", "default": []},
    "request_seconds": {"type": "float", "default": ab_gate.REQUEST_SECONDS},
    **host_root_argument_spec(),
}


def run(module: AnsibleModule) -> dict:
    params = module.params
    root = params["root"]
    if params["governor"] == governor.ORIGINAL:
        refused, result = knobs.put_back(root, governor.KNOB, module.check_mode, module._diff,
                                         governor.restore_result)
        if refused:
            module.fail_json(msg=refused, changed=False)
        if knobs.forget(root, governor.REJECTED_PATH, module.check_mode):
            result["changed"] = True
            result["msg"] += "; %s %s" % ("would remove" if module.check_mode else "removed", governor.REJECTED_PATH)
        return result
    gated = ab_gate.gated_instances(params["gates"], params["request_seconds"])
    plan = governor.unless_rejected(
        governor.make_plan(root, params["governor"], params["cpus"], params["persist"]), root)
    verdicts, rolled_back = {}, False
    if plan.changed and not module.check_mode:
        verdicts, rolled_back = governor.apply_gated(plan, ab_gate.running(gated, root, run_command))
    result = governor.result(plan, module.check_mode, verdicts, rolled_back)
    if module._diff and plan.changed:
        result["diff"] = knobs.diff(plan.knob)
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module)
    except NumaError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
