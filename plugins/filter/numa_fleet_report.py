# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet report's model and directory as filters (plugin_utils/fleet_report.py builds them).

The model holds text the hosts chose, so it is returned marked unsafe: a template that shows it
never evaluates it (ansible-core before 2.19 would). playbooks/fleet_report.yml writes its pages
with the numa_report action instead, which keeps host text away from the templar altogether.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

from ansible.errors import AnsibleFilterError
from ansible.utils.unsafe_proxy import wrap_var


def numa_fleet_report(hostvars: Any, hosts: Sequence[str], var: str = "fleet_report_result") -> Dict[str, Any]:
    # Imported here: Ansible imports every filter file of the collection, on every host, to find any one filter.
    from ansible_collections.inferops.numa.plugins.plugin_utils import fleet_report

    return wrap_var(fleet_report.numa_fleet_report(hostvars, hosts, var))


def numa_fleet_report_dir(given: Any = None) -> str:
    from ansible_collections.inferops.numa.plugins.plugin_utils import fleet_report

    try:
        return fleet_report.report_dir(given)
    except fleet_report.ReportError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"numa_fleet_report": numa_fleet_report, "numa_fleet_report_dir": numa_fleet_report_dir}
