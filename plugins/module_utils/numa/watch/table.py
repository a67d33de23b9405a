"""The placement table: one line per instance, where it runs and how local its pages are.

`make demo` prints it (lab/demo.py), the inference_service role shows it at the end of a deployment (the
``numa_placement_table`` filter) and ``numa_audit`` returns it for ``site.yml --tags audit``: one function, so the
three read alike. Every cell that came from a host (a unit name, a plan record's values) is escaped first: a
newline or a terminal escape in it cannot start a line of its own or repaint the screen.
"""

import json
import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ..read.kernel_files import printable

COLUMNS = ("instance", "node(s)", "cpus", "policy", "threads", "local pages", "model pages local", "port", "tokens/s")
# A cell with nothing to show: no audit yet (check mode), no port, no A/B gate that measured the instance.
NONE = "-"


def placement_table(rows: Iterable[Mapping[str, Any]]) -> List[str]:
    """The table's lines, the header first, columns padded to their widest cell.

    Each row is {"instance": unit or name, "plan": its plan record (``mem_nodes``, ``cpulist``, ``policy``,
    ``threads``, ``port``), "audit": numa_audit's report on it or None (``local_percent``, ``file_local_percent``),
    "tokens_per_second": the rate an A/B gate measured or None}.
    """
    cells = [COLUMNS] + [_cells(row) for row in rows]
    widths = [max(len(line[column]) for line in cells) for column in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]


def _cells(row: Mapping[str, Any]) -> Sequence[str]:
    plan = row.get("plan") or {}
    audit = row.get("audit") or {}
    nodes = plan.get("mem_nodes")
    return (_text(row.get("instance")),
            ",".join(_text(node) for node in nodes) if isinstance(nodes, list) else _text(nodes),
            _text(plan.get("cpulist")), _text(plan.get("policy")), _text(plan.get("threads")),
            _percent(audit.get("local_percent")), _percent(audit.get("file_local_percent")),
            _text(plan.get("port")), _number(row.get("tokens_per_second"), "%.1f"))


def _text(value: Any) -> str:
    return NONE if value is None or value == "" else printable(str(value))


def _percent(value: Any) -> str:
    return _number(value, "%.2f %%")


def _number(value: Any, shape: str) -> str:
    """A finite number in ``shape``; anything else a host could have sent (text, NaN) is no number to show."""
    number = _finite(value)
    return NONE if number is None else shape % number


def _finite(value: Any) -> Optional[float]:
    """``value`` when it is a finite number (true and false are none), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def gate_rate(verdict: Optional[Mapping[str, Any]]) -> Optional[float]:
    """Tokens/s of the placement an A/B gate left running: after the change when it was kept, before it when the
    change was rolled back; None without a verdict or a finite rate."""
    if not isinstance(verdict, Mapping):
        return None
    return _finite(verdict.get("after_tokens_per_second" if verdict.get("kept") else "before_tokens_per_second"))


def rollout_rows(services: Sequence[Mapping[str, Any]], audits: Sequence[Mapping[str, Any]] = (),
                 gates: Optional[Mapping[str, Any]] = None) -> List[Dict[str, Any]]:
    """Rows of every instance of numa_rollout's ``services`` (the role's queue: each instance's plan is the text of
    its record among the service's files), with numa_audit's ``units`` reports and numa_rollout's
    ``numa_ab_gates`` verdicts where there are some (a dry run has neither)."""
    by_unit = {str(report.get("unit")): report for report in audits if isinstance(report, Mapping)}
    rows = []
    for service in services:
        texts = {item.get("path"): item.get("content") for item in service.get("files") or []}
        for instance in service.get("instances") or []:
            unit = str(instance.get("unit"))
            rows.append({"instance": unit[:-len(".service")] if unit.endswith(".service") else unit,
                         "plan": _plan(texts.get(instance.get("record"))), "audit": by_unit.get(unit),
                         "tokens_per_second": gate_rate((gates or {}).get(unit))})
    return rows


def _plan(text: Any) -> Dict[str, Any]:
    try:
        plan = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        plan = None
    return plan if isinstance(plan, dict) else {}
