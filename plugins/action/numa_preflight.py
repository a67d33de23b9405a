# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The numa_preflight action: the roles' inputs checked on the controller (plugin_utils/preflight.py), then
the host checked by the numa_preflight module, every problem one line, nothing changed anywhere."""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any, Dict, List, Optional, Tuple

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.inferops.numa.plugins.module_utils.numa_specs import ROOT_DEFAULT
from ansible_collections.inferops.numa.plugins.plugin_utils import preflight

display = Display()
# The names the site playbook and the roles register the result under: a later preflight of the same run with
# the same inputs finds one and skips the host's checks.
REGISTERED = ("numa_preflight", "_numa_host_preflight", "_inference_service_preflight")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("root", "services", "balancing"))

    def run(self, tmp: Optional[str] = None, task_vars: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        host = str(task_vars.get("inventory_hostname", "?"))
        values = {name: self._templar.template(task_vars[name]) for name in preflight.option_names() if name in task_vars}
        own = preflight.role_own_vars()
        unknown = sorted(name for name in task_vars if name.startswith(preflight.PREFIXES) and name not in own)
        settings, problems = preflight.check_settings(values, unknown)
        # Every variable the play gives the host (inventory, group_vars, extra and play vars alike): one typo'd
        # without the prefix is named too. Only the names are read, nothing is templated.
        problems += preflight.close_variables(list(task_vars), own)
        entries, entry_problems = preflight.check_entries(settings.get(preflight.ENTRIES) or [],
                                                          settings.get(preflight.ENTRY_DEFAULTS) or {})
        problems += entry_problems
        services = self._task.args.get("services")
        balancing = self._task.args.get("balancing") or settings.get("numa_host_balancing") or "keep"
        module_args = {"root": self._task.args.get("root") or ROOT_DEFAULT,
                       # A service to take back is not checked against the host: nothing of it is deployed.
                       "services": ([entry for entry in entries if entry["state"] != preflight.ABSENT]
                                    if services is None else services), "balancing": balancing}
        # What the host's checks depend on: an equal digest from earlier in the run means they would find the same.
        digest = hashlib.sha256(json.dumps([module_args, settings.get("numa_host_python"),
                                            settings.get("numa_host_python_min_version")],
                                           sort_keys=True, default=repr).encode()).hexdigest()
        earlier = [found for found in (task_vars.get(name) for name in REGISTERED)
                   if isinstance(found, dict) and found.get("digest") == digest and not found.get("failed")]
        checked = bool(earlier)
        if checked:
            without_systemd, warnings = earlier[0].get("without_systemd"), earlier[0].get("host_warnings") or []
        else:
            found, without_systemd, warnings = self._host_problems(settings, module_args, task_vars)
            problems += found
            for line in warnings:  # said once, by the run that checked the host
                display.warning("preflight: %s: %s" % (host, line))
        if without_systemd and self._task.check_mode:
            # A dry run without systemd still plans and renders every unit; only what asks systemd is skipped.
            problems = [line for line in problems if line != without_systemd]
            if not checked:
                display.warning("%s: planning only: %s" % (host, without_systemd))
        if problems:
            for line in problems:
                display.error("preflight: %s: %s" % (host, line), wrap_text=False)
            return dict(result, failed=True, changed=False, problems=["%s: %s" % (host, line) for line in problems],
                        msg="preflight found %d problem(s) on %s, listed above (the first: %s); nothing was changed"
                            % (len(problems), host, problems[0]))
        return dict(result, changed=False, problems=[], settings=settings, entries=entries,
                    host_checked=not checked, digest=digest, without_systemd=without_systemd, host_warnings=warnings)

    def _host_problems(self, settings: Dict[str, Any], module_args: Dict[str, Any],
                       task_vars: Dict[str, Any]) -> Tuple[List[str], Optional[str], List[str]]:
        """The host's problems, the one line saying PID 1 is not systemd (None where it is), and its warnings."""
        python = self._python_problems(settings)
        if python:
            return python, None, []
        answer = self._execute_module(module_name="inferops.numa.numa_preflight", module_args=module_args,
                                      task_vars=task_vars)
        return (list(answer.get("problems") or ([str(answer.get("msg"))] if answer.get("failed") else [])),
                answer.get("without_systemd"), [str(line) for line in answer.get("host_warnings") or ()])

    def _python_problems(self, settings: Dict[str, Any]) -> List[str]:
        """The helper's Python, asked with raw: it may not be the interpreter Ansible runs modules with, and no
        module can run where there is none."""
        python = str(settings.get("numa_host_python") or "/usr/bin/python3")
        wanted = str(settings.get("numa_host_python_min_version") or "3.8")
        answer = self._low_level_execute_command(
            "%s -c 'import sys; print(\"%%d.%%d\" %% sys.version_info[:2])'" % shlex.quote(python))
        found = (answer.get("stdout") or "").strip()
        if answer.get("rc") == 0 and _version(found) >= _version(wanted):
            return []
        seen = "is Python %s" % found if answer.get("rc") == 0 else "did not run (%s)" % _last_line(answer)
        return ["numa_host_python: %s %s; numa-pin needs Python >= %s: install python3 (>= %s) or point "
                "numa_host_python at one" % (python, seen, wanted, wanted)]


def _last_line(answer: Dict[str, Any]) -> str:
    lines = str(answer.get("stderr") or answer.get("stdout") or "").strip().splitlines()
    return lines[-1] if lines else "exit %s, no output" % answer.get("rc")


def _version(text: str) -> tuple:
    parts = text.split(".")
    return tuple(int(part) for part in parts if part.isdigit()) if all(p.isdigit() for p in parts) else (0,)
