# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Argument specs written once, each paired with the doc fragment that documents it (plugins/doc_fragments/), as
community.general pairs its ``redis`` fragment with ``redis_auth_argument_spec()``: a module that extends the
fragment takes the option from here, so its type and default cannot drift from the text. Outside the ``numa``
package: numa-pin never parses an Ansible argument spec.
"""

from __future__ import annotations

from typing import Any, Dict

# The host's own files: the module works on this machine.
ROOT_DEFAULT = "/"


def host_root_argument_spec() -> Dict[str, Dict[str, Any]]:
    """``root``, as the ``inferops.numa.host_root`` doc fragment documents it."""
    return {"root": {"type": "path", "default": ROOT_DEFAULT}}
