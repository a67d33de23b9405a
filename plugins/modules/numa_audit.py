#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_audit
short_description: Check where a running service's memory and threads really are
version_added: "0.1.0"
description:
  - Reads C(/proc/<pid>/numa_maps) (resident pages per NUMA node, with anonymous memory, file-backed data and
    program code apart) and C(/proc/<pid>/task/<tid>/status) (C(Cpus_allowed_list), C(Mems_allowed_list)) of every thread of the given
    processes, or of every process in a systemd unit's cgroup.
  - Compares them with the placement plan (from M(inferops.numa.numa_plan) or the plan file the
    C(inferops.numa.inference_service) role writes) and fails, with the numbers, when a service with a C(bind)
    plan has less than O(min_local_percent) of its memory on the plan's nodes (or no resident memory at all),
    or when a thread may run on a CPU outside the plan's CPUs.
  - With a plan, and a table of device interrupts M(inferops.numa.numa_irqs) keeps, it also fails when an
    interrupt of one of the instance's devices (its GPUs, the NICs and NVMe drives on its nodes) is served outside
    the CPUs the table gives it (irqbalance without the collection's policy script, or another tuner, moved it).
  - Never passes with nothing audited, plan or not; a process in O(pids) that has no memory of its own (a
    kernel thread, or a zombie that has exited) fails the audit with that reason. Such a process in a unit's
    cgroup is left out with a warning, and a unit with no other process fails.
  - For a unit it first waits (at most O(wait_seconds)) until the unit is active and the resident memory of its
    main process stopped growing, so a model still loading is not judged half-loaded.
  - Never changes anything.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
  - inferops.numa.host_root.read_only
options:
  unit:
    description:
      - A systemd unit, for example C(llama@1.service). Every process of its cgroup is audited.
      - Mutually exclusive with O(pids).
    type: str
  pids:
    description:
      - Process IDs to audit, each from 1 to 4194304 (the kernel's highest PID) and given once. Mutually
        exclusive with O(unit).
    type: list
    elements: int
  units:
    description:
      - Several systemd units in one run, each against its own plan file; the result lists one report per unit
        in RV(units) and fails when any of them fails. Mutually exclusive with O(unit), O(pids), O(plan) and
        O(plan_file); O(wait_seconds), O(settle_seconds) and O(root) apply to each.
      - One module run instead of one per instance, which matters on hosts where starting Python is slow.
    type: list
    elements: dict
    suboptions:
      unit:
        description: The unit, for example C(llama@1.service).
        type: str
        required: true
      plan_file:
        description: Its plan file, as O(plan_file). Without it the unit is only reported.
        type: path
      min_local_percent:
        description: As O(min_local_percent).
        type: float
        default: 99
      pages:
        description: As O(pages).
        type: str
        choices: [all, anon, file]
        default: all
  plan_dir:
    description:
      - Audit every instance the C(inferops.numa.inference_service) role deployed on the host, each against the plan
        record it wrote in this directory (such as C(/etc/inferops-numa)) and its service's judging
        (C(min_local_percent), C(pages); a service deployed with C(audit=false) is left out), as the metrics do.
        Records that cannot be trusted (not root's, writable by others, a link) are left out with a warning.
      - Mutually exclusive with O(unit), O(pids), O(units), O(plan) and O(plan_file). Playbook C(site.yml) runs it
        with C(--tags audit).
    type: path
  plan:
    description:
      - The plan to compare with, as returned by M(inferops.numa.numa_plan) (keys C(policy), C(mem_nodes), and
        C(cpus) or C(cpulist)).
      - Without O(plan) and O(plan_file) the module only reports; it fails only when a process has no memory
        to audit.
    type: dict
  plan_file:
    description:
      - A JSON file holding the plan, such as C(/etc/inferops-numa/llama@1.plan.json) written by the
        C(inferops.numa.inference_service) role. Read on the managed host.
      - Its verdict decides rollbacks, so the file is read only when it can be trusted - not a symlink, in no
        linked directory, owned by root (or the user the module runs as) and writable by nobody else, as is every
        directory above it, and at most 1 MiB of one JSON object - else the audit fails naming why.
    type: path
  min_local_percent:
    description:
      - Lowest acceptable share of resident memory on the plan's C(mem_nodes), in percent (0 to 100), for a
        C(bind) plan.
      - Reported but not enforced for C(preferred) and interleave plans.
    type: float
    default: 99
  pages:
    description:
      - Which resident pages the local share counts. V(all) is anonymous plus file-backed data; V(file) is mostly
        page cache, such as an mmap-ed model, which stays on the node that first read it.
      - Program and library code is never counted (see notes), only reported.
    type: str
    choices: [all, anon, file]
    default: all
  wait_seconds:
    description:
      - With O(unit), how long to wait for the unit to be active and its memory to settle. V(0) looks once;
        at most V(86400) (a day).
    type: int
    default: 60
  settle_seconds:
    description:
      - With O(unit), how long the main process's resident memory must stay within 1% before the audit reads it;
        0 to V(86400).
    type: float
    default: 3
notes:
  - C(Mems_allowed_list) follows cpusets, not the memory policy, so memory placement is judged from
    C(numa_maps) only.
  - Pages counted as C(anon) are those of mappings without a file and of mappings whose resident pages are all
    anonymous; file-backed mappings that are executable in C(/proc/<pid>/maps) count as C(code); the rest count as
    C(file).
  - C(code) is left out of the local share because one copy of a program's text serves every process on the host;
    a second instance of the same server necessarily runs code cached on the first one's node.
  - Shared libraries' read-only data (and C(locale-archive)) count as C(file) and are shared the same way, a few MiB
    that only matter for a service whose own memory is small. Use O(pages=anon) for such a service.
  - Reading another user's C(numa_maps) needs root, so run it with C(become=true).
seealso:
  - module: inferops.numa.numa_plan
"""

EXAMPLES = r"""
- name: Audit instance 1 of the llama service against the plan the role wrote
  inferops.numa.numa_audit:
    unit: llama@1.service
    plan_file: /etc/inferops-numa/llama@1.plan.json
    wait_seconds: 300

- name: Audit every instance the inference_service role deployed, as site.yml --tags audit does
  inferops.numa.numa_audit:
    plan_dir: /etc/inferops-numa
    wait_seconds: 0

- name: Audit every instance of two services in one run
  inferops.numa.numa_audit:
    units:
      - {unit: llama@0.service, plan_file: /etc/inferops-numa/llama@0.plan.json}
      - {unit: llama@1.service, plan_file: /etc/inferops-numa/llama@1.plan.json}
      - {unit: embed@0.service, plan_file: /etc/inferops-numa/embed@0.plan.json, pages: anon}
    wait_seconds: 300

- name: Report where a process's memory is, without judging it
  inferops.numa.numa_audit:
    pids: [4242]
  register: where

- name: Accept remote page cache, but require the process's own memory local
  inferops.numa.numa_audit:
    pids: [4242]
    plan:
      policy: bind
      mem_nodes: [1]
      cpulist: 28-55,84-111
    pages: anon
"""

RETURN = r"""
ok:
  description: Whether the audit passed (without a plan, false only when a process had no memory to audit).
  returned: always
  type: bool
  sample: true
msg:
  description: One line with the numbers, and every problem found.
  returned: always
  type: str
  sample: "llama@1.service: PID(s) 4242: 14.2 GiB resident, 99.98% of anon + file on node(s) 1 (anon 100.00%,
    file 99.97%; code 3.10%, not counted)"
unit:
  description: The audited unit.
  returned: when O(unit) is given
  type: str
  sample: llama@1.service
units:
  description: With O(units), one report per unit, in the order given; each has the keys C(unit), C(ok),
    C(msg) and, when the unit could be read, the other keys returned for a single O(unit).
  returned: when O(units) or O(plan_dir) is given
  type: list
  elements: dict
  sample: [{"unit": "llama@0.service", "ok": true, "local_percent": 100.0,
            "msg": "llama@0.service: PID(s) 912: 140.1 MiB resident, 100.00% of anon + file on node(s) 0"}]
table:
  description:
    - With O(plan_dir), the placement table C(make demo) prints, one line per instance after the header (its plan's
      node(s), CPUs, policy, threads and port, the local pages audited now, tokens/s where an A/B gate measured it);
      every value a host wrote is escaped. Returned when the audit fails too, so the failure shows it.
    - Playbook C(site.yml) shows it with C(--tags audit).
  returned: when O(plan_dir) is given
  type: list
  elements: str
  sample: ["instance  node(s)  cpus  policy  threads  local pages  model pages local  port  tokens/s",
           "llama@0   0        0-1   bind    2        100.00 %     99.87 %            8080  13.7"]
device_irqs:
  description:
    - With a plan and the table M(inferops.numa.numa_irqs) keeps, the instance's devices the table lists (C(kind)
      gpu, nic or nvme), each with the CPUs its interrupts are served on by the table, how many MSI interrupts it
      has and how many of them are served outside those CPUs (each such one fails the audit).
  returned: with a plan, when the table lists a device
  type: list
  elements: dict
  sample: [{"device": "0000:81:00.0", "kind": "nic", "cpus": "23", "interrupts": 9, "outside": 0}]
processes:
  description: One entry per audited process.
  returned: with O(unit) or O(pids)
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID.
      type: int
      sample: 4242
    name:
      description: Process name (C(Name:) of its status).
      type: str
      sample: llama-server
    cpus_allowed:
      description: C(Cpus_allowed_list) of the main thread.
      type: str
      sample: 28-55,84-111
    mems_allowed:
      description: C(Mems_allowed_list) of the main thread (cpuset, not memory policy).
      type: str
      sample: 0-1
    thread_count:
      description: Number of threads read.
      type: int
      sample: 57
    threads_outside:
      description: Threads allowed or last seen on a CPU outside the plan, with tid, name, cpus_allowed,
        mems_allowed and last_cpu.
      type: list
      elements: dict
      sample: [{"tid": 4250, "name": "llama-server", "cpus_allowed": "0-111", "mems_allowed": "0-1", "last_cpu": 3}]
    threads_off_plan:
      description: How many of its threads last ran on a CPU outside the plan (field 39 of their stat); null without
        a plan's CPUs.
      type: int
      sample: 1
    policies:
      description: Resident bytes per memory policy as numa_maps prints it (C(bind:1), C(default) ...).
      type: dict
      sample: {"bind:1": 15230976000, "default": 2912256}
    nodes:
      description: Per node id, C(anon_bytes), C(file_bytes), C(code_bytes), C(anon_pages), C(file_pages),
        C(code_pages) (pages in the base page size; a hugetlb page counts as many base pages).
      type: dict
      sample: {"1": {"anon_bytes": 4096000, "file_bytes": 34631680, "code_bytes": 491520, "anon_pages": 1000,
                     "file_pages": 8455, "code_pages": 120}}
    resident_bytes:
      description: Resident bytes seen in numa_maps.
      type: int
      sample: 39219200
    without_memory:
      description: Why the process has no memory of its own to audit (a kernel thread, a zombie), or null.
      type: str
      sample: "PID 2 (kthreadd) is a kernel thread (PF_KTHREAD in /proc/2/stat): it has no memory of its own;
        give the PID of the service's process"
    local_percent:
      description: Share of the selected pages on the plan's memory nodes (with a plan).
      type: float
      sample: 99.98
    anon_local_percent:
      description: Same for anonymous pages only (with a plan).
      type: float
      sample: 100.0
    file_local_percent:
      description: Same for file-backed data pages only (with a plan).
      type: float
      sample: 99.97
    code_local_percent:
      description: Same for program and library code (with a plan; never enforced).
      type: float
      sample: 3.1
nodes:
  description: Totals over all processes, per node id, with the keys of C(processes[].nodes).
  returned: with O(unit) or O(pids)
  type: dict
  sample: {"0": {"anon_bytes": 0, "file_bytes": 8192, "code_bytes": 0, "anon_pages": 0, "file_pages": 2,
                 "code_pages": 0},
           "1": {"anon_bytes": 4096000, "file_bytes": 34631680, "code_bytes": 491520, "anon_pages": 1000,
                 "file_pages": 8455, "code_pages": 120}}
resident_bytes:
  description: Total resident bytes of all processes.
  returned: with O(unit) or O(pids)
  type: int
  sample: 39219200
local_percent:
  description: Share of the selected pages (O(pages)) on the plan's memory nodes; null without a plan or memory.
    This is the number O(min_local_percent) is compared with.
  returned: with O(unit) or O(pids)
  type: float
  sample: 99.98
remote_percent:
  description: 100 - local_percent; null without a plan or memory.
  returned: with O(unit) or O(pids)
  type: float
  sample: 0.02
anon_local_percent:
  description: Local share of anonymous pages; null without a plan or such pages.
  returned: with O(unit) or O(pids)
  type: float
  sample: 100.0
file_local_percent:
  description: Local share of file-backed data pages; null without a plan or such pages.
  returned: with O(unit) or O(pids)
  type: float
  sample: 99.97
code_local_percent:
  description: Local share of program and library code (reported, never enforced).
  returned: with O(unit) or O(pids)
  type: float
  sample: 3.1
interleave_percent:
  description: For interleave plans, the share of each node of the interleave set in the memory on that set.
  returned: with O(unit) or O(pids)
  type: dict
  sample: {"0": 50.1, "1": 49.9}
interleave_weight_percent:
  description:
    - For weighted-interleave plans, each node's share of the kernel's weights (what RV(interleave_percent) should
      be); the audit fails when a node is more than 10 percentage points off it. Null for other plans.
  returned: with O(unit) or O(pids)
  type: dict
  sample: {"0": 40.0, "1": 40.0, "4": 20.0}
expected_mem_nodes:
  description: The plan's memory nodes.
  returned: with O(unit) or O(pids)
  type: list
  elements: int
  sample: [1]
expected_cpus:
  description: The plan's CPUs as a list string.
  returned: with O(unit) or O(pids)
  type: str
  sample: 28-55,84-111
policy:
  description: The plan's memory policy.
  returned: with O(unit) or O(pids)
  type: str
  sample: bind
pages:
  description: The O(pages) selection used for local_percent.
  returned: with O(unit) or O(pids)
  type: str
  sample: all
min_local_percent:
  description: The threshold used.
  returned: with O(unit) or O(pids)
  type: float
  sample: 99.0
"""

from typing import Optional

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.act.device_irqs import audit_interrupts
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import judging
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.audit import (
    UnitAudit, audit_pids, audit_unit, audit_units, load_plan)
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch.metrics import read_records
from ansible_collections.inferops.numa.plugins.module_utils.numa.watch.table import placement_table
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec


def _given_plan(module: AnsibleModule):
    if module.params["plan"] is not None:
        return module.params["plan"]
    path = module.params["plan_file"]
    return None if path is None else load_plan(path)


def _run(module: AnsibleModule):
    def run(argv):
        return module.run_command(argv)
    return run


def _audit_units(module: AnsibleModule):
    """Every entry of units, waited for together; a unit that cannot be read is a failed report."""
    params = module.params
    names = [entry["unit"] for entry in params["units"]]
    twice = sorted(set(name for name in names if names.count(name) > 1))
    if twice:
        module.fail_json(msg="units lists %s more than once: give each unit one entry" % ", ".join(twice))
    audits, reports = [], {}
    for entry in params["units"]:
        try:
            plan = None if entry["plan_file"] is None else load_plan(entry["plan_file"])
        except NumaError as exc:
            reports[entry["unit"]] = {"unit": entry["unit"], "ok": False, "msg": str(exc), "warnings": []}
            continue
        audits.append(UnitAudit(entry["unit"], plan, entry["min_local_percent"], entry["pages"]))
    _report_units(module, audits, reports, names)


def _audit_deployed(module: AnsibleModule):
    """Every instance recorded in plan_dir, judged as its service was deployed (as the metrics read them)."""
    warnings = []  # type: list
    records = [record for record in read_records(module.params["plan_dir"], warnings) if record["settings"]["audit"]]
    for warning in warnings:
        module.warn(warning)
    if not records:
        module.exit_json(changed=False, ok=True, units=[], table=[],
                         msg="no instance to audit: none recorded in %s" % module.params["plan_dir"])
    audits = [UnitAudit(record["unit"], record["plan"], record["settings"]["min_local_percent"],
                        record["settings"]["pages"]) for record in records]
    _report_units(module, audits, {}, [audit.unit for audit in audits], records)


def _report_units(module: AnsibleModule, audits: list, reports: dict, names: list, records: Optional[list] = None):
    """Audit ``audits`` together and report each of ``names`` (those in ``reports`` failed before) in order; with
    the plan ``records`` they were read from, the placement table as well."""
    params = module.params
    try:
        audited = audit_units(params["root"], audits, params["wait_seconds"], params["settle_seconds"],
                              run=_run(module))
    except NumaError as exc:
        module.fail_json(msg=str(exc))
    plans = {audit.unit: audit.plan for audit in audits}
    for report in audited:
        reports[report["unit"]] = audit_interrupts(report, params["root"], plans.get(report["unit"]))
    ordered = [reports[name] for name in names]
    for report in ordered:
        for warning in report.pop("warnings", []):
            module.warn(warning)
    failed = [report["msg"] for report in ordered if not report["ok"]]
    result = {"ok": not failed, "units": ordered,
              "msg": "; ".join(failed) if failed else "%d unit(s) audited, all ok" % len(ordered)}
    if records is not None:
        result["table"] = placement_table(
            {"instance": record["unit"][:-len(".service")], "plan": dict(record["plan"], **record["listed"]),
             "audit": reports[record["unit"]],
             "tokens_per_second": record["tokens_per_second"]} for record in records)
    if failed:
        module.fail_json(**result)
    module.exit_json(changed=False, **result)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str"},
            "pids": {"type": "list", "elements": "int"},
            "units": {"type": "list", "elements": "dict", "options": {
                "unit": {"type": "str", "required": True},
                "plan_file": {"type": "path"},
                **judging.argument_spec(),
            }},
            "plan_dir": {"type": "path"},
            "plan": {"type": "dict"},
            "plan_file": {"type": "path"},
            **judging.argument_spec(),
            "wait_seconds": {"type": "int", "default": 60},
            "settle_seconds": {"type": "float", "default": 3.0},
            **host_root_argument_spec(),
        },
        mutually_exclusive=[("unit", "pids", "units", "plan_dir"), ("plan", "plan_file"), ("units", "plan"),
                            ("units", "plan_file"), ("plan_dir", "plan"), ("plan_dir", "plan_file")],
        required_one_of=[("unit", "pids", "units", "plan_dir")],
        supports_check_mode=True,
    )
    params = module.params
    if params["units"]:
        _audit_units(module)
    if params["plan_dir"]:
        _audit_deployed(module)
    try:
        plan = _given_plan(module)
        if params["unit"]:
            report = audit_unit(params["root"], params["unit"], plan, params["min_local_percent"], params["pages"],
                                params["wait_seconds"], params["settle_seconds"], run=_run(module))
        else:
            report = audit_pids(params["root"], params["pids"], plan, params["min_local_percent"], params["pages"])
        report = audit_interrupts(report, params["root"], plan)
    except NumaError as exc:
        module.fail_json(msg=str(exc))
    for warning in report.pop("warnings", []):
        module.warn(warning)
    if not report["ok"]:
        module.fail_json(**report)
    module.exit_json(changed=False, **report)


if __name__ == "__main__":
    main()
