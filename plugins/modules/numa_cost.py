#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_cost
short_description: Measure what crossing NUMA nodes costs on a host
version_added: "0.1.0"
description:
  - For every pair of a NUMA node with CPUs and a NUMA node with memory (memory-only nodes included), a child
    process pinned to the first node's CPUs and bound (C(MPOL_BIND)) to the second node's memory measures memory
    latency with a pointer chase and copy bandwidth with large memmoves. The pages' node is checked with
    C(move_pages) before anything is timed.
  - Returns the matrices, each also as a ratio to the local (nearest-memory) column, next to the firmware's SLIT
    distances and their ratio. A pair that cannot be measured (no CPUs, no memory, cpuset, not enough free memory,
    time budget, kernel refused) is null in every matrix and explained in RV(unmeasured).
  - Samples the kernel's per-node allocation counters (numastat, /proc/vmstat) over O(window_seconds) for the share of
    remote allocations; for a service given by O(pids) or O(unit) also the share of its pages off its plan's nodes
    (as M(inferops.numa.numa_audit) reads them) and, where C(perf) can count them, its remote loads.
  - Changes nothing on the host unless O(record) is set; the measuring children are always reaped. Check mode runs the
    same measurement.
  - The latency method (Python chase minus its own per-step cost) is explained in the collection's C(docs/cost.md),
    with its agreement to a C pointer chase.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  max_seconds:
    description:
      - Time budget for the whole measurement. Pairs that no longer fit are reported in RV(unmeasured), and a child
        still running at the deadline is killed.
      - Above 0 and at most V(86400) (a day).
    type: float
    default: 120
  buffer_mb:
    description:
      - Size of the chase and copy buffer in MiB, allocated on each memory node in turn.
      - Default four times the largest cache, at least 64 MiB. A node with less free memory than this (plus 32 MiB)
        is not measured.
      - At most V(1048576) (1 TiB).
    type: int
  small_kb:
    description:
      - Size in KiB of the buffer whose chase measures the interpreter's per-step cost. Default half the L1 data
        cache. At most V(1048576).
    type: int
  chase_steps:
    description:
      - Pointer-chase steps per buffer, pair and round, timed in stretches of 5000; the fastest stretch counts.
      - From 1 to V(1000000000).
    type: int
    default: 1000000
  repeats:
    description:
      - Copies per pair and round; the fastest counts. From 1 to V(1000).
    type: int
    default: 5
  rounds:
    description:
      - How many times every pair is measured, round-robin; each pair keeps its quietest round (lowest raw chase
        time) and its best copy rate. From 1 to V(1000).
    type: int
    default: 2
  window_seconds:
    description:
      - How long to sample the allocation counters (and run C(perf)) for RV(remote_ratio); above 0 and at most
        V(3600).
    type: float
    default: 1.0
  pids:
    description:
      - PIDs of a service whose pages and remote loads to report, each given once. Mutually exclusive with O(unit).
    type: list
    elements: int
  unit:
    description:
      - systemd unit of a service whose pages and remote loads to report. Mutually exclusive with O(pids).
    type: str
  plan:
    description:
      - The service's plan (the C(plan) returned by M(inferops.numa.numa_plan)); its C(mem_nodes) are the nodes the
        service's pages should be on. Without it, pages are reported per node without a share.
    type: dict
  record:
    description:
      - Keep the measured matrices on the host, in C(/var/lib/inferops-numa/cost.json) (written whole or not at all,
        never through a link), where M(inferops.numa.numa_weights) takes the weighted-interleave weights from.
      - The module then reports C(changed). Check mode measures but records nothing.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: Check mode runs the same measurement and records nothing.
  diff_mode:
    support: none
  platform:
    platforms: [linux]
notes:
  - Emulated NUMA (QEMU C(-numa)) has no real latency difference between nodes, so the measured ratios are about 1.0
    while SLIT may say 2.1. The result says which figures are measured (RV(method.measured)).
  - Other processes on the host make figures read high, never low; RV(method.spread) and the load average in
    RV(method.noise) show how busy the host was.
"""

EXAMPLES = r"""
- name: Measure the cross-node cost with defaults
  inferops.numa.numa_cost:
  register: cost

- name: Show the latency ratio matrix
  ansible.builtin.debug:
    msg: "{{ cost.latency_ratio }} (SLIT says {{ cost.distance_ratio }})"

- name: Short run, and the remote share of a running service
  inferops.numa.numa_cost:
    buffer_mb: 64
    max_seconds: 30
    window_seconds: 5
    unit: llama-server@0.service
    plan: "{{ plan_result.plan }}"
"""

RETURN = r"""
nodes:
  description: Node ids; the row and column order of every matrix. Rows are CPU nodes, columns memory nodes.
  returned: always
  type: list
  elements: int
  sample: [0, 1]
latency_ns:
  description: Measured memory latency in ns per (CPU node, memory node); null where not measured.
  returned: always
  type: list
  elements: list
  sample: [[95.1, 141.7], [142.0, 94.8]]
bandwidth_gbps:
  description: Measured copy bandwidth in GB/s (bytes read plus written, 1e9 bytes); null where not measured.
  returned: always
  type: list
  elements: list
  sample: [[41.8, 27.9], [28.1, 41.5]]
latency_ratio:
  description: latency_ns divided by the row's local column (see RV(local_reference)); above 1 is slower.
  returned: always
  type: list
  elements: list
  sample: [[1.0, 1.49], [1.5, 1.0]]
bandwidth_ratio:
  description: bandwidth_gbps divided by the row's local column; below 1 is slower.
  returned: always
  type: list
  elements: list
  sample: [[1.0, 0.67], [0.68, 1.0]]
distance:
  description: The firmware's SLIT distance matrix (not a measurement).
  returned: always
  type: list
  elements: list
  sample: [[10, 21], [21, 10]]
distance_ratio:
  description: SLIT distances divided by the row's local column (not a measurement).
  returned: always
  type: list
  elements: list
  sample: [[1.0, 2.1], [2.1, 1.0]]
local_reference:
  description: Per row, the memory node its ratios are relative to (the node itself, or the nearest memory node of a
    memory-less CPU node); null when there is none.
  returned: always
  type: list
  elements: int
  sample: [0, 1]
unmeasured:
  description: "Pair C(cpu->mem) (e.g. C(0->1)) -> why it has no numbers."
  returned: always
  type: dict
  sample: {"2->0": "node 2 has no CPUs (memory-only node): nothing can run there"}
placement:
  description: "Measured pair -> where move_pages found the sampled buffer pages."
  returned: always
  type: dict
  sample: {"0->1": "65 of 65 sampled pages on node 1"}
notes:
  description: Remarks on rows whose ratios could not be computed.
  returned: always
  type: list
  elements: str
  sample: ["CPU node 1: its local pair was not measured, so its row has no ratios"]
remote_ratio:
  description:
    - Allocation counters over the window per node (C(nodes), with C(remote_share) and C(miss_share)) and host-wide
      (C(host)); C(perf) with C(node_loads)/C(node_load_misses) or the reason they are unavailable; C(service) with
      C(off_plan_share) when O(pids) or O(unit) is given. C(available=false) with a C(reason) on a kernel without NUMA
      counters.
  returned: always
  type: dict
  sample: {"window_seconds": 1.0, "definition": "remote_share = other_node / (local_node + other_node) ...",
           "host": {"allocations": 3279, "numa_hit": 3279, "numa_miss": 0, "numa_foreign": 0,
                    "numa_interleave": 0, "numa_local": 3200, "numa_other": 79, "remote_share": 0.024},
           "nodes": [{"node": 0, "allocations": 3279, "local_node": 3200, "other_node": 79, "numa_hit": 3279,
                      "numa_miss": 0, "numa_foreign": 0, "interleave_hit": 0, "remote_share": 0.024,
                      "miss_share": 0.0}],
           "perf": {"available": false, "reason": "no service given: pass pids or unit to count its remote loads with perf"}}
method:
  description: How the figures were made and how far to trust them.
  returned: always
  type: dict
  contains:
    measured:
      description: Which figures are measured on the host and which come from the firmware's SLIT.
      type: str
      sample: "latency_ns, bandwidth_gbps and their ratios are measured on this host now; distance and
        distance_ratio are the firmware's SLIT table, not a measurement"
    latency:
      description: The latency method with buffer sizes and step counts.
      type: str
      sample: "Python pointer chase over a random cyclic permutation of 64-byte lines in a 128 MiB buffer, minus the
        same chase over a 24 KiB buffer (the interpreter's cost per step); fastest 5000-step stretch of 1000000
        steps each, quietest of 2 round(s) per pair"
    latency_error:
      description: The known error of the latency method, with what this run subtracted from the raw chase (the
        range of RV(method.overhead_ns) over the measured pairs, in ns and as a share of RV(method.raw_ns)).
      type: str
      sample: "reads low: latency_ns is raw_ns minus the interpreter's cost per step (overhead_ns) ...; in this run
        overhead_ns was 20.1-23.4 ns, 14-19 % of raw_ns; ..."
    bandwidth:
      description: The bandwidth method and what GB/s counts.
      type: str
      sample: "memmove between the halves of the bound 128 MiB buffer; GB/s = (bytes read + bytes written) / seconds
        / 1e9 (STREAM copy convention); best of 5 copies per round"
    noise:
      description: How other load affects the figures, with the load average at the start.
      type: str
      sample: "fastest stretch / best copy: other processes make numbers read high, not low; load average at the
        start was 0.52 0.61 0.70; spread = median stretch / fastest stretch of the big chase (1.0 = quiet host)"
    ratios:
      description: How the ratio matrices are computed (each row over its local column).
      type: str
      sample: "each row divided by its local column: the CPU node's own memory, or the nearest memory node by SLIT
        for a memory-less CPU node (local_reference); latency ratio > 1 and bandwidth ratio < 1 mean remote is worse"
    raw_ns:
      description: Per pair, ns per step of the chase over the big buffer before the interpreter's cost is
        subtracted.
      type: list
      elements: list
      sample: [[116.4, 163.0], [163.3, 116.1]]
    overhead_ns:
      description: Per pair, ns per step of the same chase over the L1-resident buffer.
      type: list
      elements: list
      sample: [[21.3, 21.3], [21.3, 21.3]]
    spread:
      description: Per pair, median over fastest stretch of the big chase; 1.0 means a quiet host.
      type: list
      elements: list
      sample: [[1.02, 1.03], [1.02, 1.04]]
    pair_seconds:
      description: Wall time of each pair's children, all rounds.
      type: list
      elements: list
      sample: [[2.31, 2.52], [2.49, 2.3]]
    rounds_done:
      description: Per pair, how many rounds were measured (fewer than O(rounds) when the budget ran out).
      type: list
      elements: list
      sample: [[2, 2], [2, 2]]
    setup_seconds:
      description: Time to build the random permutation shared by all pairs (counted in O(max_seconds)).
      type: float
      sample: 1.9
    buffer_bytes:
      description: Size of the chase and copy buffer.
      type: int
      sample: 134217728
    small_buffer_bytes:
      description: Size of the L1-resident buffer.
      type: int
      sample: 24576
    chase_steps:
      description: O(chase_steps) as used.
      type: int
      sample: 1000000
    chunk_steps:
      description: Steps per timed stretch of the chase; the fastest stretch counts.
      type: int
      sample: 5000
    repeats:
      description: O(repeats) as used.
      type: int
      sample: 5
    rounds:
      description: O(rounds) as used.
      type: int
      sample: 2
    python:
      description: Version of the Python that ran the chase (its per-step cost is subtracted).
      type: str
      sample: 3.11.2
    notes:
      description: About the buffer sizes, such as a cache size sysfs did not give (then assumed) or a O(buffer_mb)
        under twice the last-level cache.
      type: list
      elements: str
      sample: ["cache size l3_kb unknown in sysfs: assumed 32768 KiB"]
topology_signature:
  description: NUMA shape of the host (CPUs per node, memory-less nodes, SLIT); equal strings mean the same host type.
  returned: always
  type: str
  sample: "node0:2cpu node1:2cpu slit=10,21/21,10"
elapsed_seconds:
  description: Wall time of the measurement (the window excluded).
  returned: always
  type: float
  sample: 13.2
recorded:
  description: The file the measurement was kept in.
  returned: when O(record) is set, not in check mode
  type: str
  sample: /var/lib/inferops-numa/cost.json
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.measure.cost import (
    DEFAULT_CHASE_STEPS, DEFAULT_MAX_SECONDS, DEFAULT_REPEATS, DEFAULT_ROUNDS, CostOptions, record, run)
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

ARGUMENT_SPEC = {
    "max_seconds": {"type": "float", "default": DEFAULT_MAX_SECONDS},
    "buffer_mb": {"type": "int"},
    "small_kb": {"type": "int"},
    "chase_steps": {"type": "int", "default": DEFAULT_CHASE_STEPS},
    "repeats": {"type": "int", "default": DEFAULT_REPEATS},
    "rounds": {"type": "int", "default": DEFAULT_ROUNDS},
    "window_seconds": {"type": "float", "default": 1.0},
    "pids": {"type": "list", "elements": "int"},
    "unit": {"type": "str"},
    "plan": {"type": "dict"},
    "record": {"type": "bool", "default": False},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           mutually_exclusive=[("pids", "unit")])
    params = module.params
    try:
        options = CostOptions(buffer_mb=params["buffer_mb"], small_kb=params["small_kb"],
                              chase_steps=params["chase_steps"], repeats=params["repeats"],
                              max_seconds=params["max_seconds"], rounds=params["rounds"])
        result = run(options, params["window_seconds"], params["pids"], params["unit"], params["plan"])
        if params["record"] and not module.check_mode:
            result["recorded"] = record(result)
    except NumaError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=bool(result.get("recorded")), **result)


if __name__ == "__main__":
    main()
