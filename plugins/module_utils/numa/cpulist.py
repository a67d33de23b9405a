"""The kernel's list syntax for CPUs and nodes: ``0-3,8,10-11``.

Shared by the sysfs reader, the planner and the CLI so that every part of the
package reads and prints the same format as ``/sys/devices/system/node/*/cpulist``
and ``Cpus_allowed_list``.

numa-pin imports this at every service start: no ``re`` (with its enum and functools,
several ms) and ``typing`` only for type checkers.
"""
from __future__ import annotations

from .errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, List

# A typo like "0-1000000" would otherwise build a list of a million ints.
_MAX_ID = 1 << 20


def parse_cpulist(text: str) -> List[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (sorted, unique).

    An empty or blank string is the empty list, as sysfs prints it for a node
    without CPUs. Anything else that is not the kernel's list syntax raises
    NumaError naming the text.
    """
    if not isinstance(text, str):
        raise NumaError("cpu list %r is not a string: write it like '0-3,8,10-11'" % (text,))
    body = text.strip()
    if not body:
        return []
    ids = set()
    for item in body.split(","):
        ids.update(_parse_item(item.strip(), text))
    return sorted(ids)


def _parse_item(item: str, text: str) -> range:
    # isdecimal() is exactly what a regex's \d matches (and all that int() takes here).
    head, dash, tail = item.partition("-")
    if not head.isdecimal() or (dash and not tail.isdecimal()):
        raise NumaError("cannot read cpu list %r: item %r is not N or N-M; write it like '0-3,8,10-11'"
                        % (text, item))
    first = int(head)
    last = int(tail) if dash else first
    if last < first:
        raise NumaError("cannot read cpu list %r: range %r runs backwards; write %d-%d"
                        % (text, item, last, first))
    if last >= _MAX_ID:
        raise NumaError("cannot read cpu list %r: %d is not a plausible cpu or node number" % (text, last))
    return range(first, last + 1)


def format_cpulist(ids: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8, 10, 11]`` -> ``"0-3,8,10-11"``; any order, duplicates ignored."""
    values = sorted(set(ids))
    if not values:
        return ""
    parts = []
    first = previous = values[0]
    for value in values:
        if value > previous + 1:  # a gap ends the run first..previous
            parts.append(_span(first, previous))
            first = value
        previous = value
    parts.append(_span(first, previous))
    return ",".join(parts)


def _span(first: int, last: int) -> str:
    return str(first) if first == last else "%d-%d" % (first, last)
