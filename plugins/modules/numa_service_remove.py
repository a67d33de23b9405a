#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: numa_service_remove
short_description: Take inference services back from a host, and keep what that needs to know
version_added: "1.0.0"
description:
  - Takes each service of O(remove) back completely - its instances (each found by a plan record or a drop-in
    directory) stopped and disabled, its unit template C(<name>@.service), its placement drop-ins (and their
    directories once empty), every record of it in O(record_dir) and its A/B verdicts - then what the
    inference_service role made for it and recorded in O(record_dir)/C(<name>.created.json) when it made it (the
    state directory with the page-cache replicas in it, the user, the group), then that record; systemd reloads once.
    An account or directory the role found on the host is in no record, and is never removed; an account another
    of its services still runs as (its unit template's C(User=), C(Group=)) is handed to that service's record.
  - With O(created), records instead what the role has just made for one service, merged into its created record.
  - Warns, one line each, about every service O(record_dir) holds records of that is in neither O(keep) nor
    O(remove), naming the variable that takes it back.
  - No link is followed under the plan, unit and state directories; a created record that cannot be trusted is not
    acted on (the service is left as it is, and the task fails naming the record and the fix).
author:
  - inferops.numa contributors (@inferops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - inferops.numa.host_root
options:
  remove:
    description: The services to take back, by unit prefix (C(llama) for C(llama@.service)).
    type: list
    elements: str
    default: []
  keep:
    description: The services the inventory deploys here; others found in O(record_dir) are warned about.
    type: list
    elements: str
    default: []
  created:
    description: What the role made for one service in this run, to record (nothing is removed then).
    type: dict
    suboptions:
      service:
        description: The service's unit prefix.
        type: str
        required: true
      user:
        description: The user the role created.
        type: str
      group:
        description: The group the role created.
        type: str
      state_directory:
        description:
          - The state directory systemd makes for the service at its first start (C(/var/lib/<name>)); recorded only
            while it is not there yet, so one that was there before is never removed.
        type: str
  drains:
    description:
      - The traffic hooks of services in O(remove). Each running instance is taken out of its load balancer (the
        drain command, its tokens C({service}), C({unit}), C({instance}), C({port}) filled as a rollout fills them,
        C({port}) from the instance's plan record) before it is stopped, then O(drains[].drain_seconds) pass once.
      - A drain that fails stops the removal of that service before any of its instances is stopped.
    type: list
    elements: dict
    default: []
    suboptions:
      service:
        description: The service, as in O(remove).
        type: str
        required: true
      drain_command:
        description: The drain command, an argv list run without a shell.
        type: list
        elements: str
        default: []
      hook_seconds:
        description: The drain command's deadline; past it the command and its children are killed.
        type: float
        default: 60
      drain_seconds:
        description: Seconds to wait after the drains, for requests in flight.
        type: float
        default: 0
  record_dir:
    description: The plan directory.
    type: path
    default: /etc/inferops-numa
  unit_dir:
    description: Where the unit templates and drop-in directories are.
    type: path
    default: /etc/systemd/system
attributes:
  check_mode:
    support: full
    details: Says what it would stop and remove.
  diff_mode:
    support: none
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Take llama back, warn about any other service deployed here that the inventory does not list
  inferops.numa.numa_service_remove:
    remove: [llama]
    keep: [mistral]
"""

RETURN = r"""
removed:
  description: Per service taken back, what was done (or would be, in check mode), in order.
  returned: always
  type: dict
  sample: {"llama": ["stopped and disabled llama@0.service", "removed /etc/systemd/system/llama@.service",
                     "removed user llama"]}
orphans:
  description: The services deployed here that are in neither O(keep) nor O(remove).
  returned: always
  type: list
  elements: str
msg:
  description: A summary, or every step that failed.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import removal
from ansible_collections.inferops.numa.plugins.module_utils.numa.act.hooks import hooks_from
from ansible_collections.inferops.numa.plugins.module_utils.numa.act.rollout import Host
from ansible_collections.inferops.numa.plugins.module_utils.numa.act.unit_text import unit_prefix
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import host_root_argument_spec

CREATED_OPTIONS = {"service": {"type": "str", "required": True}, "user": {"type": "str"}, "group": {"type": "str"},
                   "state_directory": {"type": "str"}}
DRAIN_OPTIONS = {"service": {"type": "str", "required": True},
                 "drain_command": {"type": "list", "elements": "str", "default": []},
                 "hook_seconds": {"type": "float", "default": 60}, "drain_seconds": {"type": "float", "default": 0}}


def main() -> None:
    module = AnsibleModule(
        argument_spec={"remove": {"type": "list", "elements": "str", "default": []},
                       "keep": {"type": "list", "elements": "str", "default": []},
                       "created": {"type": "dict", "options": CREATED_OPTIONS},
                       "drains": {"type": "list", "elements": "dict", "options": DRAIN_OPTIONS, "default": []},
                       "record_dir": {"type": "path", "default": "/etc/inferops-numa"},
                       "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
                       **host_root_argument_spec()},
        supports_check_mode=True,
    )
    params = module.params
    try:
        drains = {unit_prefix(drain["service"]): hooks_from(drain["drain_command"], None, drain["hook_seconds"],
                                                            drain["drain_seconds"]) for drain in params["drains"]}
        options = removal.Options(params["record_dir"], params["unit_dir"], params["root"], drains)
        if params["created"]:
            made = dict(params["created"])
            changed = removal.record_created(options.record_dir, made.pop("service"), made, options.root,
                                             module.check_mode)
            module.exit_json(changed=changed, removed={}, orphans=[], msg="recorded" if changed else "as recorded")
        orphans = removal.orphans(options.record_dir, params["keep"], params["remove"])
        result = removal.remove_services(params["remove"], options, Host(module.run_command), module.check_mode)
    except NumaError as exc:
        module.fail_json(msg=str(exc), removed={}, orphans=[])
    for service in orphans:
        module.warn(removal.orphan_warning(service, options.record_dir))
    if result.pop("failed"):
        module.fail_json(orphans=orphans, **result)
    module.exit_json(orphans=orphans, **result)


if __name__ == "__main__":
    main()
