# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every report page is rendered here, and only here, with an escaping that fits its format.

The models (fleet_report.py, cost_report.py) hold text that managed hosts chose. Ansible's own
templar must never see it: on ansible-core before 2.19 a string that reaches it again is evaluated
(``{{ lookup('pipe', ...) }}`` runs on the controller). So the pages are rendered by a Jinja
environment of their own, sandboxed, from the collection's template files (trusted) and the model
(data, never compiled), and the action plugin numa_report writes them. Each format escapes every
value its templates print, not the fields someone remembered:

- HTML: autoescape, so no value opens a tag or an attribute.
- Markdown: a value made only of letters, digits, spaces and ``, % -`` (a dot between digits) is
  printed as it is; any other is a code span, inside which nothing opens a tag, a link, emphasis or a
  heading, with ``|`` escaped so it cannot start a table cell.
- Both: each value is one line (host_results.one_line), so none can start a new heading or row.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping

from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment
from markupsafe import Markup

from ansible_collections.inferops.numa.plugins.plugin_utils.host_results import one_line

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "playbooks", "templates")
FORMATS = ("md", "html")
# Plain Markdown text: starts with a letter or digit (no list marker, heading, quote or table pipe) and
# holds nothing that opens markup; a dot only between digits ("www.x.org" would become a link).
_PLAIN_MARKDOWN = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9 ,%-]|(?<=[0-9])\.(?=[0-9]))*)?$")


class MarkdownText(str):
    """Markdown the templates made themselves (a macro's table): printed as it is."""


def markdown_value(value: Any) -> str:
    """One value as Markdown that cannot open markup, a table cell or a new line."""
    if isinstance(value, MarkdownText):
        return value
    text = one_line(str(value))
    if _PLAIN_MARKDOWN.match(text):
        return text
    # A code span's fence is longer than any run of backticks inside; a space keeps a backtick at either
    # end off the fence (CommonMark strips one space from each side again).
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return fence + pad + text.replace("|", "\\|") + pad + fence


def html_value(value: Any) -> Any:
    """One value as one line (autoescape then escapes it); markup the templates made stays as it is."""
    return value if isinstance(value, Markup) or not isinstance(value, str) else one_line(value)


def _environment(fmt: str) -> SandboxedEnvironment:
    if fmt == "html":
        return SandboxedEnvironment(loader=FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                                    undefined=StrictUndefined, finalize=html_value)
    environment = SandboxedEnvironment(loader=FileSystemLoader(TEMPLATES), autoescape=False, trim_blocks=True,
                                       undefined=StrictUndefined, finalize=markdown_value)
    environment.filters["markdown"] = MarkdownText
    return environment


def render(kind: str, model: Mapping[str, Any]) -> Dict[str, str]:
    """``{"md": page, "html": page}`` of report ``kind`` (``fleet_report``, ``cost_report``)."""
    return {fmt: _environment(fmt).get_template("%s.%s.j2" % (kind, fmt)).render(report=model) for fmt in FORMATS}
