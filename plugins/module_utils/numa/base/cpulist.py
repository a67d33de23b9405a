"""The kernel's syntax for numbers and lists: ``0-3,8,10-11`` for CPUs and nodes, ``4096``,
``-1`` and ``0x030200`` for values, ``12`` in a name like ``node12``.

Shared by the sysfs reader, the planner and the CLI so that every part of the
package reads and prints the same format as ``/sys/devices/system/node/*/cpulist``
and ``Cpus_allowed_list``.

numa-pin imports this at every service start: no ``re`` (with its enum and functools,
several ms) and ``typing`` only for type checkers.
"""
from __future__ import annotations

from .errors import NumaError, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, List, Optional

# No kernel numbers more: CONFIG_NR_CPUS tops out at 8192 (x86's MAXSMP, powerpc), and
# MAX_NUMNODES is 1 << NODES_SHIFT with no architecture's NODES_SHIFT above 10. The sysfs
# reader bounds its lists by these (or by the host's possible CPUs and nodes).
MAX_CPUS = 8192
MAX_NODES = 1024
# Callers that name no bound: a typo like "0-99999999" would otherwise build a list of
# a hundred million ints.
_PLAUSIBLE_IDS = 1 << 20
# The characters of the kernel's decimal and hexadecimal numbers: str.isdigit() also takes "²" and "١".
DIGITS = "0123456789"
HEX_DIGITS = DIGITS + "abcdefABCDEF"


def parse_cpulist(text: str, limit: int = _PLAUSIBLE_IDS) -> List[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (sorted, unique), every id below ``limit``.

    An empty or blank string is the empty list, as sysfs prints it for a node
    without CPUs. Anything else that is not the kernel's list syntax, or names an
    id of ``limit`` or more, raises NumaError naming the text.
    """
    if not isinstance(text, str):
        raise NumaError("cpu list %s is not a string: write it like '0-3,8,10-11'" % shown(text))
    body = text.strip()
    if not body:
        return []
    ids = set()
    for item in body.split(","):
        ids.update(_parse_item(item.strip(), text, limit))
    return sorted(ids)


def _parse_item(item: str, text: str, limit: int) -> range:
    # ASCII digits only: str.isdecimal() and int() would take other scripts' digits too.
    head, dash, tail = item.partition("-")
    if not _is_digits(head) or (dash and not _is_digits(tail)):
        raise NumaError("cannot read cpu list %s: item %s is not N or N-M; write it like '0-3,8,10-11'"
                        % (shown(text), shown(item)))
    # More digits than any limit has: int() of thousands of digits is slow, then refused.
    if max(len(head), len(tail)) > len(str(limit)):
        raise NumaError("cannot read cpu list %s: %s is not a plausible cpu or node number"
                        % (shown(text), shown(item)))
    first = int(head)
    last = int(tail) if dash else first
    if last < first:
        raise NumaError("cannot read cpu list %s: range %s runs backwards; write %d-%d"
                        % (shown(text), shown(item), last, first))
    if last >= limit:
        raise NumaError("cannot read cpu list %s: %d is past the last possible cpu or node number, %d"
                        % (shown(text), last, limit - 1))
    return range(first, last + 1)


def _is_digits(text: str) -> bool:
    return bool(text) and not text.strip(DIGITS)


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


def parse_integer(text: str) -> Optional[int]:
    """A number as the kernel prints one (``-1``, ``4096``, ``0x030200``); None for anything else.

    Bounded to 64 bits' worth of digits: int() would take ``1_0`` and ``+5``, and raises
    past 4300 digits; a bigger number is no counter's.
    """
    if text[:2] in ("0x", "0X"):
        digits = text[2:]
        return int(digits, 16) if 0 < len(digits) <= 16 and not digits.strip(HEX_DIGITS) else None
    digits = text[1:] if text[:1] == "-" else text
    if not 0 < len(digits) <= 20 or digits.strip(DIGITS):
        return None
    return int(text)


def is_kernel_number(text: str) -> bool:
    """True for how the kernel prints an unsigned number in a name like ``node12``: ASCII digits,
    no leading zero, at most 9 of them (so ``node01`` and ``node١`` are not node 1)."""
    return 0 < len(text) <= 9 and not text.strip(DIGITS) and (text == "0" or text[0] != "0")


def is_pci_address(name: str) -> bool:
    """``0000:19:04.0`` (a 4 to 8 digit domain, bus, device, function), as sysfs names a PCI device."""
    domain, rest = name.partition(":")[::2]
    bus, rest = rest.partition(":")[::2]
    device, function = rest.partition(".")[::2]
    return (4 <= len(domain) <= 8 and len(bus) == 2 and len(device) == 2 and len(function) == 1
            and not (domain + bus + device + function).strip(HEX_DIGITS))
