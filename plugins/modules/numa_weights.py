#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_weights
short_description: Set the kernel's weighted-interleave weights from each memory node's bandwidth
version_added: "1.0.0"
description:
  - Weighted interleave (C(MPOL_WEIGHTED_INTERLEAVE), Linux 6.9) places an instance's pages on its nodes in proportion
    to the weights in C(/sys/kernel/mm/mempolicy/weighted_interleave/nodeN). This module sets them in proportion to the
    bandwidth each memory node delivers, so a model interleaved over DRAM and slower memory (a CXL expander, the other
    socket) keeps every node equally busy.
  - "The bandwidth comes from, in this order with O(source=auto): the matrix M(inferops.numa.numa_cost) measured and
    recorded on this host (O(inferops.numa.numa_cost#module:record)) for this same topology; the firmware's HMAT
    (the lower of read and write bandwidth from each node's best initiators); else the kernel computes the weights
    from HMAT itself (C(weighted_interleave/auto), Linux 6.16)."
  - Weights are each node's bandwidth in tenths of the fastest node's (at least 1), divided by their greatest common
    divisor - 20 and 10 GB/s give 2 and 1, 20 and 18 give 10 and 9. Tenths are coarser than a measurement's noise,
    so two identical nodes get equal weights (the kernel's own C(auto) takes percent shares of the total instead).
  - With O(persist), a systemd-tmpfiles drop-in C(/etc/tmpfiles.d/60-inferops-numa-weights.conf) writes the same
    weights at every boot, before any service starts. Nothing is written when the kernel already holds them.
  - A kernel without weighted interleave changes nothing; the result says so, and the planner then uses plain
    interleave.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
options:
  source:
    description:
      - Where the bandwidth comes from. V(auto) takes the first that has a figure for every memory node and changes
        nothing when none has (the result says why).
      - With V(auto), a numa_cost record that is there but cannot be used (of another topology, not root's alone, or
        holding what no measurement gives, such as an infinite or negative bandwidth) is passed over with a warning
        naming why, and the next source is taken.
      - V(measured), V(hmat) or V(kernel) fail when that source has nothing, naming why.
      - V(original) puts back what was there before this module's first change on the host. That first change
        records, once, every weight file it names (and C(auto)) and what stood at the drop-in's path (a file and its
        text and mode, or nothing) in C(/var/lib/inferops-numa/originals/numa_weights.json), a file only root may read
        in a directory only root may write; later runs add a node they newly name, never overwrite one. V(original)
        writes the recorded values back (the nodes, then C(auto), since writing a weight turns C(auto) off), puts the
        drop-in back byte for byte or removes it, checks the kernel holds the values, and deletes the record. With no
        record it changes nothing and says so. A record that is a symlink, not root's, writable by others, or not the
        JSON this module writes (or naming a file that is not a weight) is refused, naming the cause and the fix, and
        nothing is changed. O(persist) and O(record_dir) are not used with it.
    type: str
    default: auto
    choices: [auto, measured, hmat, kernel, original]
  persist:
    description:
      - Keep the weights across reboots with the tmpfiles.d drop-in; V(false) removes the collection's drop-in.
    type: bool
    default: true
  record_dir:
    description:
      - The directory M(inferops.numa.numa_cost) records its measurement in (C(cost.json)); it must be writable by
        root only.
    type: path
    default: /var/lib/inferops-numa
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The drop-in's text and the kernel's weights, before and after (with O(source=original), what is put
      back).
  platform:
    platforms: [linux]
notes:
  - The weights are global to the host; they matter only to processes whose memory policy is weighted interleave,
    which M(inferops.numa.numa_plan) chooses once the weights differ.
"""

EXAMPLES = r"""
- name: Weights from the best source this host has
  inferops.numa.numa_weights:

- name: Measure first, then weigh by what was measured
  inferops.numa.numa_cost:
    record: true
- name: Set the weights from the measurement
  inferops.numa.numa_weights:
    source: measured

- name: Put back the weights and the drop-in the host had before the first change
  inferops.numa.numa_weights:
    source: original
"""

RETURN = r"""
source:
  description: Where the weights came from (measured, hmat, kernel, or original when the originals were put back);
    null when nothing had a bandwidth.
  returned: always
  type: str
  sample: hmat
weights:
  description: The weight of each memory node, by node id; empty when the kernel computes them.
  returned: always
  type: dict
  sample: {"0": 2, "1": 2, "4": 1}
weights_before:
  description: The kernel's weights before the run, by node id.
  returned: always
  type: dict
  sample: {"0": 1, "1": 1, "4": 1}
bandwidth:
  description: Each memory node's bandwidth the weights were made from (GB/s measured, MB/s from HMAT).
  returned: always
  type: dict
  sample: {"0": 20000, "1": 20000, "4": 10000}
auto:
  description: The kernel's C(auto) mode after the run; null when this kernel has none.
  returned: always
  type: bool
  sample: false
supported:
  description: Whether this kernel has weighted interleave.
  returned: always
  type: bool
  sample: true
dropin:
  description: The tmpfiles.d drop-in's path.
  returned: always
  type: str
  sample: /etc/tmpfiles.d/60-inferops-numa-weights.conf
reasons:
  description: Why these weights, and why each source passed over was.
  returned: always
  type: list
  elements: str
  sample: ["measured: no numa_cost record on this host (run numa_cost with record: true)",
           "weights from hmat bandwidth: node 0 20000 MB/s -> 2, node 1 20000 MB/s -> 2, node 4 10000 MB/s -> 1"]
msg:
  description: What was (or would be) changed, and why.
  returned: always
  type: str
  sample: "set node0 1 -> 2; node1 1 -> 2; write /etc/tmpfiles.d/60-inferops-numa-weights.conf (weights from hmat ...)"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import interleave_weights, knobs
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec

ARGUMENT_SPEC = {
    "source": {"type": "str", "default": "auto",
               "choices": list(interleave_weights.SOURCES) + [interleave_weights.ORIGINAL]},
    "persist": {"type": "bool", "default": True},
    "record_dir": {"type": "path", "default": interleave_weights.RECORD_DIR},
    **host_root_argument_spec(),
}


def run_restore(module: AnsibleModule) -> dict:
    """source=original: the recorded originals put back, or a record not to be trusted refused."""
    refused, result = knobs.put_back(module.params["root"], interleave_weights.KNOB, module.check_mode,
                                     module._diff, interleave_weights.restore_result)
    if refused:
        module.fail_json(msg=refused, changed=False)
    return result


def run(module: AnsibleModule) -> dict:
    params = module.params
    if params["source"] == interleave_weights.ORIGINAL:
        return run_restore(module)
    plan = interleave_weights.make_plan(params["root"], params["source"], params["persist"], params["record_dir"])
    for warning in plan.warnings:  # a corrupt or foreign numa_cost record: the weights come from the next source
        module.warn(warning)
    if plan.changed and not module.check_mode:
        knobs.apply(plan.knob)
    result = interleave_weights.result(plan, module.check_mode)
    if module._diff and plan.changed:
        result["diff"] = interleave_weights.diff(plan)
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
