# -*- coding: utf-8 -*-
# Copyright: inferops.numa contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of the preflight: the roles' variables and service entries checked against the
roles' own argument specs (meta/argument_specs.yml, the one place options are described), each problem one line
that names the variable (and service and key), the cause and the fix.

Each value is checked alone, so every problem of a run is named at once (Ansible's own role check stops at
the first and prints the whole spec after it), and a typo'd key is named with the valid key closest to it.
Checked values come back converted (``-e numa_host_metrics=false`` is the boolean false on every core), so
the roles convert once, here, and never per task.
"""

from __future__ import annotations

import difflib
import functools
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.inferops.numa.plugins.module_utils.numa.act import unit_text
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = ("numa_host", "inference_service")
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
}
# What the unit template writes of an entry, checked as its filters check it (act/unit_text), so a value the unit
# cannot hold is named before any host is changed, not when the template renders.
UNIT_CHECKS = {
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
    result = ArgumentSpecValidator({name: single}).validate({name: plain(value)})
    errors = list(result.errors.errors)
    if errors and type(errors[0]).__name__ == "ArgumentValueError" and spec.get("choices"):
        return value, "%r is not one of its choices; %s" % (value, _fix(spec))
    if errors:
        return value, "%s; %s" % (errors[0], _fix(spec))
    converted = result.validated_parameters[name]
    low, high = bounds or (None, None)
    if converted is not None and ((low is not None and converted < low) or (high is not None and converted > high)):
        return value, "%s is out of range; give %s" % (converted, _range_words(low, high))
    return converted, None


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


def check_entries(entries: Any, defaults: Any) -> Tuple[List[Dict[str, Any]], List[str]]:
    """inference_service_list's entries with their defaults merged (the spec's, then ``defaults``, then the
    entry's) and converted, and a problem line for each bad key ("service NAME: key: cause; fix")."""
    spec = role_options("inference_service")[ENTRIES]["options"]
    if not isinstance(entries, list):
        return [], ["%s: is %s, not a list; give a list of service entries" % (ENTRIES, type(entries).__name__)]
    if not isinstance(defaults, dict):
        return [], ["%s: is %s, not a mapping; give the keys every entry shares" % (
            ENTRY_DEFAULTS, type(defaults).__name__)]
    problems = ["%s: %s: %s" % (ENTRY_DEFAULTS, key, unknown_key(key, list(spec))) for key in defaults
                if key not in spec]
    merged = []
    names = []  # type: List[str]
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append("%s[%d]: is %s, not a mapping; give name, command and the service's keys" % (
                ENTRIES, index, type(entry).__name__))
            continue
        label = "service %s" % entry["name"] if isinstance(entry.get("name"), str) else "%s[%d]" % (ENTRIES, index)
        # A key of the defaults that no spec has is named once, above, not for every entry.
        known_defaults = {key: value for key, value in defaults.items() if key in spec}
        checked, entry_problems = _check_entry(dict(known_defaults, **entry), spec)
        problems += ["%s: %s" % (label, problem) for problem in entry_problems]
        if not entry_problems:
            merged.append(checked)
            names.append(checked["name"])
    problems += ["service %s: name: given to %d entries; give each service its own name" % (name, names.count(name))
                 for name in sorted(set(names)) if names.count(name) > 1]
    return merged, problems


def _check_entry(entry: Mapping[str, Any], spec: Mapping[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    checked = {}  # type: Dict[str, Any]
    problems = []  # type: List[str]
    for key, option in spec.items():
        if key not in entry or entry[key] is None:
            if option.get("required"):
                problems.append("%s: missing; %s" % (key, option.get("description", "required")
                                                     if isinstance(option.get("description"), str) else "give it"))
            checked[key] = option.get("default")
            continue
        checked[key], problem = check_value(key, entry[key], option, ENTRY_RANGES.get(key))
        if problem:
            problems.append("%s: %s" % (key, problem))
        elif key in UNIT_CHECKS:
            try:
                UNIT_CHECKS[key](checked[key])
            except NumaError as exc:
                problems.append("%s: %s" % (key, exc))
    problems += ["%s: %s" % (key, unknown_key(key, list(spec))) for key in entry if key not in spec]
    return checked, problems
