# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that write values into systemd units safely, map a Plan to unit settings, and hand a
placement request to numa-pin (flags) or numa_plan (arguments), merge the services' defaults and build a
service's requests.

Thin: the rules live in ``module_utils/numa/act/unit_text.py``, ``inputs/request.py`` and
``inputs/service_entry.py`` and ``plugin_utils/preflight.py`` (tested there); these wrappers only turn their NumaError into
AnsibleFilterError so a bad variable fails the task with the message that names the fix.
"""

from __future__ import annotations

import functools
import importlib

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

PACKAGE = "ansible_collections.inferops.numa.plugins.module_utils.numa."


def _reported(func, args, kwargs):
    """func(*args, **kwargs), its NumaError an AnsibleFilterError: the task fails with the message that names the fix."""
    try:
        return func(*args, **kwargs)
    except NumaError as exc:
        raise AnsibleFilterError(str(exc)) from None


def _filter(func):
    """func as a filter (_reported)."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return _reported(func, args, kwargs)
    return wrapper


class _Rule:
    """The function ``name`` of the package's ``module`` as a filter, imported at its first call: to find any one
    filter, Ansible imports every filter file of the collection, on every host and task. ``__wrapped__`` is the
    function itself, so inspect.signature (and ansible-doc's checks) see its real parameters."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.__name__ = module, name

    @property
    def __wrapped__(self):
        return getattr(importlib.import_module(PACKAGE + self.module), self.__name__)

    def __call__(self, *args, **kwargs):
        return _reported(self.__wrapped__, args, kwargs)


def _server_command(argv, plan, container=None):
    from ansible_collections.inferops.numa.plugins.module_utils.numa.base.engines import conflicting_flags
    from ansible_collections.inferops.numa.plugins.module_utils.numa.base.tokens import server_command

    engine = (plan.get("engine") or {}).get("engine", "generic")
    conflicts = conflicting_flags(engine, argv)
    if conflicts:
        raise NumaError("engine %s's command gives %s: remove it, or set engine generic to run the command as "
                        "given" % (engine, "; ".join(conflicts)))
    return server_command(argv, plan, container)[0]


def _service_entries(entries, defaults=None):
    # The preflight's own merge and conversion: the role deploys, and the fleet report plans, what it checked.
    from ansible_collections.inferops.numa.plugins.plugin_utils import preflight

    merged, problems = preflight.check_entries(entries, {} if defaults is None else defaults)
    if problems:
        raise NumaError("%d problem(s) in the services: %s" % (len(problems), "; ".join(problems)))
    return merged


def _settings(plan, systemd_version):
    from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text

    return [list(pair) for pair in unit_text.numa_settings(plan, int(systemd_version))]


class FilterModule:
    """inferops.numa systemd filters."""

    def filters(self):
        return {
            "systemd_exec": _Rule("act.unit_text", "exec_line"),
            "systemd_args": _Rule("act.unit_text", "exec_args"),
            "systemd_command_args": _Rule("act.unit_text", "command_args"),
            "systemd_value": _Rule("act.unit_text", "setting_value"),
            "systemd_account": _Rule("act.unit_text", "account_name"),
            "systemd_extra_value": _Rule("act.unit_text", "extra_setting_value"),
            "systemd_path": _Rule("act.unit_text", "path_value"),
            "systemd_environment": _Rule("act.unit_text", "environment_lines"),
            "systemd_setting_name": _Rule("act.unit_text", "setting_name"),
            "systemd_unit_prefix": _Rule("act.unit_text", "unit_prefix"),
            "systemd_version": _Rule("act.unit_text", "parse_systemd_version"),
            "numa_pin_flags": _Rule("act.unit_text", "request_flags"),
            "numa_plan_args": _Rule("inputs.request", "module_args"),
            "numa_plan_record": _Rule("act.unit_text", "plan_record"),
            "numa_rollout_service": _Rule("decide.rollout", "rollout_service"),
            "numa_stale_instances": _Rule("decide.rollout", "stale_instances"),
            "numa_plan_record_name": _Rule("decide.records", "plan_record_name"),
            "numa_service_requests": _Rule("inputs.service_entry", "service_requests"),
            "numa_service_entries": _filter(_service_entries),
            "numa_server_command": _filter(_server_command),
            "numa_systemd_settings": _filter(_settings),
            "numa_container_commands": _Rule("base.containers", "unit_commands"),
        }
