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
  - When an instance does not become ready within O(ready_seconds), its unit fails, or its audit fails, the host's
    whole change goes back - every file of O(instances[].kept) gets the C(.previous) copy the inference_service role
    wrote before changing it (a unit template is shared by all the instances of a service), the instances already
    restarted restart on them, and one with nothing kept (its first deployment) is stopped. The module then fails
    with the reason and starts no further batch.
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
      first_deployment:
        description:
          - Nothing of this instance was deployed before. With O(instances[].ab_gate) its baseline is then the same
            server started once without placement (the Linux default, through a runtime drop-in in
            C(/run/systemd/system) removed once measured), so the gate measures what binding gains on this host;
            the binding is kept either way, as there is no placement of ours to go back to.
        type: bool
        default: false
      ab_gate:
        description:
          - Keep a restart's new placement only where it measurably helps. Before the restart the running instance's
            tokens per second are measured with real requests to its own API (the same prompt and token count
            each round, one warm-up round left out), and again once it is ready and audited; the new placement is
            kept when its median is not slower than the rounds' noise band (half their spread around the median,
            the wider of before and after), or gains at least O(instances[].ab_gate.min_gain_percent). Otherwise
            the host's change goes back the same way, and the module says so without failing.
          - Needs O(instances[].port). Omit for no gate.
        type: dict
        suboptions:
          rounds:
            description: Measured requests before and after (besides one warm-up each), 1 to 50.
            type: int
            default: 5
          max_rounds:
            description: The rounds may grow to this many (up to 200) while their spread is too wide to judge.
            type: int
            default: 15
          prompt:
            description: The prompt of every request.
            type: str
            default: Hello
          max_tokens:
            description: Tokens generated per request (C(ignore_eos), so each round generates them all).
            type: int
            default: 16
          min_gain_percent:
            description:
              - Keep the change only with at least this gain (a finite number from -100 to 1000); default, keep it
                unless slower than the noise band.
            type: float
          max_noise_percent:
            description:
              - The widest the noise band may be (0.5 to 50); a loss beyond it is rolled back however noisy the
                rounds were.
            type: float
            default: 5.0
          api:
            description:
              - C(llama.cpp) asks C(/completion) and reads the server's own decode rate; C(openai) asks
                C(/v1/completions) (vLLM, SGLang, TensorRT-LLM) and times it. C(auto) picks by O(instances[].engine).
            type: str
            default: auto
            choices: [auto, llama.cpp, openai]
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
ansible_facts:
  description: The A/B gates' verdicts.
  returned: always
  type: dict
  contains:
    numa_ab_gates:
      description:
        - Unit to its gate's verdict (before and after medians, gain, noise band, kept or rolled back).
        - A first deployment's verdict has C(baseline=unbound) (before is the server started once without placement)
          and is always kept.
      type: dict
      sample: {"llama@0.service": {"before_tokens_per_second": 8.3, "after_tokens_per_second": 13.7,
               "gain_percent": 65.06, "noise_percent": 1.2, "rounds": 3, "kept": true}}
"""

from typing import Optional

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.act.ab_gate import REQUEST_SECONDS, Gate, gate_from
from ansible_collections.inferops.numa.plugins.module_utils.numa.act.rollout import Instance, roll
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.engines import health_url
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import gate, judging
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.audit import UnitAudit, load_plan

AUDIT_OPTIONS = {"plan_file": {"type": "path"}, **judging.argument_spec()}
INSTANCE_OPTIONS = {
    "unit": {"type": "str", "required": True}, "restart": {"type": "bool", "default": False},
    "engine": {"type": "str", "default": "generic"}, "port": {"type": "int"}, "health_url": {"type": "str"},
    "audit": {"type": "dict", "options": AUDIT_OPTIONS}, "kept": {"type": "list", "elements": "path", "default": []},
    "ab_gate": {"type": "dict", "options": gate.argument_spec()}, "first_deployment": {"type": "bool", "default": False},
}


def _instance(entry: dict, check: bool) -> Instance:
    audit = entry["audit"]
    # A dry run audits nothing, and on a fresh host the plan it would audit against was not written.
    return Instance(entry["unit"], entry["restart"], health_url(entry["engine"], entry["port"], entry["health_url"]),
                    entry["port"], None if audit is None or check else UnitAudit(
                        entry["unit"], None if audit["plan_file"] is None else load_plan(audit["plan_file"]),
                        audit["min_local_percent"], audit["pages"]),
                    tuple(entry["kept"]), _gate(entry), entry["first_deployment"])


def _gate(entry: dict) -> Optional[Gate]:
    if entry["ab_gate"] is None:
        return None
    try:
        return gate_from(entry["ab_gate"], entry["port"], entry["engine"], REQUEST_SECONDS)
    except NumaError as exc:
        raise NumaError("%s: %s" % (entry["unit"], exc)) from None


# Not a file: the diff of what systemd was (or would be) asked to do, so its header names no path.
ROLLOUT_DIFF_HEADER = "systemd units, started or restarted"


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
        result = roll([_instance(entry, module.check_mode) for entry in params["instances"]], params["batch"], params["ready_seconds"],
                      module.run_command, params["root"], module.check_mode, params["settle_seconds"])
    except NumaError as exc:
        module.fail_json(msg=str(exc), instances=[])
    result["ansible_facts"] = {"numa_ab_gates": {entry["unit"]: entry["ab_gate"] for entry in result["instances"]
                                                 if entry["ab_gate"]}}
    if module._diff and result["instances"]:
        # With --diff, what was (or in check mode would be) started and restarted, one line each.
        result["diff"] = {"before_header": ROLLOUT_DIFF_HEADER, "after_header": ROLLOUT_DIFF_HEADER, "before": "",
                          "after": "".join("%s\n" % entry["msg"] for entry in result["instances"])}
    if result.pop("failed"):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
