# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cost report's model as a filter (plugin_utils/cost_report.py builds it).

Returned marked unsafe, as it holds text the hosts chose; playbooks/cost_report.yml writes its pages
with the numa_report action instead.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

from ansible.utils.unsafe_proxy import wrap_var


def numa_cost_report(hostvars: Any, hosts: Sequence[str], var: str = "numa_cost_result") -> Dict[str, Any]:
    # Imported here: Ansible imports every filter file of the collection, on every host, to find any one filter.
    from ansible_collections.inferops.numa.plugins.plugin_utils import cost_report

    return wrap_var(cost_report.numa_cost_report(hostvars, hosts, var))


class FilterModule:
    """inferops.numa cost report filter."""

    def filters(self) -> Dict[str, Any]:
        return {"numa_cost_report": numa_cost_report}
