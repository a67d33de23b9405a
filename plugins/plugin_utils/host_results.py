# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a managed host may send back to the controller's reports, checked before anything uses it.

A host's module result is whatever its interpreter printed: a rogue root, or hostile firmware and
sysfs, choose every byte of it. So each report reads a host's result only through ``check``: a
schema of types, ranges, list sizes and string lengths that returns a clean copy (plain Python
types, unknown keys dropped, every string one printable line) or a ``Rejected`` naming the first
field that broke it. A rejected host is a line of the report; the other hosts are reported.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

# Upper bounds far above any real machine (4096 CPUs per node, 1024 nodes, a few hundred instances), low
# enough that one host cannot make the controller build a page of gigabytes.
MAX_TEXT = 4096
MAX_ITEMS = 4096
MAX_NODES = 1024
MAX_WARNINGS = 512
MAX_BYTES = 1 << 62


class Rejected(Exception):
    """A field of a host's result that breaks the schema: where (``nodes[3].id``) and why."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__("%s: %s" % (where or "the result", why))


Spec = Callable[[Any, str], Any]


def one_line(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters as one visible line: runs of spaces, tabs and line breaks become
    one space, every other control or format character (escape, bidi override, zero-width) its escape."""
    cut = text[:limit]
    # Printable text (no control, format or unassigned character, no space but ' ') has nothing to escape: most
    # of the tens of thousands of strings a fleet's report checks, taken whole instead of character by character.
    shown = cut if cut.isprintable() else escaped(cut)
    return " ".join(shown.split()) + ("..." if len(text) > limit else "")


def escaped(text: str) -> str:
    """Every space character of ``text`` a space, every control, format, surrogate, private or unassigned one its
    escape (``\\x1b``, ``\\u202e``), the rest as it is."""
    shown = []
    for char in text:
        if char.isspace():
            shown.append(" ")
        elif unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            shown.append("\\x%02x" % ord(char) if ord(char) < 0x100 else "\\u%04x" % ord(char))
        else:
            shown.append(char)
    return "".join(shown)


def text(limit: int = MAX_TEXT, null: bool = False) -> Spec:
    def check_text(value: Any, where: str) -> Optional[str]:
        if value is None and null:
            return None
        if not isinstance(value, str):
            raise Rejected(where, "%s where text was expected" % _kind(value))
        if len(value) > limit:
            raise Rejected(where, "%d characters, more than %d" % (len(value), limit))
        return one_line(str(value), limit)
    return check_text


def integer(low: int = 0, high: int = MAX_BYTES, null: bool = False) -> Spec:
    def check_integer(value: Any, where: str) -> Optional[int]:
        if value is None and null:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise Rejected(where, "%s where a whole number was expected" % _kind(value))
        if not low <= value <= high:
            raise Rejected(where, "%d is outside %d..%d" % (value, low, high))
        return int(value)
    return check_integer


def number(low: float, high: float, null: bool = False) -> Spec:
    def check_number(value: Any, where: str) -> Optional[float]:
        if value is None and null:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Rejected(where, "%s where a number was expected" % _kind(value))
        if not low <= value <= high:  # also refuses NaN
            raise Rejected(where, "%r is outside %g..%g" % (value, low, high))
        return float(value) if isinstance(value, float) else int(value)
    return check_number


def boolean(null: bool = False) -> Spec:
    def check_boolean(value: Any, where: str) -> Optional[bool]:
        if value is None and null:
            return None
        if not isinstance(value, bool):
            raise Rejected(where, "%s where true or false was expected" % _kind(value))
        return bool(value)
    return check_boolean


def items(item: Spec, limit: int = MAX_ITEMS) -> Spec:
    """A list of ``item``; a missing list is an empty one."""
    def check_items(value: Any, where: str) -> List[Any]:
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            raise Rejected(where, "%s where a list was expected" % _kind(value))
        if len(value) > limit:
            raise Rejected(where, "%d entries, more than %d" % (len(value), limit))
        return [item(entry, "%s[%d]" % (where, index)) for index, entry in enumerate(value)]
    return check_items


def mapping(fields: Mapping[str, Spec], null: bool = False) -> Spec:
    """An object with these fields (a missing one is checked as null); other keys are dropped."""
    def check_mapping(value: Any, where: str) -> Optional[Dict[str, Any]]:
        if value is None and null:
            return None
        if not isinstance(value, Mapping):
            raise Rejected(where, "%s where an object was expected" % _kind(value))
        prefix = where + "." if where else ""
        return {key: spec(value.get(key), prefix + key) for key, spec in fields.items()}
    return check_mapping


def text_map(limit: int = MAX_ITEMS) -> Spec:
    """An object of text to text (a reason per measured pair); a missing one is empty."""
    def check_text_map(value: Any, where: str) -> Dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, Mapping) or len(value) > limit:
            raise Rejected(where, "%s where an object of at most %d texts was expected" % (_kind(value), limit))
        return {text()(key, where)[:MAX_TEXT]: text()(entry, "%s[%s]" % (where, one_line(str(key), 40)))
                for key, entry in value.items()}
    return check_text_map


def matrix(low: float, high: float) -> Spec:
    """Rows of numbers or nulls, one row and column per node."""
    return items(items(number(low, high, null=True), MAX_NODES), MAX_NODES)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, str):
        return "text %r" % one_line(value, 20)
    if isinstance(value, (int, float)):
        return "number %r" % value
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a value of another type"


def check(spec: Spec, value: Any) -> Union[Dict[str, Any], Rejected]:
    """The clean copy of a host's result, or why it is rejected (an error as a value: the caller lists it)."""
    try:
        return spec(value, "")
    except Rejected as exc:
        return exc
    except RecursionError:
        return Rejected("", "nested too deeply")


# --- the results the reports read ------------------------------------------------------------------

_RATIO = number(0.0, 1.0, null=True)
_UNITS = text(256, null=True)

METRICS_RESULT = mapping({
    "host": mapping({
        "numa_balancing": integer(0, 3, null=True),
        "node_count": integer(0, MAX_NODES), "cpu_count": integer(0, 1 << 20), "gpu_count": integer(0, MAX_ITEMS),
        "nodes": items(mapping({"id": integer(0, MAX_NODES - 1),
                                "memory_free_bytes": integer(null=True)}), MAX_NODES),
    }),
    "topology": mapping({
        "nodes": items(mapping({"id": integer(0, MAX_NODES - 1), "cpus": integer(0, 1 << 20, null=True),
                                "cpulist": text(null=True), "memory_total_bytes": integer(null=True),
                                "gpus": items(text(255), MAX_ITEMS)}), MAX_NODES),
    }, null=True),
    "instances": items(mapping({
        "unit": _UNITS, "policy": text(256, null=True), "nodes": text(null=True), "cpulist": text(null=True),
        "up": boolean(null=True), "state": text(256, null=True),
        "local_ratio": mapping({"anon": _RATIO, "file": _RATIO, "judged": _RATIO}, null=True),
        "min_local_percent": number(0, 100, null=True), "drift": boolean(null=True),
        "affinity_match": boolean(null=True), "off_plan_thread_ratio": _RATIO, "message": text(null=True),
        "roofline": mapping({"bound_tokens_per_second": number(0.0, 1e12, null=True),
                             "share": number(0.0, 1e6, null=True), "source": text(32, null=True),
                             "reason": text(null=True)}, null=True),
        "ab_gate": mapping({"kept": boolean(), "gain_percent": number(-1e6, 1e6, null=True)}, null=True),
    })),
    "planned": items(mapping({
        "unit": _UNITS, "service": _UNITS, "policy": text(256, null=True), "nodes": text(null=True),
        "cpulist": text(null=True), "threads": integer(0, 1 << 20, null=True), "gpus": items(text(255), MAX_ITEMS),
        "port": integer(0, 65535, null=True), "error": text(null=True),
    })),
    "read_warnings": items(text(), MAX_WARNINGS),
})

# The method texts numa_cost returns, in the order the cost report prints them.
METHOD_TEXTS = ("measured", "latency", "latency_error", "bandwidth", "noise")
_REMOTE_NODE = mapping({"node": integer(0, MAX_NODES - 1), "allocations": integer(null=True),
                        "remote_share": _RATIO})
COST_RESULT = mapping({
    "nodes": items(integer(0, MAX_NODES - 1), MAX_NODES),
    "topology_signature": text(null=True),
    "latency_ratio": matrix(0.0, 1e6), "bandwidth_ratio": matrix(0.0, 1e6),
    "distance": matrix(0, 255), "distance_ratio": matrix(0.0, 255.0),
    "latency_ns": matrix(0.0, 1e9), "bandwidth_gbps": matrix(0.0, 1e9),
    "unmeasured": text_map(), "notes": items(text(), MAX_WARNINGS),
    "method": mapping(dict({key: text(null=True) for key in METHOD_TEXTS},
                           spread=matrix(0.0, 1e6), notes=items(text(), MAX_WARNINGS)), null=True),
    "remote_ratio": mapping({
        "available": boolean(null=True), "reason": text(null=True), "window_seconds": number(0, 1e6, null=True),
        "nodes": items(_REMOTE_NODE, MAX_NODES),
        "service": mapping({"summary": text(null=True)}, null=True),
        "perf": mapping({"available": boolean(null=True), "reason": text(null=True),
                         "remote_load_share": _RATIO}, null=True),
    }, null=True),
    "elapsed_seconds": number(0, 1e7, null=True),
})


def outcome(result: Any) -> Optional[str]:
    """Why a registered result holds no reading (unreachable, failed, skipped, nothing), else None."""
    if not isinstance(result, Mapping) or not result:
        return "no result: the host was not reached or was skipped"
    if result.get("unreachable"):
        return "unreachable: %s" % _message(result.get("msg"), "no connection")
    if result.get("failed"):
        return "failed: %s" % _message(result.get("msg"), "no message")
    if result.get("skipped"):
        return "skipped: %s" % _message(result.get("skip_reason"), "condition false")
    return None


def reading(result: Any, spec: Spec, module: str, required: str) -> Union[Dict[str, Any], str]:
    """The clean copy of a host's registered ``module`` result, or why it has none: no reading (unreachable,
    failed, skipped, or without its ``required`` key) or a result that breaks ``spec``."""
    reason = outcome(result)
    if reason:
        return reason
    if required not in result:
        return "%s returned no reading" % module
    clean = check(spec, result)
    if isinstance(clean, Rejected):
        return ("rejected: its result does not match what %s returns (%s); check the host's collection version"
                % (module, clean))
    return clean


def _message(value: Any, otherwise: str) -> str:
    """A host's own message, one short line whatever its type (it is quoted, never trusted)."""
    return one_line(" ".join(str(value).split()), 512) if value else otherwise


def registered(hostvars: Any, hosts: Sequence[str], var: str) -> Dict[str, Any]:
    """host -> its registered ``var`` (None where it has none), read once per host."""
    found = {}
    for name in hosts:
        try:
            found[name] = hostvars[name].get(var)
        except (KeyError, AttributeError, TypeError):
            found[name] = None
    return found
