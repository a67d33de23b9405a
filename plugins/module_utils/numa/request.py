"""The placement request: each option declared once, every interface built from the table.

``OPTIONS`` is the only place an option's name, type, default and choices are
written. Built from it: ``numa-pin explain``/``exec``'s flags (cli.py), numa_plan's
argument spec (``argument_spec``), the flags a unit's ``ExecStart=`` hands to
``numa-pin exec`` (systemd.py), and the planner's ``Request`` defaults and choices
(placement.py). The role's ``meta/argument_specs.yml``, numa_plan's DOCUMENTATION
and docs/placement.md are text for people; tests/unit/test_request.py holds them to it.

``numa-pin exec`` imports this at every service start: standard library only,
and nothing here imports the planner until a request is built.
"""

from __future__ import annotations

import os

from .engines import ENGINES, GENERIC
from .errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds at every unit start; annotations only
    from typing import Any, Dict, List, Mapping, Optional, Tuple

    from .placement import Request

# Where an option is used: the planner's Request takes it; the model's size is
# measured from it before planning; or numa-pin acts on it at the server's start
# (numa_plan, which only plans, has no such option).
PLANNER = "planner"
SIZING = "sizing"
START = "start"


class Option:
    """One request option as Ansible types it (``kind``, ``elements``) and numa-pin spells it (``flag``)."""

    __slots__ = ("name", "kind", "help", "default", "choices", "elements", "stage")

    def __init__(self, name: str, kind: str, help_text: str, default: Any = None,
                 choices: Optional[Tuple[str, ...]] = None, elements: Optional[str] = None,
                 stage: str = PLANNER) -> None:
        self.name = name
        self.kind = kind
        self.help = help_text
        self.default = default
        self.choices = choices
        self.elements = elements
        self.stage = stage

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def negative_flag(self) -> str:
        """``--no-smt``: how a bool option is turned off on the command line."""
        return "--no-" + self.name.replace("_", "-")

    def fresh_default(self) -> Any:
        """The default, a list copied so no caller shares (and mutates) the table's."""
        return list(self.default) if isinstance(self.default, list) else self.default


# In the order a unit's ExecStart= writes the flags: reordering them rewrites every unit (and restarts it).
OPTIONS = (
    Option("node", "str", "node id to anchor on, or auto: the planner picks"),
    Option("gpus", "raw", "auto, none, a count, or PCI addresses separated by commas", default="auto"),
    Option("model_size", "str", "bytes, a size like 14G, or the model's path (file or directory)"),
    Option("model", "list", "model file or directory the server maps (repeatable): sizes the request when "
                            "--model-size is absent and is checked for page cache on remote nodes",
           default=[], elements="path", stage=SIZING),
    Option("memory_headroom", "str", "added to the model size: a share of it, a size, or their sum ('2G', '0')",
           default="10%+1G"),
    Option("smt", "bool", "use every hardware thread; --no-smt: one thread per physical core", default=True),
    Option("reserve_cpus", "str", "CPU list never handed out (housekeeping), e.g. 0,1"),
    Option("scope", "str", "place on one NUMA node or a whole socket", default="node", choices=("node", "socket")),
    Option("instances", "int", "how many instances of this service run on the host", default=1),
    Option("instance", "int", "which one this is, 0-based", default=0),
    Option("policy", "str", "memory policy; auto binds when the model fits one node", default="auto",
           choices=("auto", "bind", "preferred", "interleave")),
    Option("on_unfit", "str", "what to do when the model fits no single node", default="interleave",
           choices=("interleave", "fail")),
    Option("page_cache", "str", "model pages cached on a remote node: drop them so the server re-reads them "
                                "locally (evict, the default when binding), only report (warn), ignore, or give "
                                "the server a copy of each --model file for its nodes (replicate: needed when "
                                "instances on several nodes map one model)",
           choices=("evict", "warn", "ignore", "replicate"), stage=START),
    Option("replica_dir", "path", "where replicate keeps the per-node copies (default: the unit's "
                                  "$STATE_DIRECTORY)", stage=START),
    Option("port_base", "int", "{port} becomes port_base + instance"),
    Option("anchors", "str", "node of each instance in instance order, e.g. 0,1, as planned at deploy time "
                             "from one snapshot (memory fit is still checked now)"),
    Option("engine", "str", "the inference engine, whose own NUMA switches the plan sets so they agree with "
                            "numa-pin's binding (docs/engines.md)", default=GENERIC, choices=ENGINES),
)
BY_NAME = {option.name: option for option in OPTIONS}
DEFAULTS = {option.name: option.default for option in OPTIONS}
CHOICES = {option.name: option.choices for option in OPTIONS if option.choices}


def check_names(request: Mapping[str, Any]) -> None:
    """Refuse keys that are no request option: a typo would otherwise be dropped silently."""
    unknown = sorted(set(request) - set(BY_NAME))
    if unknown:
        raise NumaError("unknown placement option(s) %s: valid options are %s"
                        % (", ".join(unknown), ", ".join(BY_NAME)))


def check_start_options(request: Mapping[str, Any]) -> None:
    """Refuse a start option that would have nothing to act on, rather than let numa-pin skip it."""
    if request.get("page_cache") == "replicate" and not request.get("model"):
        raise NumaError("page_cache replicate copies the model files for each node, but no model is given: "
                        "set model to the files the server maps (numa-pin: --model PATH), or choose "
                        "another page_cache")


def argument_spec() -> Dict[str, Dict[str, Any]]:
    """The request part of numa_plan's argument spec: what the planner and the model sizing take."""
    spec = {}
    for option in OPTIONS:
        if option.stage == START:
            continue
        entry: Dict[str, Any] = {"type": option.kind}
        if option.elements:
            entry["elements"] = option.elements
        if option.choices:
            entry["choices"] = list(option.choices)
        if option.default is not None:
            entry["default"] = option.fresh_default()
        spec[option.name] = entry
    return spec


def module_args(request: Mapping[str, Any]) -> Dict[str, Any]:
    """numa_plan's arguments for a request (a role's dict, None = unset): the options set that it takes."""
    check_names(request)
    check_start_options(request)
    return {option.name: _module_value(option, request[option.name]) for option in OPTIONS
            if option.stage != START and request.get(option.name) is not None}


def _module_value(option: Option, value: Any) -> Any:
    # A node id written as a YAML number; one model path, which Ansible's list type would split at commas.
    if option.kind == "str":
        return str(value)
    if option.kind == "list" and isinstance(value, str):
        return [value]
    return value


def build_request(options: Mapping[str, Any]) -> Request:
    """A placement Request from CLI/module options; a model path is measured here.

    ``model_size`` may be bytes, a size string or a path; with no size, the
    ``model`` paths are measured. This is the only I/O before planning.
    """
    from .placement import Request

    check_start_options(options)
    chosen = {option.name: options.get(option.name) for option in OPTIONS if option.stage == PLANNER}
    if chosen["node"] == "auto":
        chosen["node"] = None
    chosen["model_size"] = _model_size(chosen["model_size"], options.get("model") or [])
    return Request.from_options(chosen)


def _model_size(model_size: Any, models: List[str]) -> Any:
    """A path measured in bytes; sizes ("14G", bytes) go on to the Request, which parses them."""
    from .sizes import size_of_path

    if model_size is None:
        return sum(size_of_path(path) for path in models) if models else None
    if isinstance(model_size, str) and (os.sep in model_size or os.path.exists(model_size)):
        return size_of_path(model_size)
    return model_size
