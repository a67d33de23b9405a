#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_rollout
short_description: Start and restart a host's inference instances in batches, each gated on readiness and its audit
version_added: "0.4.0"
description:
  - Starts the instances that are not running and restarts those whose unit or plan changed, O(batch) at a time.
    The next batch waits until each instance of this one answers its readiness probe and, where asked, passes its
    audit; so a placement change never takes all of a host's instances down together.
  - "Readiness: HTTP 200 from O(instances[].health_url), else from the engine's health endpoint on the instance's
    port (C(/health) for llama.cpp, vLLM, SGLang and TensorRT-LLM); a C(generic) server is ready when its port
    accepts a connection, one without a port when systemd reports it active."
  - An instance that does not become ready within O(ready_seconds), whose unit fails, or whose audit fails goes
    back to its previous unit and plan (each file of O(instances[].kept) has a C(.previous) copy the
    inference_service role wrote before changing it) and restarts on them; with nothing kept it is stopped. The
    module then fails with the reason and starts no further batch.
  - The inference_service role runs it for every deployed instance.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
options:
  instances:
    description: The host's instances, in the order to go through them.
    type: list
    elements: dict
    required: true
    suboptions:
      unit:
        description: The instance's unit, such as C(llama@0.service).
        type: str
        required: true
      restart:
        description: Restart it (its unit or plan changed); otherwise it is started only when not active.
        type: bool
        default: false
      engine:
        description: The engine recipe, for its health endpoint.
        type: str
        default: generic
      port:
        description: The port the instance serves on.
        type: int
      health_url:
        description: The readiness URL, C({port}) replaced by O(instances[].port); default the engine's.
        type: str
      audit:
        description: Audit the instance once ready (as M(inferops.numa.numa_audit)); omit for no audit.
        type: dict
        suboptions:
          plan_file:
            description: Its deploy-time plan.
            type: path
          min_local_percent:
            description: Lowest local share of a bound instance's pages.
            type: float
            default: 99
          pages:
            description: Pages the local share counts.
            type: str
            default: all
            choices: [all, anon, file]
      kept:
        description: Files changed for this instance whose C(<file>.previous) a rollback puts back.
        type: list
        elements: path
        default: []
  batch:
    description: Instances started or restarted at a time.
    type: int
    default: 1
  ready_seconds:
    description: How long an instance may take to answer (its model load included).
    type: int
    default: 600
  settle_seconds:
    description: How long the memory of an audited instance must hold still before its audit.
    type: float
    default: 3
attributes:
  check_mode:
    support: full
    details: Reports what would be started or restarted.
  diff_mode:
    support: none
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Restart the changed instances one at a time, each gated on /health and its audit
  inferops.numa.numa_rollout:
    batch: 1
    instances:
      - unit: llama@0.service
        restart: true
        engine: llama.cpp
        port: 8080
        audit: {plan_file: /etc/inferops-numa/llama@0.plan.json}
        kept: [/etc/systemd/system/llama@.service, /etc/inferops-numa/llama@0.plan.json]
      - unit: llama@1.service
        engine: llama.cpp
        port: 8081
"""

RETURN = r"""
instances:
  description: What was done to each instance that needed it, in order.
  returned: always
  type: list
  elements: dict
  sample: [{"unit": "llama@0.service", "action": "restart", "ok": true, "msg": "restarted and ready",
            "rolled_back": null}]
msg:
  description: A summary, or each failed instance with its reason and what its rollback did.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.act.rollout import Instance, roll
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.engines import health_url
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.audit import UnitAudit, load_plan

AUDIT_OPTIONS = {"plan_file": {"type": "path"}, "min_local_percent": {"type": "float", "default": 99.0},
                 "pages": {"type": "str", "default": "all", "choices": ["all", "anon", "file"]}}
INSTANCE_OPTIONS = {
    "unit": {"type": "str", "required": True}, "restart": {"type": "bool", "default": False},
    "engine": {"type": "str", "default": "generic"}, "port": {"type": "int"}, "health_url": {"type": "str"},
    "audit": {"type": "dict", "options": AUDIT_OPTIONS}, "kept": {"type": "list", "elements": "path", "default": []},
}


def _instance(entry: dict) -> Instance:
    audit = entry["audit"]
    return Instance(entry["unit"], entry["restart"], health_url(entry["engine"], entry["port"], entry["health_url"]),
                    entry["port"], None if audit is None else UnitAudit(
                        entry["unit"], None if audit["plan_file"] is None else load_plan(audit["plan_file"]),
                        audit["min_local_percent"], audit["pages"]),
                    tuple(entry["kept"]))


def main() -> None:
    module = AnsibleModule(
        argument_spec={"instances": {"type": "list", "elements": "dict", "required": True,
                                     "options": INSTANCE_OPTIONS},
                       "batch": {"type": "int", "default": 1}, "ready_seconds": {"type": "int", "default": 600},
                       "settle_seconds": {"type": "float", "default": 3.0}, "root": {"type": "path", "default": "/"}},
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = roll([_instance(entry) for entry in params["instances"]], params["batch"], params["ready_seconds"],
                      module.run_command, params["root"], module.check_mode, params["settle_seconds"])
    except NumaError as exc:
        module.fail_json(msg=str(exc), instances=[])
    if result.pop("failed"):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
