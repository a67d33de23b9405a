"""How an audit judges a running service: each option declared once, every interface built from the table.

``OPTIONS`` holds the name, type, default and choices of the options that say when a service's pages are
local enough; ``numa-pin audit``'s flags (cli.py), numa_audit's argument spec (``argument_spec``), the
metrics' per-service settings (metrics.py) and the fleet report's defaults are built from it. The
inference_service role's ``min_local_percent`` and ``pages`` and numa_audit's DOCUMENTATION are text
for people; tests/unit/test_judging.py holds them to it.

Pure: no I/O.
"""

from __future__ import annotations

from ..base.errors import NumaError, shown
from .request import Option
from ..base.sizes import finite_number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict

OPTIONS = (
    Option("min_local_percent", "float", "lowest local share a bind plan passes with, 0 to 100", default=99.0),
    Option("pages", "str", "which memory the local share counts (program images never count)", default="all",
           choices=("all", "anon", "file")),
)
DEFAULTS = {option.name: option.default for option in OPTIONS}
PAGE_SELECTIONS = OPTIONS[1].choices
# For the signatures of the audit functions: the same defaults, by name.
DEFAULT_MIN_LOCAL_PERCENT = DEFAULTS["min_local_percent"]
DEFAULT_PAGES = DEFAULTS["pages"]
# The policies whose local share min_local_percent holds to: a preferred plan may spill by design and an interleaved
# one is judged by its spread, so only a bind plan fails below the threshold.
ENFORCED_POLICIES = ("bind",)


def argument_spec() -> Dict[str, Dict[str, Any]]:
    """The judging part of an Ansible argument spec (numa_audit's, and each of its ``units``)."""
    spec = {}
    for option in OPTIONS:
        entry = {"type": option.kind, "default": option.default}  # type: Dict[str, Any]
        if option.choices:
            entry["choices"] = list(option.choices)
        spec[option.name] = entry
    return spec


def check(min_local_percent: Any, pages: Any) -> None:
    """Refuse a threshold no share can be compared with (NaN compares false: a bind plan would always pass)."""
    if not finite_number(min_local_percent) or not 0 <= min_local_percent <= 100:
        raise NumaError("min_local_percent %s is not a percentage from 0 to 100: give one like 99"
                        % shown(min_local_percent))
    if pages not in PAGE_SELECTIONS:
        raise NumaError("pages must be one of %s, not %s" % (", ".join(PAGE_SELECTIONS), shown(pages)))
