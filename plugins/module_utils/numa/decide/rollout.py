"""What a deployment changes on a host, decided from what it wants and what is there: which files it writes,
which instances restart for them, which change it holds back as one an A/B gate rolled back before, and what a
rollback has to put back.

A service wants each of its files to hold a text (its unit template, each instance's plan record and systemd
placement drop-in, how the metrics judge it) or to be absent (a placement drop-in left from ``pin_mode: systemd``).
An instance restarts when a file it starts from changes: the template, which all instances of the service share,
its own drop-in or its own plan record. Its first deployment is the one without a plan record yet.

A change is held when the service has an A/B gate and every file the change would write holds exactly what a
change the gate rolled back wrote there (the rejected record, by digest): trying it again would be measured and
rolled back at every run. A change of which only a part was rejected is another change, and is measured. Without
a gate a change is the operator's and is never held.

``rollout_service`` turns one entry of the inference_service role into what it wants (the filter
numa_rollout_service), numa_rollout's ``services[]``.

Pure: the act layer (act/rollout.py) reads the files, writes them and restarts the instances.
"""

import hashlib
import json
import os
from typing import Any, Dict, FrozenSet, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..base.tokens import HOOK_TOKENS, substitute_tokens
from .records import audit_record_name, plan_record_name, plan_record_parts

# A traffic hook's deadline unless the entry says (hook_seconds): a load balancer's API answers in far less.
HOOK_SECONDS = 60
# The drop-in of an instance's placement in pin_mode systemd (the role's numa-placement.conf.j2).
PLACEMENT_DROP_IN = "50-inferops-numa.conf"


class Found(NamedTuple):
    """What a path holds now: its text (None: no file there), and whether it is as a deployment leaves it
    (a regular file root owns that no one else may write, with the mode wanted). A file that is not is written
    again even when its text is right."""
    text: Optional[str]
    as_left: bool = True


NOTHING = Found(None)


class Service(NamedTuple):
    """What a service wants on the host."""
    name: str
    files: Mapping[str, Optional[str]]  # path -> the text it must hold; None: no file there
    units: Mapping[str, Tuple[str, ...]]  # instance unit -> the paths its process starts from
    records: Mapping[str, str]  # instance unit -> its plan record's path
    gated: bool  # an A/B gate judges its changes
    systemd: FrozenSet[str] = frozenset()  # the paths systemd reads (units, drop-ins): a change needs a reload


class Change(NamedTuple):
    """What a deployment does to one service."""
    service: str
    writes: Dict[str, Optional[str]]  # path -> the text to write; None: remove the file. Empty when held.
    held: bool  # a change its A/B gate rolled back before: nothing written, nothing restarted
    restart: Tuple[str, ...]  # the instances a written file restarts, in the service's order
    first: Tuple[str, ...]  # the instances deployed for the first time (no plan record yet)
    reload: bool  # a file systemd reads is written: systemd must reload before any restart


def digest(text: Optional[str]) -> Optional[str]:
    """The digest a rejected record keeps of a text (None for a file that must be absent)."""
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def decide(service: Service, found: Mapping[str, Found], rejected: Mapping[str, Optional[str]]) -> Change:
    """The change ``service`` makes on a host whose paths hold ``found`` (a path left out holds nothing), given
    the rejected record of its last change an A/B gate rolled back (path -> digest; empty: none)."""
    changing = {path: text for path, text in service.files.items() if _differs(found.get(path, NOTHING), text)}
    held = service.gated and bool(changing) and all(
        path in rejected and rejected[path] == digest(text) for path, text in changing.items())
    writes = {} if held else changing
    restart = tuple(unit for unit, paths in service.units.items() if any(path in writes for path in paths))
    first = tuple(unit for unit, record in service.records.items() if found.get(record, NOTHING).text is None)
    return Change(service.name, writes, held, restart, first, any(path in service.systemd for path in writes))


def _differs(now: Found, wanted: Optional[str]) -> bool:
    if wanted is None:
        return now.text is not None or not now.as_left
    return now.text != wanted or not now.as_left


def rejected_record(change: Change) -> Dict[str, Optional[str]]:
    """What to keep of a change its A/B gate rolled back, for ``decide`` to hold it next time."""
    return {path: digest(text) for path, text in change.writes.items()}


def previous_texts(changes: Tuple[Change, ...], found: Mapping[str, Found]) -> Dict[str, Optional[str]]:
    """What a rollback writes back: each written path's text before the change (None: no file was there)."""
    return {path: found.get(path, NOTHING).text for change in changes for path in change.writes}


# --- what a role entry wants -------------------------------------------------------------------------------


def record_text(value: Mapping[str, Any]) -> str:
    """A record as the role has always written it (Ansible's to_nice_json and a newline), so an unchanged record
    compares equal byte for byte."""
    return json.dumps(value, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def rollout_service(entry: Mapping[str, Any], unit: str, unit_text: str, records: Sequence[Mapping[str, Any]],
                    placements: Sequence[str], unit_dir: str, plan_dir: str) -> Dict[str, Any]:
    """One service of numa_rollout's ``services``: every file the entry wants (its unit template, each instance's
    plan record and systemd placement drop-in, or that drop-in's absence in pin_mode wrapper, its audit settings)
    and each instance with the files it starts from, its readiness, audit, A/B gate and traffic hooks (their
    tokens filled: ``hook_argv``).

    ``records`` are the instances' plan records (numa_plan's ``record``), ``placements`` their rendered drop-ins
    (pin_mode systemd; empty otherwise)."""
    template = os.path.join(unit_dir, "%s@.service" % unit)
    files = [{"path": template, "content": unit_text, "state": "present", "systemd": True}]
    instances = []
    for index, record in enumerate(records):
        record_path = os.path.join(plan_dir, plan_record_name(unit, index))
        drop_in = os.path.join(unit_dir, "%s@%d.service.d" % (unit, index), PLACEMENT_DROP_IN)
        files.append({"path": record_path, "content": record_text(record), "state": "present", "systemd": False})
        files.append({"path": drop_in, "content": placements[index] if entry["pin_mode"] == "systemd" else "",
                      "state": "present" if entry["pin_mode"] == "systemd" else "absent", "systemd": True})
        instances.append({"unit": "%s@%d.service" % (unit, index), "record": record_path,
                          "drain_command": hook_argv(entry.get("drain_command"), unit, index, record.get("port")),
                          "undrain_command": hook_argv(entry.get("undrain_command"), unit, index, record.get("port")),
                          "hook_seconds": entry.get("hook_seconds") or HOOK_SECONDS,
                          "drain_seconds": entry.get("drain_seconds") or 0,
                          "files": [template, record_path, drop_in], "engine": entry.get("engine") or "generic",
                          "port": record.get("port"), "health_url": entry.get("health_url"),
                          "ab_gate": entry.get("ab_gate"),
                          "audit": {"min_local_percent": entry["min_local_percent"], "pages": entry["pages"]}
                          if entry["audit"] else None})
    judged = {"audit": bool(entry["audit"]), "min_local_percent": float(entry["min_local_percent"]),
              "pages": entry["pages"], "on_drift": entry["on_drift"]}
    if entry.get("bytes_per_token"):  # only when given: the records of services without it stay as they were
        judged["bytes_per_token"] = entry["bytes_per_token"]
    files.append({"path": os.path.join(plan_dir, audit_record_name(unit)), "state": "present", "systemd": False,
                  "content": record_text(judged)})
    return {"name": unit, "files": files, "instances": instances}


def hook_argv(argv: Optional[Sequence[str]], unit: str, index: int, port: Optional[int]) -> List[str]:
    """A traffic hook of instance ``index`` of service ``unit`` with its tokens filled (base/tokens.HOOK_TOKENS:
    ``{service}``, ``{unit}``, ``{instance}``, ``{port}``), by the rule the server's command is filled with; empty
    for none."""
    values = {"service": unit, "unit": "%s@%d.service" % (unit, index), "instance": index, "port": port}
    return substitute_tokens(argv or [], values, HOOK_TOKENS)


def stale_instances(paths: Sequence[str], unit: str, count: int) -> List[int]:
    """The indices of ``unit``'s instances an earlier deployment left (a plan record ``<unit>@<index>.plan.json``
    among ``paths``) that a deployment of ``count`` instances no longer wants, in order."""
    indices = set()
    for path in paths:
        parts = plan_record_parts(os.path.basename(path))
        if parts and parts[0] == unit and int(parts[1]) >= count:
            indices.add(int(parts[1]))
    return sorted(indices)
