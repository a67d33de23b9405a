# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of the preflight: the roles' variables and service entries checked against the
roles' own argument specs (meta/argument_specs.yml, the one place options are described), each problem one line
that names the variable (and service and key), the cause and the fix.

Each value is checked alone, so every problem of a run is named at once (Ansible's own role check stops at
the first and prints the whole spec after it), and a typo'd key is named with the valid key closest to it, as is
a variable of the play very close to a role's option. Beyond its type, each value is checked by the rule that
would refuse it later, after hosts were changed: a service's name by the unit filter's own function, its
``health_url`` as the readiness probe reads it, its ``ab_gate`` against inputs/gate (the table numa_rollout
checks it with), its traffic hooks as argv lists with only the hooks' tokens, a ``{port}`` or a gate against its
``port_base``; NaN and the infinities pass no bound.
Checked values come back converted (``-e numa_host_metrics=false`` is the boolean false on every core), so
the roles convert once, here, and never per task.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from typing import Any, Callable, Collection, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import yaml

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.base import containers, tokens
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError, shown
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.sizes import finite_number, parse_size
from ansible_collections.inferops.numa.plugins.module_utils.numa.inputs import gate
from ansible_collections.inferops.numa.plugins.module_utils.numa.read.kernel_files import printable

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = ("numa_host", "inference_service")
# Every variable of the roles starts with one of these: a name that does and that they have not is a typo.
PREFIXES = ("numa_host_", "inference_service_")
# A variable without the prefixes is taken for a typo of an option only this close to it (difflib's ratio: a
# character or two off in a name of 15 or more, as inference_services_list or numa_hots_balancing).
CLOSE_CUTOFF = 0.9
# Ansible's own variables without the ansible_ prefix ("Special variables"); a private one starts with "_".
MAGIC_VARIABLES = frozenset(("groups", "group_names", "hostvars", "inventory_dir", "inventory_file",
                             "inventory_hostname", "inventory_hostname_short", "omit", "play_hosts", "playbook_dir",
                             "role_name", "role_names", "role_path", "role_uuid", "environment", "vars"))
ENTRIES = "inference_service_list"
ENTRY_DEFAULTS = "inference_service_defaults"
# Bounds an argument spec cannot say: (lowest, highest), None for no bound.
RANGES = {
    "numa_host_metrics_period_seconds": (10, 86400),
    "numa_host_metrics_drift_interval_seconds": (0, None),
    "numa_host_zone_reclaim_mode": (0, 7),
    "inference_service_audit_wait_seconds": (0, 86400),
    "inference_service_restart_batch": (1, None),
    "inference_service_ready_seconds": (1, 86400),
    "inference_service_audit_settle_seconds": (0, 86400),
}
ENTRY_RANGES = {
    "port_base": (1, 65535),
    "restart_sec": (0, None),
    "min_local_percent": (0, 100),
    "hook_seconds": (1, 86400),
    "drain_seconds": (0, 86400),
    "stop_timeout_seconds": (1, 86400),
}
# What the unit template writes of an entry, checked as its filters check it (act/unit_text), so a value the unit
# cannot hold is named before any host is changed, not when the template renders.
UNIT_CHECKS = {
    "name": unit_text.unit_prefix,  # the systemd_unit_prefix filter's rule: the role names every unit with it
    "command": unit_text.command_args,
    "environment": unit_text.environment_lines,
    "description": lambda value: unit_text.setting_value(value, "description"),
    "user": lambda value: unit_text.account_name(value, "user"),
    "group": lambda value: unit_text.account_name(value, "group"),
    "working_directory": lambda value: unit_text.path_value(value, "working_directory"),
    "read_write_paths": lambda paths: [unit_text.path_value(path, "read_write_paths entry") for path in paths],
    "extra_settings": lambda settings: [unit_text.extra_setting_value(settings[unit_text.setting_name(name)], name)
                                        for name in settings],
}
# A container's command: the arguments after the image, checked as the unit writes them.
CONTAINER_UNIT_CHECKS = {"command": unit_text.exec_args}
GATE = "ab_gate"
CONTAINER = "container"
# What a container service's unit is, whatever the defaults say: root, no account made, no sandbox.
CONTAINER_FIXED = {"user": "root", "group": "root", "create_user": False, "hardening": False}
PORT_TOKEN = "{port}"
# Printable ASCII without spaces: a URL (http.client sends its path as it is), a key quoted as it is.
_WORD = re.compile(r"^[!-~]+$")
URL_EXAMPLE = "http://127.0.0.1:%s/health" % PORT_TOKEN
# libyaml's loader where PyYAML has it: the pure-Python one takes 40 ms over an argument spec, once per host and task.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
TYPE_WORDS = {"bool": "true or false", "int": "a whole number", "float": "a number", "str": "a string",
              "path": "a path", "list": "a list", "dict": "a mapping", "raw": "a value"}


def role_options(role: str) -> Dict[str, Any]:
    """The options of ``role``'s main entry point, from its meta/argument_specs.yml (read once per process;
    not to be changed by the caller)."""
    return role_file(role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]


@functools.lru_cache(maxsize=None)
def role_file(role: str, kind: str, name: str) -> Any:
    """One of the roles' YAML files, parsed (None when the role has no such file)."""
    path = os.path.join(COLLECTION, "roles", role, kind, name)
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return yaml.load(handle, Loader=_YAML_LOADER)  # nosec B506: a SafeLoader, C or Python


def check_value(name: str, value: Any, spec: Mapping[str, Any],
                bounds: Optional[Tuple[Optional[float], Optional[float]]] = None) -> Tuple[Any, Optional[str]]:
    """(the value converted to its spec's type, None) or (value, "cause; fix") for one option."""
    single = {key: val for key, val in spec.items() if key not in ("options", "required", "default")}
    try:
        result = ArgumentSpecValidator({name: single}).validate({name: plain(value)})
    except (OverflowError, ValueError):  # an infinity made an int, an int past str()'s digits: the validator raises
        return value, "%s cannot be converted; %s" % (quoted(value), _fix(spec))
    errors = list(result.errors.errors)
    if errors and type(errors[0]).__name__ == "ArgumentValueError" and spec.get("choices"):
        return value, "%s is not one of its choices; %s" % (quoted(value), _fix(spec))
    if errors:
        return value, "%s; %s" % (printable(str(errors[0])), _fix(spec))
    converted = result.validated_parameters[name]
    low, high = bounds or (None, None)
    if isinstance(converted, float) and not finite_number(converted):
        # NaN compares false with every bound, so it would pass them all; an infinity is no setting either.
        wanted = _range_words(low, high) if bounds else "a number"
        return value, "%s is not a finite number; give %s" % (converted, wanted)
    # Written as "not within", so a value no bound compares with is out of range, never in it.
    if converted is not None and not ((low is None or low <= converted) and (high is None or converted <= high)):
        return value, "%s is out of range; give %s" % (quoted(converted), _range_words(low, high))
    return converted, None


def quoted(value: Any) -> str:
    """A value as a problem line quotes it: short (shown) and printable ASCII, so the line stays one line."""
    return printable(shown(value))


def plain(value: Any) -> Any:
    """value as plain dicts, lists, str, int and float: the validator deep-copies what it checks, and a filter's
    argument on ansible-core 2.19+ is a lazy container whose copy drags the templar (and its plugin loaders) along."""
    if isinstance(value, Mapping):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    for kind in (bool, str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


def _fix(spec: Mapping[str, Any]) -> str:
    if spec.get("choices"):
        return "use one of: %s" % ", ".join(str(choice) for choice in spec["choices"])
    kind = TYPE_WORDS.get(str(spec.get("type", "raw")), "a %s" % spec.get("type"))
    if spec.get("type") == "list" and spec.get("elements"):
        kind += " of %ss" % spec["elements"]
    return "give %s" % kind


def _range_words(low: Optional[float], high: Optional[float]) -> str:
    if high is None:
        return "%s or more" % low
    if low is None:
        return "%s or less" % high
    return "a value from %s to %s" % (low, high)


def unknown_key(key: str, known: Sequence[str]) -> str:
    """"cause; fix" for a key no spec has, naming the closest valid one."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    fix = "did you mean %s?" % close[0] if close else "valid keys: %s" % ", ".join(sorted(known))
    return "no such key; %s" % fix


def check_settings(values: Mapping[str, Any], unknown: Sequence[str] = ()) -> Tuple[Dict[str, Any], List[str]]:
    """The roles' variables (name -> value as given; a missing one takes its spec's default) converted, and a
    problem line for each bad one and each name in ``unknown`` (variables set with a role's prefix that it has
    not)."""
    settings = {}  # type: Dict[str, Any]
    problems = []  # type: List[str]
    options = {}  # type: Dict[str, Any]
    for role in ROLES:
        options.update(role_options(role))
    for name, spec in options.items():
        if name not in values:
            default = spec.get("default")
            if not (isinstance(default, str) and "{{" in default):  # a templated default is the role's to render
                settings[name] = default
            continue
        converted, problem = check_value(name, values[name], spec, RANGES.get(name))
        settings[name] = converted
        if problem:
            problems.append("%s: %s" % (name, problem))
    for name in unknown:
        if name not in options:
            problems.append("%s: %s" % (name, unknown_key(name, list(options))))
    return settings, problems


def close_variables(names: Iterable[Any], own: Collection[str]) -> List[str]:
    """"NAME: no such variable; did you mean OPTION?" for each of ``names`` (the play's variables) that is none of
    the roles' own (``own``: their options, defaults, vars and facts) and not Ansible's, yet very close to a
    role's option: inference_services_list would deploy nothing, and every task would say ok."""
    options = [option for role in ROLES for option in role_options(role)]
    problems = []  # type: List[str]
    for name in sorted(name for name in names if isinstance(name, str)):
        if name in own or name in MAGIC_VARIABLES or name.startswith(("ansible_", "_") + PREFIXES):
            continue  # a prefixed name the roles have not is check_settings' unknown one
        close = difflib.get_close_matches(name, options, n=1, cutoff=CLOSE_CUTOFF)
        if close:
            problems.append("%s: no such variable; did you mean %s?" % (printable(name), close[0]))
    return problems


def check_entries(entries: Any, defaults: Any) -> Tuple[List[Dict[str, Any]], List[str]]:
    """inference_service_list's entries with their defaults merged (the spec's, then ``defaults``, then the
    entry's) and converted, and a problem line for each bad key ("service NAME: key: cause; fix")."""
    spec = role_options("inference_service")[ENTRIES]["options"]
    if not isinstance(entries, list):
        return [], ["%s: is %s, not a list; give a list of service entries" % (ENTRIES, type(entries).__name__)]
    if not isinstance(defaults, dict):
        return [], ["%s: is %s, not a mapping; give the keys every entry shares" % (
            ENTRY_DEFAULTS, type(defaults).__name__)]
    problems = ["%s: %s: %s" % (ENTRY_DEFAULTS, _key(key), unknown_key(str(key), list(spec))) for key in defaults
                if key not in spec]
    merged = []
    names = []  # type: List[str]
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append("%s[%d]: is %s, not a mapping; give name, command and the service's keys" % (
                ENTRIES, index, type(entry).__name__))
            continue
        # A key of the defaults that no spec has is named once, above, not for every entry.
        given = {key: value for key, value in defaults.items() if key in spec}
        given.update(entry)
        checked, entry_problems = _check_entry(given, spec)
        problems += ["%s: %s" % (_label(entry.get("name"), index), problem) for problem in entry_problems]
        if not entry_problems:
            merged.append(checked)
            names.append(checked["name"])
    problems += ["service %s: name: given to %d entries; give each service its own name" % (name, names.count(name))
                 for name in sorted(set(names)) if names.count(name) > 1]
    return merged, problems


def _label(name: Any, index: int) -> str:
    """"service NAME" for a name the units can carry, else the entry's place: a bad name is quoted once, in its
    own problem, not at the head of every line."""
    try:
        return "service %s" % unit_text.unit_prefix(name)
    except NumaError:
        return "%s[%d]" % (ENTRIES, index)


def _key(key: Any) -> str:
    """A key as a problem line names it: as it is when it is a short word, else quoted."""
    return key if isinstance(key, str) and _WORD.match(key) and len(key) <= 40 else quoted(key)


def _check_entry(entry: Mapping[str, Any], spec: Mapping[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    checked = {}  # type: Dict[str, Any]
    problems = []  # type: List[str]
    bad = set()
    # A service to take back needs its name alone; one to deploy, its command too (a container, its image's).
    required = ("name",) if entry.get("state") == ABSENT or entry.get(CONTAINER) is not None else ("name", "command")
    for key, option in spec.items():
        if key not in entry or entry[key] is None:
            if key in required:
                problems.append("%s: missing; %s" % (key, option.get("description", "required")
                                                     if isinstance(option.get("description"), str) else "give it"))
                bad.add(key)
            checked[key] = option.get("default")
            continue
        checked[key], found = _check_key(key, entry[key], option, entry.get(CONTAINER) is not None)
        problems += ["%s: %s" % (key, problem) for problem in found]
        if found:
            bad.add(key)
    problems += _across_keys(checked, bad)
    problems += ["%s: %s" % (_key(key), unknown_key(str(key), list(spec))) for key in entry if key not in spec]
    if checked.get(CONTAINER) is not None and not bad & {CONTAINER, "command", "environment", "name"}:
        problems += _containerize(checked, entry)
    return checked, problems


def _containerize(checked: Dict[str, Any], entry: Mapping[str, Any]) -> List[str]:
    """Turn a checked container entry into the service the unit runs (base/containers.run_argv): its command the
    runtime's ``run`` of the image, as root without an account or sandbox, the unit type and settings the runtime
    needs unless the entry gives them; "key: cause; fix" for what a container service cannot take."""
    spec = checked[CONTAINER]
    chosen = containers.runtime(spec["runtime"])
    problems = ["%s: cannot be given with container: the runtime runs as root and isolates the server itself "
                "(rootful %s); remove %s" % (key, chosen.name, key)
                for key, kept in CONTAINER_FIXED.items() if key in entry and entry[key] != kept]
    checked.update(CONTAINER_FIXED)
    spec["program"] = spec.get("program") or chosen.program
    try:
        checked["command"] = containers.run_argv(spec, checked["name"], checked.get("command") or [],
                                                 sorted(checked.get("environment") or {}))
        unit_text.command_args(checked["command"])
    except NumaError as exc:
        return problems + ["%s: %s" % (CONTAINER, printable(str(exc)))]
    if "type" not in entry:
        checked["type"] = chosen.unit_type
    checked["extra_settings"] = dict(chosen.unit_settings, **(checked.get("extra_settings") or {}))
    return problems


def check_size(value: Any, what: str) -> Tuple[Any, List[str]]:
    """(the size in bytes, []) or (value, ["cause; fix"]) for a size above 0 (base/sizes.parse_size's syntax)."""
    try:
        size = parse_size(value)
    except NumaError as exc:
        return value, ["%s; give %s" % (printable(str(exc)), what)]
    return (size, []) if size > 0 else (value, ["is 0; give %s" % what])


def check_container(values: Any) -> Tuple[Any, List[str]]:
    """An entry's container against its options in the role's argument spec: (the keys converted, their defaults
    filled; "key: cause; fix" for each unknown key, missing image, wrong type or choice)."""
    if not isinstance(values, dict):
        return values, ["is %s, not a mapping; give runtime, image and the container's keys" % type(values).__name__]
    spec = role_options("inference_service")[ENTRIES]["options"][CONTAINER]["options"]
    converted = {}  # type: Dict[str, Any]
    problems = ["%s: %s" % (_key(key), unknown_key(str(key), list(spec))) for key in values if key not in spec]
    for key, option in spec.items():
        if values.get(key) is None:
            converted[key] = option.get("default")
            problems += ["image: missing; give the image to run"] if option.get("required") else []
            continue
        converted[key], problem = check_value(key, values[key], option)
        problems += ["%s: %s" % (key, problem)] if problem else []
    return converted, problems


def _check_key(key: str, value: Any, option: Mapping[str, Any], containerized: bool = False) -> Tuple[Any, List[str]]:
    """(the value converted, its problems): its type, then what the unit or the role does with it (a container's
    command is the arguments after its image)."""
    if key in HOOKS:  # before conversion: the validator would split a string on its commas into a list
        found = check_hook(value)
        if found:
            return value, found
    converted, problem = check_value(key, value, option, ENTRY_RANGES.get(key))
    if problem:
        return converted, [problem]
    if key in VALUE_CHECKS:
        return VALUE_CHECKS[key](converted)
    checks = CONTAINER_UNIT_CHECKS if containerized and key in CONTAINER_UNIT_CHECKS else UNIT_CHECKS
    if key in checks:
        try:
            checks[key](converted)
        except NumaError as exc:
            return converted, [printable(str(exc))]
    return converted, []


def check_gate(values: Mapping[Any, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """An entry's ab_gate against inputs/gate, the table numa_rollout's argument spec is built from: (the keys
    given, converted; "key: cause; fix" for each unknown key, wrong type or choice, then for each bound broken)."""
    spec = gate.argument_spec()
    converted = {}  # type: Dict[str, Any]
    problems = []  # type: List[str]
    for key, value in values.items():
        if key not in spec:
            problems.append("%s: %s" % (_key(key), unknown_key(str(key), list(spec))))
        elif value is None:
            converted[key] = None  # the gate's default, as numa_rollout takes it
        else:
            converted[key], problem = check_value(key, value, spec[key])
            problems += ["%s: %s" % (key, problem)] if problem else []
    # The bounds are the gate's own (what numa_rollout would refuse after the restart), over its defaults.
    return converted, problems or gate.problems(gate.merged(converted))


def check_url(url: str) -> List[str]:
    """"cause; fix" when ``url`` is no URL the readiness probe can ask (act/rollout: http or https, with a host),
    its ``{port}`` filled in as base/engines.health_url fills it."""
    if not _WORD.match(url):
        return ["%s holds a space, a control or a non-ASCII character; give the URL percent-encoded, like %s"
                % (quoted(url), URL_EXAMPLE)]
    try:
        parts = urlsplit(url.replace(PORT_TOKEN, "1"))
        port = parts.port  # ValueError for a port that is none (not a number, past 65535)
    except ValueError as exc:
        return ["%s is not a URL (%s); give one like %s" % (quoted(url), printable(str(exc)), URL_EXAMPLE)]
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return ["%s is not an http or https URL with a host; give one like %s" % (quoted(url), URL_EXAMPLE)]
    if port == 0:
        return ["%s asks port 0, where no server listens; give the instance's port, %s" % (quoted(url), PORT_TOKEN)]
    unfilled = ["{%s}" % token for token in tokens.TOKENS if "{%s}" % token in url and "{%s}" % token != PORT_TOKEN]
    if unfilled:
        return ["%s uses %s, which the probe does not fill in (only %s); give the instance's URL with %s"
                % (quoted(url), ", ".join(unfilled), PORT_TOKEN, PORT_TOKEN)]
    return []


HOOKS = ("drain_command", "undrain_command")
HOOK_EXAMPLE = '["socat", "stdio", "/run/haproxy.sock"]'


def check_hook(argv: Any) -> List[str]:
    """"cause; fix" for a traffic hook numa_rollout could not run as it is meant: not a list of strings (a string
    is no argv: nothing splits it as a shell would), an empty program, or a {token} that is none of the hooks'
    (base/tokens.HOOK_TOKENS), which would reach the load balancer as it is."""
    argv = plain(argv)
    if not isinstance(argv, list) or not all(isinstance(arg, str) for arg in argv):
        return ["%s is not a list of strings; give the command as an argv list (no shell), like %s"
                % (quoted(argv), HOOK_EXAMPLE)]
    if argv and not argv[0]:
        return ["its program (the first item) is empty; give the program to run, like %s" % HOOK_EXAMPLE]
    unknown = tokens.unknown_tokens(argv)
    if unknown:
        known = ", ".join("{%s}" % token for token in tokens.HOOK_TOKENS)
        return ["%s: no such token; a hook's tokens are %s" % (printable(", ".join(unknown)), known)]
    return []


# Checks of a converted value that return (the value, its problems): the A/B gate's keys against inputs/gate, the
# readiness URL against what the probe asks.
VALUE_CHECKS = {
    GATE: check_gate,
    CONTAINER: check_container,
    "bytes_per_token": lambda value: check_size(value, "the weights a token reads, like 12G"),
    "health_url": lambda url: (url, check_url(url)),
}  # type: Dict[str, Callable[[Any], Tuple[Any, List[str]]]]


def _across_keys(checked: Mapping[str, Any], bad: Collection[str]) -> List[str]:
    """What one key asks of another: a port for the A/B gate and for each {port} token."""
    if checked.get("port_base") is not None or "port_base" in bad:
        return []
    problems = []  # type: List[str]
    if checked.get(GATE) is not None and GATE not in bad:
        problems.append("%s: needs port_base, the port the gate measures each instance at; set port_base, or "
                        "remove %s" % (GATE, GATE))
    for key in ("command", "health_url") + HOOKS:
        if checked.get(key) is not None and key not in bad:
            problems += ["%s: %s" % (key, problem) for problem in port_problems(checked[key])]
    return problems


def port_problems(words: Any) -> List[str]:
    """"cause; fix" when ``words`` (a command, or one URL) use {port} and the service has no port_base: the rule
    numa-pin and the role fill the tokens by (base/tokens.substitute_tokens), given every token but the port."""
    plan = {token: 0 for token in tokens.TOKENS if "{%s}" % token != PORT_TOKEN}
    try:
        tokens.substitute_tokens([words] if isinstance(words, str) else list(words), plan)
    except NumaError as exc:
        return [printable(str(exc))]
    return []


ABSENT = "absent"

# Facts the roles' tasks set under their prefix (inference_service/tasks/main.yml).
ROLE_FACTS = ("inference_service_entries",)


def option_names() -> List[str]:
    """The options of both roles' main entry points (their argument specs)."""
    names = []  # type: List[str]
    for role in ROLES:
        names += list(role_options(role))
    return names


def role_own_vars() -> FrozenSet[str]:
    """Every variable the roles define themselves (defaults, vars): only a name outside these is a typo."""
    names = list(option_names()) + list(ROLE_FACTS)
    for role in ROLES:
        for kind in ("defaults", "vars"):
            names += list(role_file(role, kind, "main.yml") or {})
    return frozenset(names)
