# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The numa_report action: every host's registered result into one report, written on the controller.

It reads the results straight from ``hostvars``, checks each against its schema, renders the pages
with report_pages.py and writes them itself, so host text never passes through Ansible's templar
(a set_fact, a play variable or the template module would hand it back to it).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.inferops.numa.plugins.plugin_utils import cost_report, fleet_report, host_results, report_pages

# kind -> (its model builder, the file name of its pages, the variable the playbook registers by default). The
# pages are named as the playbooks and their variables are (fleet_report.yml: fleet_report_dir, fleet_report.md).
KINDS = {
    "fleet": (fleet_report.model, "fleet_report", "fleet_report_result"),
    "cost": (cost_report.model, "cost_report", "numa_cost_result"),
}
# The playbooks' variables renamed in 1.0.0, so both playbooks name theirs alike (fleet_report_dir, cost_report_dir):
# the playbook still reads the old name, and this task, which every run of it reaches, says it is deprecated (no
# task of a playbook can warn by itself).
RENAMED = {
    "cost": {"numa_cost_report_dir": "cost_report_dir", "numa_cost_hosts": "cost_report_hosts"},
}

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("kind", "hosts", "result", "dest"))

    def run(self, tmp: Optional[str] = None, task_vars: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        kind = args.get("kind")
        hosts = args.get("hosts")
        if kind not in KINDS:
            return dict(result, failed=True, msg="kind %r is neither fleet nor cost: give kind=fleet or kind=cost"
                        % (kind,))
        if not isinstance(hosts, list) or not all(isinstance(name, str) for name in hosts):
            return dict(result, failed=True, msg="hosts must be a list of host names, such as ansible_play_hosts_all")
        build, name, default_var = KINDS[kind]
        for old, new in sorted(RENAMED.get(kind, {}).items()):
            if old in (task_vars or {}):
                # The version is written out: ansible-test's pylint checks it only as a literal.
                display.deprecated("the variable %s is %s since inferops.numa 1.0.0 (the same value: -e %s=...)%s"
                                   % (old, new, new, "; %s is set too and wins" % new if new in task_vars else ""),
                                   version="2.0.0", collection_name="inferops.numa")
        try:
            directory = fleet_report.report_dir(args.get("dest"))
        except fleet_report.ReportError as exc:
            return dict(result, failed=True, msg=str(exc))
        hostvars = (task_vars or {}).get("hostvars") or {}
        model = build(host_results.registered(hostvars, hosts, args.get("result") or default_var), hosts)
        pages = report_pages.render("%s_report" % kind, model)
        paths, diffs, changed = [], [], False
        for fmt, text in pages.items():
            path = os.path.join(directory, "%s.%s" % (name, fmt))
            before = _read(path)
            paths.append(path)
            if before == text:
                continue
            changed = True
            diffs.append({"before_header": path, "after_header": path, "before": before or "", "after": text})
            if not self._task.check_mode:
                error = _write(directory, path, text)
                if error:
                    return dict(result, failed=True, msg=error)
        missing = len(model["missing"] if kind == "fleet" else model["failed"])
        result.update(changed=changed, paths=paths, host_count=model["host_count"], without_result=missing,
                      msg="NUMA %s report of %d host(s) (%d without a result): %s"
                      % (kind, model["host_count"], missing, " and ".join(paths)))
        if self._task.diff and diffs:
            result["diff"] = diffs
        return result


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def _write(directory: str, path: str, text: str) -> Optional[str]:
    """Write ``path`` whole or not at all (a temporary file of an unpredictable name beside it, then a
    rename, which replaces a link at ``path`` instead of writing through it); None, or what failed."""
    temporary = None
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path), suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
        temporary = None
    except OSError as exc:
        return "cannot write the report %s: %s; give the report a directory you may write" % (path, exc.strerror or exc)
    finally:
        if temporary:
            try:
                os.unlink(temporary)
            except OSError:
                pass
    return None
