# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The placement table `make demo` prints, for the inference_service role (module_utils/numa/watch/table.py)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible.utils.unsafe_proxy import wrap_var


def numa_placement_table(services: Sequence[Mapping[str, Any]], audits: Optional[Sequence[Mapping[str, Any]]] = None,
                         gates: Optional[Mapping[str, Any]] = None) -> List[str]:
    # Imported here: Ansible imports every filter file of the collection, on every host, to find any one filter.
    from ansible_collections.inferops.numa.plugins.module_utils.numa.watch import table

    # Unsafe: the lines hold text the host chose (escaped, but a "{{" in a unit name must stay text).
    return wrap_var(table.placement_table(table.rollout_rows(services or [], audits or [], gates or {})))


class FilterModule:
    """inferops.numa placement table filter."""

    def filters(self) -> Dict[str, Any]:
        return {"numa_placement_table": numa_placement_table}
