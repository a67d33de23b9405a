"""Taking a service back: everything the inference_service role put on a host for it removed, and nothing else.

A service's files are known by name (decide/records for the plan directory's records, the unit template
``<service>@.service`` and each instance's placement drop-in in the unit directory), so only those are removed:
its instances are stopped and disabled first (each instance found by a plan record or a drop-in directory), then
its files, its verdicts in ab-gates.json, then what the role made for it and recorded in ``<service>.created.json``
when it made it: the state directory (with the page-cache replicas numa-pin keeps there by default), the user and
the group. An account or directory the role found on the host is in no record, so it is never removed. The created
record goes last: a removal that stopped half-way still knows what to remove at the next run. systemd reloads once.

Every path is hostile until trusted: the plan directory's records are read under its one trust rule
(system/trusted_files), directories are reached without following a link (system/safe_fs) and a drop-in directory
that holds files of someone else is left with them. A created record that cannot be trusted is not acted on: the
service is left as it is and the reason said.

The resctrl monitor groups of its instances are the metrics timer's (act/resctrl_groups): it removes the group of a
unit no longer recorded once it is empty, so removing the plan records is what takes those back.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence

from .change_files import read_found, read_record, write_record
from .hooks import Hooks, hook_problem
from .rollout import Host
from ..base.errors import NumaError
from ..decide.records import (AB_GATES, created_problem, created_record_name, plan_record_name, plan_record_parts,
                              record_service, service_record_names)
from ..decide.rollout import PLACEMENT_DROP_IN, hook_argv, record_text
from ..system import root_files, safe_fs, trusted_files

FIX_CREATED = "look at it, remove what the role made for the service by hand if you want it gone, then remove it"
DROP_IN_DIRECTORY = ".service.d"


class Options(NamedTuple):
    record_dir: str  # the plan directory
    unit_dir: str  # where the unit templates and drop-in directories are
    root: str = "/"  # the state directories' root prefix
    drains: Mapping[str, Hooks] = {}  # service -> its traffic hooks: a running instance is drained before its stop


class Removal:
    """What taking back a service did (or, in check mode, would do): one line per step, and what failed."""

    def __init__(self) -> None:
        self.done = []  # type: List[str]
        self.problems = []  # type: List[str]
        self.reload = False


def deployed_services(record_dir: str) -> List[str]:
    """The services the plan directory holds records of (decide/records.record_service), sorted; none when it is
    missing. NumaError when it cannot be trusted."""
    fd = trusted_files.open_plan_directory(record_dir)
    if fd is None:
        return []
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    return sorted({service for service in map(record_service, names) if service is not None})


def orphans(record_dir: str, keep: Sequence[str], remove: Sequence[str]) -> List[str]:
    """The services deployed here (their records are in the plan directory) that are neither kept nor being
    removed: a service taken out of the inventory is not left running half-managed without a word."""
    return [service for service in deployed_services(record_dir) if service not in keep and service not in remove]


def orphan_warning(service: str, record_dir: str) -> str:
    return ("%s is deployed on this host (its records are in %s) but is not in inference_service_list: add it to "
            "inference_service_remove to take it back (its instances stopped, its units and records and the "
            "accounts the role made removed), or list it again" % (service, record_dir))


def record_created(record_dir: str, service: str, made: Mapping[str, Optional[str]], root: str, check: bool) -> bool:
    """``made`` (``user``, ``group``, ``state_directory``: what the role made now, null for what it did not) merged
    into the service's created record; whether that changed it. A state directory is recorded only while it is not
    there yet: systemd makes it at the service's first start, for the role. NumaError for a record that cannot be
    trusted (it is not written over)."""
    name = created_record_name(service)
    earlier = _created(record_dir, service)
    problem = created_problem(made)
    if problem:
        raise NumaError("refusing to record in %s: %s; give what the role made" % (
            os.path.join(record_dir, name), problem))
    merged = dict(earlier)
    for key in ("user", "group"):
        if made.get(key):
            merged[key] = made[key]
    directory = made.get("state_directory")
    if directory and not earlier.get("state_directory") and root_files.lstat_under(root, directory) is None:
        merged["state_directory"] = directory
    if merged == earlier:
        return False
    if not check:
        write_record(record_dir, name, record_text(merged))
    return True


def remove_services(services: Sequence[str], options: Options, host: Host, check: bool) -> Dict[str, Any]:
    """Take each of ``services`` back (see the module docstring); systemd reloads once after all of them.

    Returns {"changed", "failed", "msg", "removed": {service: [what was done]}}; in check mode, what would be."""
    removed = {}  # type: Dict[str, List[str]]
    problems = []  # type: List[str]
    reload = False
    for service in services:
        removal = _remove(service, options, host, check)
        if removal.done:
            removed[service] = removal.done
        problems += removal.problems
        reload = reload or removal.reload
    if reload and not check:
        problems += [problem for problem in [host.systemctl("daemon-reload")] if problem]
    msg = "; ".join(problems) if problems else (
        "%s taken back" % ", ".join(sorted(removed)) if removed else "nothing of %s is here" % ", ".join(services))
    return {"changed": bool(removed), "failed": bool(problems), "msg": msg, "removed": removed}


def _remove(service: str, options: Options, host: Host, check: bool) -> Removal:
    removal = Removal()
    try:
        created = _created(options.record_dir, service)
        records = _directory_names(options.record_dir)
        units = _directory_names(options.unit_dir)
        # A drop-in directory of an instance with our drop-in, or empty; one holding only someone else's is theirs.
        drop_ins = [name for name in units if _drop_in_instance(name, service) is not None
                    and _holds_ours(os.path.join(options.unit_dir, name))]
    except NumaError as exc:
        removal.problems.append("%s left as it is: %s" % (service, exc))
        return removal
    own_records = service_record_names(service, records)
    instances = sorted({index for index in [_record_instance(name, service) for name in own_records]
                        + [_drop_in_instance(name, service) for name in drop_ins] if index is not None})
    _drain(removal, service, instances, options, host, check)
    if removal.problems:
        return removal  # an instance its load balancer still sends requests to is not stopped
    for index in instances:
        unit = "%s@%d.service" % (service, index)
        _step(removal, check, "stopped and disabled %s" % unit,
              lambda unit=unit: host.systemctl("stop", unit) or host.systemctl("disable", unit))
    if removal.problems:
        return removal  # an instance still running keeps the files it runs from, and its records say it is ours
    template = "%s@.service" % service
    if template in units:
        removal.reload = True
        _step(removal, check, "removed %s" % os.path.join(options.unit_dir, template),
              lambda: _remove_names(options.unit_dir, [template]))
    for name in drop_ins:
        removal.reload = True
        _step(removal, check, "removed %s" % os.path.join(options.unit_dir, name, PLACEMENT_DROP_IN),
              lambda name=name: _remove_drop_in(options.unit_dir, name))
    last = created_record_name(service)
    kept = [name for name in own_records if name != last]
    if kept:
        _step(removal, check, "removed %s from %s" % (", ".join(kept), options.record_dir),
              lambda: _remove_names(options.record_dir, kept))
    _step(removal, check, "removed its verdicts from %s" % AB_GATES, lambda: _forget_verdicts(options, service),
          _has_verdicts(options.record_dir, service))
    if created:
        _remove_made(removal, service, created, options, host, check)
        if not removal.problems:
            _step(removal, check, "removed %s from %s" % (last, options.record_dir),
                  lambda: _remove_names(options.record_dir, [last]))
    return removal


def _drain(removal: Removal, service: str, instances: Sequence[int], options: Options, host: Host,
           check: bool) -> None:
    """Each running instance taken out of its load balancer's traffic (the service's drain command, its tokens
    filled as a rollout fills them), then the grace for requests in flight, once for all; the first drain that fails
    stops the removal before any instance is stopped."""
    hooks = options.drains.get(service)
    if not hooks or not hooks.drain:
        return
    drained = False
    for index in instances:
        unit = "%s@%d.service" % (service, index)
        if host.systemctl("is-active", unit) is not None:
            continue  # not running: no traffic to take away
        if check:
            removal.done.append("would drain %s" % unit)
            continue
        try:
            argv = hook_argv(hooks.drain, service, index, _recorded_port(options.record_dir, service, index))
        except NumaError as exc:
            removal.problems.append("%s: not stopped: %s" % (unit, exc))
            return
        problem = hook_problem("drain", argv, hooks.seconds, host.hook)
        if problem:
            removal.problems.append("%s: not stopped: %s; fix the drain command or the load balancer and run "
                                    "again" % (unit, problem))
            return
        removal.done.append("drained %s" % unit)
        drained = True
    if drained and hooks.drain_seconds:
        host.sleep(hooks.drain_seconds)


def _recorded_port(record_dir: str, service: str, index: int) -> Optional[int]:
    """The port instance ``index`` was deployed on (its plan record's), for a drain command's {port}; None when
    the record has none or cannot be read (a {port} then says it is missing)."""
    try:
        record = read_record(record_dir, plan_record_name(service, index), "it is not read")
    except NumaError:
        return None
    port = (record or {}).get("port")
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None


def _remove_made(removal: Removal, service: str, created: Mapping[str, Optional[str]], options: Options,
                 host: Host, check: bool) -> None:
    """The state directory, the user and the group the role made, each only while it is there. An account another
    of our services still runs as is handed to that service's created record instead: it goes with the last one."""
    user, group, directory = created.get("user"), created.get("group"), created.get("state_directory")
    if directory and root_files.lstat_under(options.root, directory) is not None:
        _step(removal, check, "removed %s" % directory, lambda: _remove_state_directory(options.root, directory, user))
    accounts = {"user": user, "group": group}
    for key, name in sorted(accounts.items()):
        other = _runs_as(options, service, key, name) if name else None
        if other:
            accounts[key] = None
            _step(removal, check, "handed %s %s to %s, which runs as it" % (key, name, other),
                  lambda other=other, key=key, name=name: _hand_over(options, other, key, name, check))
    user, group = accounts["user"], accounts["group"]
    if user and _exists(pwd.getpwnam, user):
        _step(removal, check, "removed user %s" % user, lambda: _command(host, ["userdel", "--", user]))
    # userdel removes a user's own group with it on most systems: only one still there is removed.
    if group and _exists(grp.getgrnam, group):
        _step(removal, check, "removed group %s" % group,
              lambda: _command(host, ["groupdel", "--", group]) if _exists(grp.getgrnam, group) else None)


def _runs_as(options: Options, service: str, key: str, name: str) -> Optional[str]:
    """Another service deployed here whose unit template runs as ``name`` (``key``: user or group), or None."""
    setting = "%s=%s" % (key.capitalize(), name)
    for other in deployed_services(options.record_dir):
        template = os.path.join(options.unit_dir, "%s@.service" % other)
        text = read_found([template])[template].text if other != service else None
        if text and setting in text.splitlines():
            return other
    return None


def _hand_over(options: Options, other: str, key: str, name: str, check: bool) -> Optional[str]:
    try:
        record_created(options.record_dir, other, {key: name}, options.root, check)
    except NumaError as exc:
        return str(exc)
    return None


def _step(removal: Removal, check: bool, said: str, act: Any, due: bool = True) -> None:
    """Do ``act`` (None when it worked, else why not) unless ``check``; say it, or its problem."""
    if not due:
        return
    problem = None if check else act()
    if problem:
        removal.problems.append("%s: not %s" % (problem, said))
    else:
        removal.done.append(said)


def _exists(lookup: Any, name: str) -> bool:
    try:
        lookup(name)
    except KeyError:
        return False
    return True


def _command(host: Host, argv: List[str]) -> Optional[str]:
    try:
        rc, out, err = host.run(argv)
    except OSError as exc:
        return "%s could not run: %s" % (" ".join(argv), exc)
    return None if rc == 0 else "%s failed (rc %d): %s" % (" ".join(argv), rc, " ".join((err or out).split()))


def _created(record_dir: str, service: str) -> Dict[str, Optional[str]]:
    """The service's created record; empty when there is none. NumaError for one that cannot be trusted."""
    name = created_record_name(service)
    value = read_record(record_dir, name, FIX_CREATED) or {}
    problem = created_problem(value)
    if problem:
        raise NumaError("refusing %s: %s; %s" % (os.path.join(record_dir, name), problem, FIX_CREATED))
    return value


def _directory_names(path: str) -> List[str]:
    """The names in directory ``path``, reached under the deployed files' rule; none when it is missing."""
    try:
        fd = trusted_files.open_checked_directory(path, "directory", safe_fs.DEPLOYED)
    except FileNotFoundError:
        return []
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def _holds_ours(directory: str) -> bool:
    names = _directory_names(directory)
    return not names or PLACEMENT_DROP_IN in names


def _record_instance(name: str, service: str) -> Optional[int]:
    parts = plan_record_parts(name)
    return int(parts[1]) if parts and parts[0] == service else None


def _drop_in_instance(name: str, service: str) -> Optional[int]:
    """The index of ``service``'s instance whose drop-in directory is ``name`` (canonical decimal), else None."""
    head, _at, index = name[:-len(DROP_IN_DIRECTORY)].rpartition("@")
    if not name.endswith(DROP_IN_DIRECTORY) or head != service or not index.isdigit() or str(int(index)) != index:
        return None
    return int(index)


def _remove_names(directory: str, names: Sequence[str]) -> Optional[str]:
    """The files ``names`` removed from ``directory`` (reached under the deployed files' rule); why not, or None."""
    try:
        fd = trusted_files.open_checked_directory(directory, "directory", safe_fs.DEPLOYED)
    except FileNotFoundError:
        return None
    except NumaError as exc:
        return str(exc)
    try:
        for name in names:
            try:
                root_files.remove(fd, name)
            except FileNotFoundError:
                pass
    except OSError as exc:
        return "cannot remove %s: %s" % (os.path.join(directory, name), exc.strerror or exc)
    finally:
        os.close(fd)
    return None


def _remove_drop_in(unit_dir: str, name: str) -> Optional[str]:
    """Our placement drop-in removed from the instance's drop-in directory, and the directory once empty: one that
    holds someone else's drop-ins too is theirs to keep, with them."""
    directory = os.path.join(unit_dir, name)
    problem = _remove_names(directory, [PLACEMENT_DROP_IN])
    if problem:
        return problem
    try:
        root_files.remove_directory_under("/", directory)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY):
            return "%s not removed: %s" % (directory, exc.strerror or exc)
    return None  # gone, or kept with someone else's drop-ins


def _has_verdicts(record_dir: str, service: str) -> bool:
    verdicts = read_record(record_dir, AB_GATES, "it is left as it is", []) or {}
    return any(_unit_service(unit) == service for unit in verdicts)


def _forget_verdicts(options: Options, service: str) -> Optional[str]:
    verdicts = read_record(options.record_dir, AB_GATES, "it is left as it is", []) or {}
    kept = {unit: verdict for unit, verdict in verdicts.items() if _unit_service(unit) != service}
    try:
        write_record(options.record_dir, AB_GATES, record_text(kept) if kept else None)
    except NumaError as exc:
        return str(exc)
    return None


def _unit_service(unit: str) -> str:
    return unit.rpartition("@")[0]


def _remove_state_directory(root: str, path: str, user: Optional[str]) -> Optional[str]:
    """The state directory ``path`` under ``root`` and all it holds removed, no link followed (a link is removed,
    never what it points to); refused when anyone but root or the service's ``user`` owns it."""
    parent, name = os.path.split(path)
    try:
        fd, _problem, _owner = safe_fs.open_directory(root, safe_fs.names_of(root, parent), None, judge_start=False)
    except OSError as exc:
        return "cannot reach %s: %s" % (root_files.host_path(root, parent), exc.strerror or exc)
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        owners = {0} | ({pwd.getpwnam(user).pw_uid} if user and _exists(pwd.getpwnam, user) else set())
        if info.st_uid not in owners:
            return ("refusing to remove %s: it is owned by uid %d, not by root or the service's user; remove it by "
                    "hand if it is the service's" % (root_files.host_path(root, path), info.st_uid))
        if stat.S_ISDIR(info.st_mode):
            _remove_tree(fd, name, root_files.host_path(root, path))
        else:
            root_files.remove(fd, name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return "cannot remove %s: %s" % (getattr(exc, "filename", None) or root_files.host_path(root, path),
                                         exc.strerror or exc)
    except RecursionError:  # a tree its user made deeper than Python recurses
        return "cannot remove %s: nested too deep; remove it by hand" % root_files.host_path(root, path)
    finally:
        os.close(fd)
    return None


def _remove_tree(parent: int, name: str, shown_path: str) -> None:
    """Directory ``name`` of ``parent`` and everything below it removed, each directory entered without following
    a link (safe_fs.step refuses one swapped in meanwhile), each link removed as a link."""
    opened = safe_fs.step(parent, name, shown_path, None)
    try:
        fd = os.open(".", safe_fs.OPEN_FLAGS, dir_fd=opened)
    finally:
        os.close(opened)
    try:
        for entry in os.listdir(fd):
            if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                _remove_tree(fd, entry, os.path.join(shown_path, entry))
            else:
                root_files.remove(fd, entry)
    finally:
        os.close(fd)
    root_files.remove_directory(parent, name)
