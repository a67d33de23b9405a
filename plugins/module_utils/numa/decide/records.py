"""The plan record's home: the names of the records a deployment keeps in the plan directory, and what a plan record
must hold.

The plan records are the contract between the inference_service role (numa_rollout writes them) and whatever acts
on them as root: numa_plan (is the record current), numa_audit and numa-pin audit and cost (the plan a process is
judged against, which decides whether a change is rolled back), numa-pin metrics (which unit drift restarts) and
numa_rollout (the records of its own changes). Each name is spelled here once, so the role (the filter
numa_plan_record_name), the writers and the readers cannot drift apart; every reader opens them through
system/trusted_files.read_plan_record, under one trust rule.

Pure: names and shapes only, so the planner's layer (decide/rollout) can use them.
"""

import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ..base.containers import RUNTIMES
from ..base.cpulist import MAX_CPUS, MAX_NODES, parse_cpulist
from ..base.errors import NumaError, shown

# Each instance's plan: <service>@<index>.plan.json.
PLAN_SUFFIX = ".plan.json"
# How each service is judged and what drift does (numa-pin metrics read it): <service>.audit.json.
AUDIT_SUFFIX = ".audit.json"
# The change each service's A/B gate rolled back last (digests of what it wrote): <service>.rejected.json.
REJECTED_SUFFIX = ".rejected.json"
# What the inference_service role made for each service (the accounts, the state directory), so that taking the
# service back removes those and nothing it found there: <service>.created.json.
CREATED_SUFFIX = ".created.json"
# The record of a change nobody has judged yet (act/change_files), root's alone to read.
PENDING = "rollout.pending.json"
# The instances a rollout left running without traffic (their undrain failed): the next run undrains them first.
UNDRAIN = "rollout.undrain.json"
# The A/B gates' last verdicts (the metrics and the fleet report show them).
AB_GATES = "ab-gates.json"

REDEPLOY = "deploy the service again with the inference_service role"
# Every name a plan record could have, read for the unit it would name: svc@1 and svc@01 both name svc@1.service.
_PLAN_NAME = re.compile(r"(.*)@([0-9]+)%s" % re.escape(PLAN_SUFFIX), re.DOTALL)
# The names the inference_service role writes: unit_text.unit_prefix's service names, less a leading '-'
# (systemctl would read the unit as an option), and an index in canonical decimal, so that a unit has
# one record name and a restart names only <service>@<index>.service of validated parts.
_SERVICE = re.compile(r"(?!\.\.?$)(?!-)[A-Za-z0-9_.-]{1,200}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,4}")
# An account as useradd takes it (and never root, which no role creates), and the state directory systemd makes for
# StateDirectory=<service>.
_ACCOUNT = re.compile(r"(?!root$)[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_STATE_DIRECTORY = re.compile(r"/var/lib/(?!\.\.?$)[A-Za-z0-9_.-]{1,200}")
_POLICY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
MAX_CPULIST_CHARS = 1 << 16


# --- names ----------------------------------------------------------------------------------------


def plan_record_name(service: str, index: Union[int, str]) -> str:
    """``<service>@<index>.plan.json``; ``index`` may be a glob (``*``: every instance) or a placeholder the role
    shows in a comment (the filter numa_plan_record_name)."""
    return "%s@%s%s" % (service, index, PLAN_SUFFIX)


def audit_record_name(service: str) -> str:
    return service + AUDIT_SUFFIX


def rejected_record_name(service: str) -> str:
    return service + REJECTED_SUFFIX


def created_record_name(service: str) -> str:
    return service + CREATED_SUFFIX


def record_service(name: str) -> Optional[str]:
    """The service a record of the plan directory named ``name`` belongs to (its plan records, audit, rejected and
    created records), when that is a service name the role writes; None for any other name."""
    parts = plan_record_parts(name)
    if parts:
        service = parts[0] if _INDEX.fullmatch(parts[1]) else None  # type: Optional[str]
    else:
        suffix = next((suffix for suffix in (AUDIT_SUFFIX, REJECTED_SUFFIX, CREATED_SUFFIX) if name.endswith(suffix)),
                      None)
        service = name[:-len(suffix)] if suffix else None
    return service if service is not None and _SERVICE.fullmatch(service) else None


def service_record_names(service: str, names: Iterable[str]) -> List[str]:
    """Those of ``names`` (a plan directory's) that are ``service``'s records, the created record last: it says
    which accounts to remove, so it goes only after they did."""
    own = [name for name in names if record_service(name) == service]
    return sorted(own, key=lambda name: (name == created_record_name(service), name))


def created_problem(value: Mapping[str, Any]) -> str:
    """Why a created record is not one the role writes (``user``, ``group``: an account name or null;
    ``state_directory``: the absolute path /var/lib/<name> or null); "" when it is."""
    for key in ("user", "group"):
        name = value.get(key)
        if name is not None and not (isinstance(name, str) and _ACCOUNT.fullmatch(name)):
            return "%s %s is not an account name" % (key, shown(name))
    path = value.get("state_directory")
    if path is not None and not (isinstance(path, str) and _STATE_DIRECTORY.fullmatch(path)):
        return "state_directory %s is not /var/lib/<service>" % shown(path)
    unknown = sorted(set(value) - {"user", "group", "state_directory"})
    return "unknown key %s" % shown(unknown[0]) if unknown else ""


def plan_record_parts(name: str) -> Optional[Tuple[str, str]]:
    """(service, index digits) of any name a plan record could have (the last '@' splits), or None."""
    match = _PLAN_NAME.fullmatch(name)
    return (match.group(1), match.group(2)) if match else None


def plan_record_unit(name: str, plan_dir: str) -> Tuple[str, int]:
    """(service, index) of a record named ``<service>@<index>.plan.json`` exactly as the role names it; NumaError
    for any other name (a restart names the unit it reads from the name)."""
    parts = plan_record_parts(name)
    if not parts or not _SERVICE.fullmatch(parts[0]) or not _INDEX.fullmatch(parts[1]):
        raise NumaError("ignoring the plan record %s in %s: not named <service>@<index>%s with a systemd service "
                        "name (letters, digits, '_', '.', '-', not first) and an index from 0 to 99999 without "
                        "leading zeros; remove it and %s" % (shown(name), plan_dir, PLAN_SUFFIX, REDEPLOY))
    return parts[0], int(parts[1])


# --- shape ----------------------------------------------------------------------------------------


def plan_problem(written: Mapping[str, Any]) -> str:
    """Why the fields of a plan record that the metrics show and the audit compares with are not of the types the
    role writes, in range (a policy name, node and CPU ids, a cpu list, a container runtime): the first that is not;
    "" when all are."""
    policy, mem_nodes, cpus, cpulist = (written.get(key) for key in ("policy", "mem_nodes", "cpus", "cpulist"))
    return (_policy_problem(policy) or _ids_problem("mem_nodes", mem_nodes, MAX_NODES)
            or _ids_problem("cpus", cpus, MAX_CPUS) or _cpulist_problem(cpulist)
            or _container_problem(written.get("container")))


def plan_fields(written: Mapping[str, Any]) -> Dict[str, Any]:
    """Those fields of a record ``plan_problem`` found nothing wrong with, each in one form: ids sorted, once."""
    fields = {"policy": written.get("policy") or None, "mem_nodes": sorted(set(written.get("mem_nodes") or [])),
              "cpulist": written.get("cpulist") or ""}
    if written.get("cpus"):
        fields["cpus"] = sorted(set(written["cpus"]))
    if written.get("container"):  # the audit finds a daemon-started container's processes by it
        fields["container"] = written["container"]
    return fields


def _policy_problem(policy: Any) -> str:
    if policy in (None, "") or (isinstance(policy, str) and _POLICY.fullmatch(policy)):
        return ""
    return "policy %s is not a policy name like bind" % shown(policy)


def _container_problem(runtime: Any) -> str:
    if runtime is None or runtime in RUNTIMES:
        return ""
    return "container %s is none of the runtimes %s" % (shown(runtime), ", ".join(RUNTIMES))


def _ids_problem(field: str, ids: Any, limit: int) -> str:
    if ids is None or (isinstance(ids, list) and all(is_count(item, limit - 1) for item in ids)):
        return ""
    return "%s %s is not a list of ids from 0 to %d" % (field, shown(ids), limit - 1)


def _cpulist_problem(cpulist: Any) -> str:
    if cpulist is None:
        return ""
    if not isinstance(cpulist, str) or len(cpulist) > MAX_CPULIST_CHARS:
        return "cpulist %s is not a cpu list of at most %d characters" % (shown(cpulist), MAX_CPULIST_CHARS)
    try:
        parse_cpulist(cpulist, MAX_CPUS)
    except NumaError as exc:
        return str(exc)
    return ""


def is_count(value: Any, largest: int) -> bool:
    """A JSON integer from 0 to ``largest`` (true and false are no numbers)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= largest
