#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_irqs
short_description: Serve the interrupts of the inference servers' devices on their nodes, beside irqbalance
version_added: "1.3.0"
description:
  - A device's interrupt handler touches the queues and buffers on its node. Served on the far socket, every
    completion crosses the socket link; served on a server's compute CPUs, it preempts a decode thread.
  - The devices of the host's instances (each plan's GPUs, and the NICs and NVMe drives on the nodes its CPUs are
    on, from the plan records of O(plan_dir)) get their MSI/MSI-X interrupts served on the device's own node, on
    the CPUs no plan hands to a server (housekeeping CPUs kept out with C(reserve_cpus)) less the kernel's isolated
    ones; where every CPU of the node runs a server, on the node's CPUs.
  - The table of devices and CPUs (C(/etc/inferops-numa/device-irqs.conf)) is applied again at every boot by
    C(inferops-numa-irqs.service) (C(numa-pin irqs)), which finds the interrupts each device has at that boot.
  - irqbalance runs with a policy script that bans the table's devices (a drop-in of C(irqbalance.service) sets
    C(--policyscript)); it balances the other interrupts and is restarted when the table changes. An irqbalance
    running without the script fails the module, naming the setting that overrides it.
  - A device that no longer follows a plan (its instance removed, or O(state=absent)) gets back the affinity each
    interrupt had before the first change (recorded once in C(/var/lib/inferops-numa/originals/numa_irqs.json)),
    else the kernel's default, and irqbalance balances it again.
  - Interrupts whose affinity the kernel manages (NVMe's and virtio-blk's per-queue vectors) are left to it and named.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
options:
  state:
    description:
      - V(present) makes the interrupts follow the plans; V(absent) puts every device's back and removes the table,
        the boot unit and the irqbalance drop-in and policy script.
    type: str
    choices: [present, absent]
    default: present
  plan_dir:
    description: Where the plan records are; default C(/etc/inferops-numa) under O(root).
    type: path
  numa_pin:
    description: Where numa-pin is installed on the host (the boot unit runs C(numa-pin irqs)).
    type: path
    default: /usr/local/bin/numa-pin
  gates:
    description:
      - The instances whose tokens/s judge a change, as M(inferops.numa.numa_rollout) takes them (C(unit), C(port),
        C(engine), C(ab_gate); other keys are ignored). The inference_service role passes its gated instances.
      - Each running one is measured before and after the change (the A/B gate of a placement change); when one is
        slower beyond its noise band (or gains less than its C(min_gain_percent)) the table before is written
        again, the rolled-back table is recorded in C(/etc/inferops-numa/device-irqs.rejected) and later runs keep
        the table before it until the plans change. An instance that cannot be measured before the change fails
        the module with nothing changed; after it, the change is taken back first.
      - Not used with O(state=absent), which puts the interrupts back unmeasured.
    type: list
    elements: dict
    default: []
  request_seconds:
    description: How long one measuring request may take.
    type: float
    default: 600
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The table, the boot unit and irqbalance files, and each interrupt's CPUs, before and after.
  platform:
    platforms: [linux]
notes:
  - Interrupt numbers are handed out when a driver binds; the table names devices by PCI address, so a device that
    binds after the boot unit ran (a driver loaded by hand) gets its CPUs at the next run of the module.
"""

EXAMPLES = r"""
- name: Serve the servers' device interrupts on their nodes
  inferops.numa.numa_irqs:

- name: Put every device's interrupts back
  inferops.numa.numa_irqs:
    state: absent
"""

RETURN = r"""
devices:
  description: Each device whose interrupts follow the plans, by PCI address.
  returned: always
  type: dict
  sample: {"0000:81:00.0": {"kind": "nic", "node": 1, "cpus": "30-31", "spare": true, "interrupts": [45, 46, 47]}}
leaving:
  description: Devices the table listed that no longer follow a plan; their interrupts got back what they had.
  returned: always
  type: list
  elements: str
table:
  description: The table's path.
  returned: always
  type: str
  sample: /etc/inferops-numa/device-irqs.conf
reasons:
  description: Why a device is left alone, or shares its servers' CPUs; interrupts the kernel manages; records left
    out.
  returned: always
  type: list
  elements: str
ab_gate:
  description: Each gated instance's verdict (tokens/s before and after, gain, noise band, kept), by unit.
  returned: always
  type: dict
rolled_back:
  description: Whether the A/B gate found an instance slower and the table before was written again.
  returned: always
  type: bool
msg:
  description: What was (or would be) changed.
  returned: always
  type: str
"""

from typing import List, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import device_irqs, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.device_irqs import irq_targets, parse_table
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.device_irqs import table_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.measure import ab_gate
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.systemctl import run_command
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read
from ansible_collections.inferops.numa.plugins.module_utils.numa.system.root_files import host_path
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "plan_dir": {"type": "path"},
    "numa_pin": {"type": "path", "default": "/usr/local/bin/numa-pin"},
    "gates": {"type": "list", "elements": "dict", "default": []},
    "request_seconds": {"type": "float", "default": ab_gate.REQUEST_SECONDS},
    **host_root_argument_spec(),
}


def wanted(root: str, plan_dir: str) -> Tuple[list, List[str]]:
    """The devices the plans give interrupts to, unless the A/B gate rolled that same table back: then the table
    before it."""
    plans, reasons = device_irqs.plan_records(plan_dir or host_path(root, "/etc/inferops-numa"))
    targets, why = irq_targets(read(root), plans)
    last = device_irqs.rejected(root)
    if last is not None and table_text(targets, device_irqs.OWNER) == last["table"]:
        return parse_table(last["previous"] or ""), reasons + why + [
            "the A/B gate rolled back this table before (%s): the one before it stays; it is measured again when the "
            "plans change, or once %s is removed" % (last["verdict"], device_irqs.REJECTED_PATH)]
    return targets, reasons + why


def run(module: AnsibleModule) -> dict:
    params = module.params
    root = params["root"]
    targets, reasons = [], []
    if params["state"] == "present":
        targets, reasons = wanted(root, params["plan_dir"])
    gated = ab_gate.gated_instances(params["gates"], params["request_seconds"]) if params["state"] == "present" else []
    plan = device_irqs.make_plan(root, targets, params["numa_pin"], reasons)
    managed, verdicts, rolled_back = [], {}, False
    if plan.changed and not module.check_mode:
        managed, verdicts, rolled_back = device_irqs.apply_gated(plan, ab_gate.running(gated, root, run_command),
                                                                 run_command)
    result = device_irqs.result(plan, module.check_mode, managed, verdicts, rolled_back)
    if params["state"] == "absent" and knobs.forget(root, device_irqs.REJECTED_PATH, module.check_mode):
        result["changed"] = True
        result["msg"] += "; %s %s" % ("would remove" if module.check_mode else "removed", device_irqs.REJECTED_PATH)
    if module._diff and plan.changed:
        result["diff"] = device_irqs.diff(plan)
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
