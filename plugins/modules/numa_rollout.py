#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_rollout
short_description: Deploy a host's inference services as one change that is judged, taken back, or retried
version_added: "1.0.0"
description:
  - Writes the files of a host's services (unit templates, plan records, systemd placement drop-ins, audit
    records) and starts or restarts the instances they change, O(batch) at a time. The next batch waits until
    each instance of this one answers its readiness probe and, where asked, passes its audit and its A/B gate; so
    a placement change never takes all of a host's instances down together.
  - "Readiness: HTTP 200 from O(services[].instances[].health_url), else from the engine's health endpoint on the
    instance's port (C(/health) for llama.cpp, vLLM, SGLang and TensorRT-LLM); a C(generic) server is ready when
    its port accepts a connection, one without a port when systemd reports it active. Each probe has a deadline of
    its own. A unit that fails, exits, or that systemd restarts while it is waited for (a crash loop under
    C(Restart=)) fails at once, with the last lines of its journal."
  - Before writing anything it records the previous text of every file it writes in
    O(record_dir)/C(rollout.pending.json); the record goes only once the host is on a judged placement. When an
    instance is not ready within O(ready_seconds), fails its audit, cannot be measured or is measured slower, the
    whole change is taken back - the files get their previous text, systemd reloads, the instances already
    restarted restart on them, first deployments are stopped - each step tried whatever the others did. A host
    where a step of that failed keeps the record, and the next run takes the change back before it deploys again.
  - A change an A/B gate measured slower, taken back completely, is kept in O(record_dir)/C(<service>.rejected.json)
    and not tried again while the service wants exactly those files; the verdicts are merged into
    O(record_dir)/C(ab-gates.json).
  - "Traffic hooks: an instance with O(services[].instances[].drain_command) is drained before it is stopped or
    restarted, and with O(services[].instances[].undrain_command) undrained once it passed its gates, one batch at a
    time: drain, restart, gates, undrain. A rollback's stops and restarts are wrapped the same way. A check runs no
    hook."
  - The inference_service role runs it once per host for all its services.
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
options:
  services:
    description: The host's services, each with its files and instances.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The service's unit prefix, such as C(llama); names its rejected record.
        type: str
        required: true
      files:
        description: The files the service wants, each by absolute path.
        type: list
        elements: dict
        default: []
        suboptions:
          path:
            description: The file's absolute path.
            type: path
            required: true
          content:
            description: The text it must hold (with O(services[].files[].state=present)).
            type: str
            default: ""
          state:
            description: C(absent) for a file that must not be there (a placement drop-in left from another pin mode).
            type: str
            default: present
            choices: [present, absent]
          systemd:
            description: systemd reads this file (a unit or drop-in), so a change to it needs a C(daemon-reload).
            type: bool
            default: false
      instances:
        description: The service's instances, in the order to go through them.
        type: list
        elements: dict
        default: []
        suboptions:
          unit:
            description: The instance's unit, such as C(llama@0.service).
            type: str
            required: true
          record:
            description:
              - Its plan record, one of O(services[].files); an instance without one on the host is deployed for
                the first time. The audit judges the instance against it.
            type: path
            required: true
          files:
            description: The files its process starts from (its unit, drop-in and plan record); a change to one restarts it.
            type: list
            elements: path
            default: []
          engine:
            description: The engine recipe, for its health endpoint and the A/B gate's C(auto) api.
            type: str
            default: generic
            choices: [generic, llama.cpp, vllm, sglang, trtllm]
          port:
            description: The port the instance serves on.
            type: int
          health_url:
            description: The readiness URL, C({port}) replaced by the instance's port; default the engine's.
            type: str
          drain_command:
            description:
              - The argv (no shell) that takes the instance out of its load balancer, run before it is stopped or
                restarted (by the rollout or its rollback), its tokens already filled; empty for none.
              - A failure (an exit code other than 0, or no exit within O(services[].instances[].hook_seconds)) stops
                the rollout before the instance is touched, and the change is taken back.
            type: list
            elements: str
            default: []
          undrain_command:
            description:
              - The argv (no shell) that puts the instance back into its load balancer once it passed its gates
                (readiness, audit, A/B gate), and after a rollback's restart once ready; empty for none.
              - A failure fails the instance (the change is taken back); an instance left running without traffic
                is recorded in O(record_dir)/C(rollout.undrain.json), and the next run undrains it before it
                deploys.
            type: list
            elements: str
            default: []
          hook_seconds:
            description: How long each drain or undrain command may run before it is killed and counted failed.
            type: float
            default: 60
          drain_seconds:
            description: Seconds to wait after a drain before the stop or restart, for requests in flight to finish.
            type: float
            default: 0
          audit:
            description: Audit the instance once ready (as M(inferops.numa.numa_audit)); omit for no audit.
            type: dict
            suboptions:
              min_local_percent:
                description: Lowest local share of a bound instance's pages.
                type: float
                default: 99
              pages:
                description: Pages the local share counts.
                type: str
                default: all
                choices: [all, anon, file]
          ab_gate:
            description:
              - Keep a restart's new placement only where it measurably helps. Before the restart the running
                instance's tokens per second are measured with real requests to its own API (the same prompt and
                token count each round, one warm-up round left out), and again once it is ready and audited; the
                change is kept unless the median got slower than the rounds' noise band (see the inference_service
                role's README), or gains less than O(services[].instances[].ab_gate.min_gain_percent). Otherwise the
                host's change is taken back, and the module says so without failing.
              - An answer that is not a finite rate, or none within the deadline, is "not measured" - before the
                restart the instance is left as it runs, after it the change is taken back - and fails the host.
              - On an instance's first deployment the baseline is the same server started once without placement
                (the Linux default, through a runtime drop-in in C(/run/systemd/system) removed once measured); the
                binding is kept either way.
              - Needs O(services[].instances[].port). Omit for no gate.
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
                  - Keep the change only with at least this gain (a finite number from -100 to 1000); default, keep
                    it unless slower than the noise band.
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
                    C(/v1/completions) (vLLM, SGLang, TensorRT-LLM) and times it. C(auto) picks by the engine.
                type: str
                default: auto
                choices: [auto, llama.cpp, openai]
  record_dir:
    description:
      - The plan directory, where the record of a change not judged yet, the instances left without traffic, the
        rejected changes and the gates' verdicts are kept.
    type: path
    default: /etc/inferops-numa
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
    details: Reports the files it would write and the instances it would start or restart; runs no hook.
  diff_mode:
    support: full
    details: Each file written (headed by its path), and one line per instance started or restarted.
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Deploy llama, restarting changed instances one at a time, each gated on /health and its audit
  inferops.numa.numa_rollout:
    batch: 1
    services:
      - name: llama
        files:
          - {path: /etc/systemd/system/llama@.service, content: "{{ unit_text }}", systemd: true}
          - {path: /etc/inferops-numa/llama@0.plan.json, content: "{{ plan0 | to_nice_json }}\n"}
          - {path: /etc/systemd/system/llama@0.service.d/50-inferops-numa.conf, state: absent, systemd: true}
        instances:
          - unit: llama@0.service
            record: /etc/inferops-numa/llama@0.plan.json
            files: [/etc/systemd/system/llama@.service, /etc/inferops-numa/llama@0.plan.json,
                    /etc/systemd/system/llama@0.service.d/50-inferops-numa.conf]
            engine: llama.cpp
            port: 8080
            audit: {min_local_percent: 99}
            # Out of haproxy's backend before its restart, back once ready and audited.
            drain_command: [/usr/local/bin/haproxy-state, llm/llama@0.service, drain]
            undrain_command: [/usr/local/bin/haproxy-state, llm/llama@0.service, ready]
            drain_seconds: 10
"""

RETURN = r"""
instances:
  description:
    - What was done to each instance that needed it, in order; C(seconds) is how long it took to be ready (or to
      fail its readiness).
  returned: always
  type: list
  elements: dict
  sample: [{"unit": "llama@0.service", "action": "restart", "ok": true, "msg": "restarted and ready",
            "rolled_back": null, "ab_gate": null, "seconds": 12.5}]
services:
  description: Per service, the files written (or that would be) and whether its change was held as one an A/B gate rolled back before.
  returned: always
  type: dict
  sample: {"llama": {"written": ["/etc/inferops-numa/llama@0.plan.json"], "held": false}}
msg:
  description: A summary, or each failed instance with its reason and what the rollback did.
  returned: always
  type: str
ansible_facts:
  description: The A/B gates' verdicts of this run.
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
               "gain_percent": 65.06, "noise_percent": 1.2, "rounds": 5, "kept": true}}
"""

import json
import os
from typing import Any, Dict, List, Optional

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.measure.ab_gate import Gate, gate_from
from ansible_collections.inferops.numa.plugins.module_utils.numa.act.hooks import hooks_from
from ansible_collections.inferops.numa.plugins.module_utils.numa.act.rollout import Deployment, Host, Instance, Options, deploy
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.engines import ENGINES, GENERIC, health_url
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError, shown
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.records import PENDING
from ansible_collections.inferops.numa.plugins.module_utils.numa.decide.rollout import HOOK_SECONDS, Service
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import gate, judging
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.audit import UnitAudit
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec

FILE_OPTIONS = {"path": {"type": "path", "required": True}, "content": {"type": "str", "default": ""},
                "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
                "systemd": {"type": "bool", "default": False}}
INSTANCE_OPTIONS = {
    "unit": {"type": "str", "required": True}, "record": {"type": "path", "required": True},
    "files": {"type": "list", "elements": "path", "default": []},
    "engine": {"type": "str", "default": GENERIC, "choices": list(ENGINES)},
    "port": {"type": "int"}, "health_url": {"type": "str"},
    "drain_command": {"type": "list", "elements": "str", "default": []},
    "undrain_command": {"type": "list", "elements": "str", "default": []},
    "hook_seconds": {"type": "float", "default": HOOK_SECONDS}, "drain_seconds": {"type": "float", "default": 0.0},
    "audit": {"type": "dict", "options": judging.argument_spec()},
    "ab_gate": {"type": "dict", "options": gate.argument_spec()},
}
SERVICE_OPTIONS = {"name": {"type": "str", "required": True},
                   "files": {"type": "list", "elements": "dict", "default": [], "options": FILE_OPTIONS},
                   "instances": {"type": "list", "elements": "dict", "default": [], "options": INSTANCE_OPTIONS}}
# Not a file: the diff of what systemd was (or would be) asked to do, so its header names no path.
ROLLOUT_DIFF_HEADER = "systemd units, started or restarted"


def _deployment(entry: Dict[str, Any], check: bool, request_seconds: float) -> Deployment:
    files = {item["path"]: item["content"] if item["state"] == "present" else None for item in entry["files"]}
    for instance in entry["instances"]:
        unknown = [path for path in instance["files"] + [instance["record"]] if path not in files]
        if unknown or files[instance["record"]] is None:
            raise NumaError("%s: its record and files must be among the service's present files (%s is not); give "
                            "each in services[].files" % (instance["unit"], shown((unknown or [instance["record"]])[0])))
    wanted = Service(entry["name"], files, {item["unit"]: tuple(item["files"]) for item in entry["instances"]},
                     {item["unit"]: item["record"] for item in entry["instances"]},
                     any(item["ab_gate"] is not None for item in entry["instances"]),
                     frozenset(item["path"] for item in entry["files"] if item["systemd"]))
    return Deployment(wanted, tuple(_instance(item, files[item["record"]], check, request_seconds)
                                    for item in entry["instances"]))


def _instance(entry: Dict[str, Any], record: str, check: bool, request_seconds: float) -> Instance:
    audit = entry["audit"]
    try:
        hooks = hooks_from(entry["drain_command"], entry["undrain_command"], entry["hook_seconds"],
                           entry["drain_seconds"])
    except NumaError as exc:
        raise NumaError("%s: %s" % (entry["unit"], exc)) from None
    # A dry run audits nothing.
    return Instance(entry["unit"], health_url(entry["engine"], entry["port"], entry["health_url"]), entry["port"],
                    None if audit is None or check else UnitAudit(entry["unit"], _plan(entry["unit"], record),
                                                                  audit["min_local_percent"], audit["pages"]),
                    _gate(entry, request_seconds), hooks)


def _plan(unit: str, record: str) -> Dict[str, Any]:
    try:
        plan = json.loads(record)
    except ValueError:
        plan = None
    if not isinstance(plan, dict):
        raise NumaError("%s: its plan record is not a JSON object; give the record numa_plan returns" % unit)
    return plan


def _gate(entry: Dict[str, Any], request_seconds: float) -> Optional[Gate]:
    if entry["ab_gate"] is None:
        return None
    try:
        return gate_from(entry["ab_gate"], entry["port"], entry["engine"], request_seconds)
    except NumaError as exc:
        raise NumaError("%s: %s" % (entry["unit"], exc)) from None


def _diffs(result: Dict[str, Any]) -> List[Dict[str, str]]:
    """Each file written (or that would be), headed by its path, then the instances (re)started."""
    diffs = [{"before_header": path, "after_header": path, "before": before or "", "after": after or ""}
             for path, before, after in result["diffs"]]
    if result["instances"]:
        diffs.append({"before_header": ROLLOUT_DIFF_HEADER, "after_header": ROLLOUT_DIFF_HEADER, "before": "",
                      "after": "".join("%s\n" % entry["msg"] for entry in result["instances"])})
    return diffs


def main() -> None:
    module = AnsibleModule(
        argument_spec={"services": {"type": "list", "elements": "dict", "required": True, "options": SERVICE_OPTIONS},
                       "record_dir": {"type": "path", "default": "/etc/inferops-numa"},
                       "batch": {"type": "int", "default": 1}, "ready_seconds": {"type": "int", "default": 600},
                       "settle_seconds": {"type": "float", "default": 3.0}, **host_root_argument_spec()},
        supports_check_mode=True,
    )
    params = module.params
    options = Options(params["record_dir"], params["batch"], params["ready_seconds"], params["settle_seconds"],
                      params["root"])
    try:
        # A request of the A/B gate may take as long as an instance may take to answer.
        deployments = [_deployment(entry, module.check_mode, params["ready_seconds"]) for entry in params["services"]]
        result = deploy(deployments, options, Host(module.run_command), module.check_mode)
    except NumaError as exc:
        module.fail_json(msg=str(exc), instances=[])
    except Exception as exc:  # pylint: disable=broad-except  # whatever it was, the host is not left unsaid
        module.fail_json(msg="numa_rollout stopped on an unexpected error (%s: %s); if it had begun to change the "
                             "host, the host is marked for retry (%s) and the next run takes the change back before "
                             "it deploys; please report this error"
                             % (type(exc).__name__, shown(str(exc)), os.path.join(options.record_dir, PENDING)),
                         instances=[])
    for warning in result.pop("warnings"):
        module.warn(warning)
    result["ansible_facts"] = {"numa_ab_gates": {entry["unit"]: entry["ab_gate"] for entry in result["instances"]
                                                 if entry["ab_gate"]}}
    diffs = _diffs(result)
    del result["diffs"]
    if module._diff and diffs:
        result["diff"] = diffs
    if result.pop("failed"):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
