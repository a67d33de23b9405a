#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_plan
short_description: Plan where an inference server should run (NUMA node, CPUs, memory policy, GPUs)
version_added: "0.1.0"
description:
  - Runs the collection's placement planner on the target, with the same options as C(numa-pin explain), and returns
    the plan. Changes nothing.
  - Use it to template systemd units (C(CPUAffinity=), C(NUMAPolicy=), C(NUMAMask=)), to record the plan a service
    should follow, and in C(--check) runs.
  - The decision rules are documented in the collection's C(docs/placement.md).
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
  - inferops.numa.host_root.read_only
options:
  node:
    description: Node id to anchor on (0 to 1023); omit (or C(auto)) to let the planner choose.
    type: str
  gpus:
    description:
      - C(auto) (instance i gets the i-th GPU in PCI order), C(none), a count (0 to 1024), or a list of PCI addresses,
        each given once (C(0000:81:00.0) or C(81:00.0)); an empty entry is an error.
    type: raw
    default: auto
  model_size:
    description:
      - Model size in bytes, a size such as C(14G), or the path of the model (file or directory) on the target.
      - With O(memory_headroom) it must stay below 16 EiB; a number has at most 40 digits.
    type: str
  model:
    description: Model files or directories the server maps; they size the request when O(model_size) is absent.
    type: list
    elements: path
    default: []
  memory_headroom:
    description: Added to the model size for KV cache and buffers, such as C(10%+1G), C(2G) or C(0).
    type: str
    default: 10%+1G
  smt:
    description: Hand out every hardware thread (true) or one thread per physical core (false).
    type: bool
    default: true
  cores:
    description:
      - Which CPUs of a node to hand out, C(all) or only its fastest kind (C(fast)) where the facts' C(cpus.kinds)
        tell kinds apart (hybrid parts, Priority Core Turbo); on a host whose CPUs are alike C(fast) uses them all.
    type: str
    choices: [all, fast]
    default: all
  reserve_cpus:
    description: CPU list never handed out (housekeeping), such as C(0,1).
    type: str
  scope:
    description: Place on one NUMA node or on a whole socket (package).
    type: str
    choices: [node, socket]
    default: node
  instances:
    description:
      - How many instances of this service run on the host, from 1 to 8192; never more than the host's usable CPUs
        (online, allowed by the cpuset, not reserved).
    type: int
    default: 1
  instance:
    description: Which instance to plan, 0-based (below O(instances)).
    type: int
    default: 0
  policy:
    description: Memory policy; C(auto) binds when the model fits one node.
    type: str
    choices: [auto, bind, preferred, interleave, weighted_interleave]
    default: auto
  on_unfit:
    description: What to do when the model does not fit one node.
    type: str
    choices: [interleave, fail]
    default: interleave
  port_base:
    description: Instance i gets port O(port_base) + i; the last instance's port must be at most 65535.
    type: int
  anchors:
    description:
      - The node of each instance in instance order, such as C(0,1), as a deployment planned them all from one
        snapshot. Keeps the spread stable when instances already run; memory fit is still checked.
      - One node per instance, each a node of the host.
    type: str
  engine:
    description:
      - The inference engine. The plan's RV(plan.engine) sets that engine's own NUMA switches so they agree with the
        plan's binding; C(generic) sets none. See docs/engines.md.
    type: str
    choices: [generic, llama.cpp, vllm, sglang, trtllm]
    default: generic
  container:
    description:
      - The container runtime the instance runs in (a service's C(container) entry, docs/containers.md). Only
        recorded in RV(record), so the audit finds the container's processes; the plan itself does not change.
    type: str
    choices: [docker, podman]
    version_added: "1.1.0"
  record_file:
    description:
      - A plan record a deployment wrote, such as C(/etc/inferops-numa/llama@1.plan.json). The module reads it
        (never writes it) and returns RV(record) and whether the file already holds it (RV(record_current)), so a
        role writes, and restarts for, only the records that changed.
      - A file that is missing, unreadable, a symlink or in a linked directory, owned by someone other than root
        (or the user the module runs as), or writable by others - the file or a directory above it - is not
        current.
    type: path
"""

EXAMPLES = r"""
- name: Plan instance 1 of 2 of a llama-server on this host
  inferops.numa.numa_plan:
    instances: 2
    instance: 1
    model: /srv/models/llama-3-8b.Q4_K_M.gguf
    port_base: 8080
  register: placement

- name: Show where it goes
  ansible.builtin.debug:
    msg: "node {{ placement.plan.node }}, cpus {{ placement.plan.cpulist }}, {{ placement.plan.policy }}"
"""

RETURN = r"""
plan:
  description: The placement.
  returned: success
  type: dict
  contains:
    policy:
      description: Memory policy, one of bind, preferred, interleave, weighted-interleave.
      type: str
      sample: bind
    node:
      description: The anchor node.
      type: int
      sample: 1
    mem_nodes:
      description: Nodes the memory policy names.
      type: list
      elements: int
      sample: [1]
    cpu_nodes:
      description: Nodes whose CPUs are handed out.
      type: list
      elements: int
      sample: [1]
    cpus:
      description: CPUs handed out.
      type: list
      elements: int
      sample: [60, 61, 62, 63, 140, 141, 142, 143]
    cpulist:
      description: The same CPUs as a kernel list string.
      type: str
      sample: 60-79,140-159
    threads:
      description: Number of CPUs handed out (use it for C(-t)).
      type: int
      sample: 40
    gpus:
      description: PCI addresses of the GPUs given to this instance.
      type: list
      elements: str
      sample: ["0000:c1:00.0"]
    gpu_map:
      description:
        - Per GPU of the instance, in the order the server sees them, where the worker that drives it belongs. An
          instance whose GPUs span nodes runs on all of them; the engine binds each worker by this map.
      type: list
      elements: dict
      contains:
        gpu:
          description: The GPU's PCI address.
          type: str
          sample: "0000:81:00.0"
        node:
          description: The usable node local to the GPU (for a GPU on a CPU-less node, the nearest usable one).
          type: int
          sample: 1
        cpulist:
          description: The worker's CPUs, its share of the instance's CPUs on that node.
          type: str
          sample: 40-59,120-139
        mem_nodes:
          description: The node(s) whose memory serves the worker.
          type: list
          elements: int
          sample: [1]
        memory_node:
          description: The node holding the GPU's own memory (GH200/GB200 HBM), or null.
          type: int
          sample: null
        nics:
          description: NICs on the GPU's node, each with C(address), C(name), C(rdma_name) (for C(NCCL_IB_HCA)) and
            C(near); an RDMA NIC's also with C(ports), its port numbers (C(UCX_NET_DEVICES) names C(mlx5_0:1)).
          type: list
          elements: dict
          sample: [{"address": "0000:41:00.0", "name": "ens1f0", "rdma_name": "mlx5_0", "near": "node", "ports": [1]}]
    engine:
      description: What O(engine) needs to hear; C(env) is also in RV(plan.env), C(args) go after the server's own.
      type: dict
      contains:
        engine:
          description: The engine's name.
          type: str
          sample: vllm
        args:
          description: Arguments added after the server's own (a flag the command already gives is left as it is).
          type: list
          elements: str
          sample: ["--numa-bind", "--numa-bind-nodes", "0", "1", "--numa-bind-cpus", "0-39", "40-79"]
        env:
          description: Environment the recipe sets.
          type: dict
          sample: {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
        requires:
          description: Programs the engine runs for its binding (numa-pin refuses to start without them).
          type: list
          elements: str
          sample: ["numactl"]
        conflicts:
          description: Flags of the server's command that would undo the binding (numa-pin refuses a command with one).
          type: list
          elements: str
          sample: ["--numa"]
        reasons:
          description: The recipe's choices, in words (also in RV(plan.reasons)).
          type: list
          elements: str
          sample: ["engine vllm: --numa-bind runs worker i under numactl --physcpubind=<cpus i> --membind=<node i>, ..."]
    env:
      description: Environment the server gets (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, ...).
      type: dict
      sample: {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": "40"}
    instance:
      description: The instance planned, as O(instance).
      type: int
      sample: 1
    instances:
      description: The number of instances, as O(instances).
      type: int
      sample: 2
    port:
      description: O(port_base) + instance, or null.
      type: int
      sample: 8081
    required_bytes:
      description: Memory the model needs with its headroom (O(model_size) + O(memory_headroom)); null without a size.
      type: int
      sample: 17609365914
    available_bytes:
      description: Memory available on the plan's memory nodes when it was made.
      type: int
      sample: 186401580646
    reasons:
      description: Every decision and fallback, in words.
      type: list
      elements: str
      sample: ["usable nodes: 0-1", "node 1 chosen: local to GPU 0000:c1:00.0",
               "model 14 GiB + headroom 2.4 GiB (10%+1G) = 16.4 GiB fits node 1 (173.6 GiB available): binding"]
    inputs:
      description: The request as the planner saw it (sizes in bytes, defaults filled in).
      type: dict
      sample: {"node": null, "gpus": "auto", "model_size": 15032385536, "memory_headroom": "10%+1G", "smt": true,
               "reserve_cpus": [], "scope": "node", "instances": 2, "instance": 1, "policy": "auto",
               "on_unfit": "interleave", "port_base": 8080, "anchors": null}
record:
  description: The stable part of the plan that a deployment records and compares between runs (no reasons).
  returned: success
  type: dict
  sample: {"policy": "bind", "mem_nodes": [1], "cpu_nodes": [1], "node": 1, "cpulist": "2-3", "threads": 2}
record_current:
  description: Whether O(record_file) already holds RV(record); false without O(record_file).
  returned: success
  type: bool
  sample: true
topology_warnings:
  description:
    - What the topology reader found odd on this host (files missing, empty or garbled), one line each, as in the
      facts' C(warnings); an empty list on a well-formed host. The plan is made from what could be read.
  returned: success
  type: list
  elements: str
  sample: ["sys/devices/system/cpu/cpu5/online: expected 0 or 1, found 'x'; counted as online"]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.placement import plan
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs.request import argument_spec, build_request
from ansible_collections.inferops.numa.plugins.module_utils.numa.act.unit_text import plan_record, record_is_current
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.containers import RUNTIMES
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.topology import read
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec

# The request's options are request.py's table (numa-pin explain takes the same); DOCUMENTATION above
# repeats them for ansible-doc, and tests/unit/test_request.py holds it to the table.
ARGUMENT_SPEC = dict(argument_spec(), **host_root_argument_spec(), record_file={"type": "path"},
                     container={"type": "str", "choices": sorted(RUNTIMES)})


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        topology = read(module.params["root"])
        placement = plan(topology, build_request(module.params))
    except NumaError as exc:
        module.fail_json(msg=str(exc))
    result = placement.to_dict()
    record = plan_record(result, module.params["container"])
    path = module.params["record_file"]
    module.exit_json(changed=False, plan=result, record=record,
                     record_current=path is not None and record_is_current(path, record),
                     topology_warnings=topology["warnings"])


if __name__ == "__main__":
    main()
