# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that write values into systemd units safely, map a Plan to unit settings, and hand a
placement request to numa-pin (flags) or numa_plan (arguments), and build a service's requests.

Thin: the rules live in ``module_utils/numa/act/unit_text.py``, ``inputs/request.py`` and
``inputs/service_entry.py`` (tested there); these wrappers only turn their NumaError into
AnsibleFilterError so a bad variable fails the task with the message that names the fix.
"""

from __future__ import annotations

import functools

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import request
from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.engines import conflicting_flags
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs.service_entry import service_requests
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.tokens import server_command


def _filter(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except NumaError as exc:
            raise AnsibleFilterError(str(exc)) from None
    return wrapper


def _server_command(argv, plan):
    engine = (plan.get("engine") or {}).get("engine", "generic")
    conflicts = conflicting_flags(engine, argv)
    if conflicts:
        raise NumaError("engine %s's command gives %s: remove it, or set engine generic to run the command as "
                        "given" % (engine, "; ".join(conflicts)))
    return server_command(argv, plan)[0]


def _settings(plan, systemd_version):
    return [list(pair) for pair in unit_text.numa_settings(plan, int(systemd_version))]


class FilterModule:
    """inferops.numa systemd filters."""

    def filters(self):
        return {
            "systemd_exec": _filter(unit_text.exec_line),
            "systemd_args": _filter(unit_text.exec_args),
            "systemd_command_args": _filter(unit_text.command_args),
            "systemd_value": _filter(unit_text.setting_value),
            "systemd_account": _filter(unit_text.account_name),
            "systemd_extra_value": _filter(unit_text.extra_setting_value),
            "systemd_path": _filter(unit_text.path_value),
            "systemd_environment": _filter(unit_text.environment_lines),
            "systemd_setting_name": _filter(unit_text.setting_name),
            "systemd_unit_prefix": _filter(unit_text.unit_prefix),
            "systemd_version": _filter(unit_text.parse_systemd_version),
            "numa_pin_flags": _filter(unit_text.request_flags),
            "numa_plan_args": _filter(request.module_args),
            "numa_service_requests": service_requests,
            "numa_server_command": _filter(_server_command),
            "numa_plan_record": _filter(unit_text.plan_record),
            "numa_systemd_settings": _filter(_settings),
        }
