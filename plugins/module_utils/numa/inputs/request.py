"""The placement request: each option declared once, every interface built from the table.

``OPTIONS`` is the only place an option's name, type, default and choices are
written. Built from it: ``numa-pin explain``/``exec``'s flags (cli.py), numa_plan's
argument spec (``argument_spec``), the flags a unit's ``ExecStart=`` hands to
``numa-pin exec`` (unit_text.py), and ``Request``, the checked request the planner
(placement.py) takes: its fields, defaults and choices, and the validators that bound
every value before the planner loops over it. The role's ``meta/argument_specs.yml``, numa_plan's DOCUMENTATION
and docs/placement.md are text for people; tests/unit/test_request.py holds them to it.

``numa-pin exec`` imports this at every service start: standard library only, no
``re`` until a GPU is given by PCI address, no ``fractions`` until a headroom has
decimals. The planner imports this module; this module never imports the planner.
"""

from __future__ import annotations

import os

from ..base.cpulist import MAX_CPUS, MAX_NODES, parse_cpulist
from ..base.containers import RUNTIMES as CONTAINER_RUNTIMES
from ..base.engines import ENGINES, GENERIC
from ..base.errors import NumaError, shown
from ..base.sizes import MAX_BYTES, decimal_digits, format_size, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds at every unit start; annotations only
    from fractions import Fraction
    from typing import Any, Collection, Dict, List, Mapping, Optional, Tuple, Union


# Where an option is used: the planner's Request takes it; the model's size is
# measured from it before planning; or numa-pin acts on it at the server's start
# (numa_plan, which only plans, has no such option).
PLANNER = "planner"
SIZING = "sizing"
START = "start"


class Option:
    """One request option as Ansible types it (``kind``, ``elements``) and numa-pin spells it (``flag``)."""

    __slots__ = ("name", "kind", "help", "default", "choices", "elements", "stage", "recorded_default")

    def __init__(self, name: str, kind: str, help_text: str, default: Any = None,
                 choices: Optional[Collection[str]] = None, elements: Optional[str] = None,
                 stage: str = PLANNER, recorded_default: bool = True) -> None:
        self.name = name
        self.kind = kind
        self.help = help_text
        self.default = default
        self.choices = choices
        self.elements = elements
        self.stage = stage
        # False for a planner option added after plan records were first written: a request leaves it out at its
        # default (Request.to_dict), so the records of plans that do not use it stay as written and restart nothing.
        self.recorded_default = recorded_default

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
    Option("cores", "str", "which CPUs of a node: all, or only its fastest kind (hybrid parts, Priority Core Turbo; "
                           "the facts' cpus.kinds)", default="all", choices=("all", "fast"), recorded_default=False),
    Option("reserve_cpus", "str", "CPU list never handed out (housekeeping), e.g. 0,1"),
    Option("scope", "str", "place on one NUMA node or a whole socket", default="node", choices=("node", "socket")),
    Option("instances", "int", "how many instances of this service run on the host", default=1),
    Option("instance", "int", "which one this is, 0-based", default=0),
    Option("policy", "str", "memory policy; auto binds when the model fits one node, interleaves (weighted where the "
                            "kernel's weights differ) when it does not", default="auto",
           choices=("auto", "bind", "preferred", "interleave", "weighted_interleave")),
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
                            "numa-pin's binding (docs/engines.md)", default=GENERIC,
           # The table's keys, a live view: an engine whose record is added there is a choice everywhere.
           choices=ENGINES.keys()),
    Option("container_runtime", "str", "the container runtime whose `run` command the server's argv is: the plan's "
                                       "cpuset, environment and GPUs are put after its `run` (docs/containers.md)",
           choices=CONTAINER_RUNTIMES.keys(), stage=START),
)
BY_NAME = {option.name: option for option in OPTIONS}
DEFAULTS = {option.name: option.default for option in OPTIONS}
CHOICES = {option.name: option.choices for option in OPTIONS if option.choices}


# Every number a request holds is bounded before anything loops over it or multiplies it: instances
# by MAX_CPUS (an instance needs a CPU), node ids by MAX_NODES, as the kernel bounds them (cpulist.py).
MAX_PORT = 65535
# GPUs per instance: far beyond any host (the planner then names how many this one has).
MAX_GPUS = 1024

# Compiled only for GPUs given by address, the one request that needs a regex.
_PCI_ADDRESS = r"^(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$"


def copied(value: Any) -> Any:
    """A copy of JSON-like data (as dataclasses.asdict made): the caller may change it."""
    if isinstance(value, list):
        return [copied(item) for item in value]
    if isinstance(value, dict):
        return {key: copied(item) for key, item in value.items()}
    return value


class Request:
    """What the caller wants. Loose inputs (strings from a CLI, None from Ansible) are
    normalised and checked on construction; a bad value raises NumaError naming it.

    gpus: "auto" (instance i gets the i-th GPU in PCI order, round-robin), "none",
    a count N (instance i gets GPUs i*N .. i*N+N-1) or a list of PCI addresses.
    model_size: bytes (or a size string such as "14G"); None skips the fit check.
    memory_headroom: added to model_size: "P%" of the model, a size, or a sum of
    both ("10%+1G"; "2G"; "0").
    reserve_cpus: a cpu list string or cpu numbers; None reserves none.
    Every number is bounded (MAX_CPUS, MAX_NODES, MAX_PORT, MAX_GPUS, sizes.MAX_BYTES) before
    the planner loops over or multiplies it; plan() then holds instances to the host's usable CPUs.
    Fields, defaults and choices are OPTIONS', the table every interface is built from.
    """

    # The planner's options in the table's order: the keyword arguments, attributes and to_dict() keys.
    FIELDS = tuple(option.name for option in OPTIONS if option.stage == PLANNER)

    node: Optional[int]
    gpus: Union[str, int, List[str]]
    model_size: Optional[int]
    memory_headroom: str
    smt: bool
    cores: str
    reserve_cpus: List[int]
    scope: str
    instances: int
    instance: int
    policy: str
    on_unfit: str
    port_base: Optional[int]
    anchors: Optional[List[int]]
    engine: str

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.FIELDS))
        if unknown:
            raise TypeError("Request() got unexpected keyword argument(s) %s" % ", ".join(unknown))
        for name in self.FIELDS:
            setattr(self, name, options.get(name, DEFAULTS[name]))
        self.node = None if self.node is None else _int("node", self.node, 0, MAX_NODES - 1)
        self.gpus = _gpu_selection(self.gpus)
        self.model_size = None if self.model_size is None else _size("model_size", self.model_size)
        self.memory_headroom = _headroom_text(self.memory_headroom)
        _check_required_bytes(self)
        self.smt = _boolean("smt", self.smt)
        self.cores = _choice("cores", self.cores, CHOICES["cores"])
        self.reserve_cpus = [] if self.reserve_cpus is None else _cpu_ids("reserve_cpus", self.reserve_cpus)
        self.scope = _choice("scope", self.scope, CHOICES["scope"])
        self.instances = _int("instances", self.instances, 1, MAX_CPUS)
        self.instance = _int("instance", self.instance, 0, MAX_CPUS - 1)
        if self.instance >= self.instances:
            raise NumaError("instance %d is out of range for instances=%d: instances are numbered "
                            "0..%d" % (self.instance, self.instances, self.instances - 1))
        self.policy = _choice("policy", self.policy, CHOICES["policy"])
        self.on_unfit = _choice("on_unfit", self.on_unfit, CHOICES["on_unfit"])
        self.engine = _choice("engine", self.engine, CHOICES["engine"])
        self.port_base = _port_base(self.port_base, self.instances)
        self.anchors = _anchors(self.anchors, self.instances, self.node)

    @classmethod
    def from_options(cls, options: Dict[str, Any]) -> "Request":
        """Build from a dict of option names to values; None means "use the default"."""
        unknown = sorted(set(options) - set(cls.FIELDS))
        if unknown:
            raise NumaError("unknown placement option(s) %s: valid options are %s"
                            % (", ".join(unknown), ", ".join(cls.FIELDS)))
        return cls(**{name: value for name, value in options.items() if value is not None})

    def headroom_bytes(self) -> Optional[int]:
        """Bytes added to model_size, or None when the model size is unknown."""
        if self.model_size is None:
            return None
        percent, fixed = parse_headroom(self.memory_headroom)
        return -(-self.model_size * percent // 100) + fixed  # the percentage rounded up, exactly

    def required_bytes(self) -> Optional[int]:
        """model_size + headroom, or None when the model size is unknown."""
        if self.model_size is None:
            return None
        return self.model_size + self.headroom_bytes()

    def to_dict(self) -> Dict[str, Any]:
        return {name: copied(getattr(self, name)) for name in self.FIELDS
                if BY_NAME[name].recorded_default or getattr(self, name) != DEFAULTS[name]}


def parse_headroom(text: str) -> Tuple[Union[int, Fraction], int]:
    """``"10%+1G"`` -> (10, 1073741824): percent of the model, fixed bytes.

    The percentage is exact: an int, or a Fraction when it has decimals ("12.5%"; only
    then is fractions imported).
    """
    if not isinstance(text, str) or not text.strip():
        raise NumaError("memory_headroom %s is not a size: write e.g. '10%%+1G', '2G' or '0'" % shown(text))
    percent = 0  # type: Union[int, Fraction]
    fixed = 0
    for term in text.split("+"):
        term = term.strip()
        number = decimal_digits(term[:-1].rstrip()) if term.endswith("%") else None
        if number is not None:
            percent += _exact(*number)
            continue
        try:
            fixed += parse_size(term)
        except NumaError:
            raise NumaError("cannot read memory_headroom %s: term %s is neither a percentage "
                            "nor a size; write e.g. '10%%+1G', '2G' or '0'" % (shown(text), shown(term)))
    return percent, fixed


def _exact(digits: int, decimals: int) -> Union[int, Fraction]:
    """The number ``digits`` / 10**``decimals``: an int when whole, else a Fraction."""
    if not decimals:
        return digits
    from fractions import Fraction

    return Fraction(digits, 10 ** decimals)


def _headroom_text(value: Union[str, int]) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(parse_size(value))
    parse_headroom(value)
    return value.strip()


def _check_required_bytes(request: Request) -> None:
    required = request.required_bytes()
    if required is not None and required >= MAX_BYTES:
        raise NumaError("model_size %s plus memory_headroom %s needs 16 EiB or more, beyond what a 64-bit "
                        "machine addresses: give the model's real size and a headroom like '10%%+1G'"
                        % (format_size(request.model_size), shown(request.memory_headroom)))


def _int(name: str, value: Any, minimum: int, maximum: int) -> int:
    number = _integer(value)
    if number is None:
        raise NumaError("%s must be an integer, got %s" % (name, shown(value)))
    if number < minimum:
        raise NumaError("%s must be %d or more, got %s" % (name, minimum, shown(value)))
    if number > maximum:
        raise NumaError("%s must be at most %d, got %s" % (name, maximum, shown(value)))
    return number


def _integer(value: Any) -> Optional[int]:
    """An int, or the int a text of digits spells (see _is_integer); None for anything else.

    A text of more than 20 digits reads as 2**64 (with its sign): past every bound here, and int()
    refuses texts past ~4300 digits.
    """
    if isinstance(value, str) and _is_integer(value):
        text = value.strip()
        if len(text.lstrip("-").lstrip("0")) > 20:
            return -(1 << 64) if text.startswith("-") else 1 << 64
        return int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _is_integer(text: str) -> bool:
    """An optional minus and decimal digits, spaces around allowed: what int() reads, bar "+" and "_"."""
    digits = text.strip()
    return digits[1:].isdecimal() if digits.startswith("-") else digits.isdecimal()


def _size(name: str, value: Any) -> int:
    try:
        return parse_size(value)
    except NumaError as error:
        raise NumaError("%s: %s" % (name, error))


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise NumaError("%s must be true or false, got %s" % (name, shown(value)))
    return value


def _choice(name: str, value: Any, choices: Collection[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise NumaError("unknown %s %s: choose one of %s" % (name, shown(value), ", ".join(choices)))
    return value


def _cpu_ids(name: str, value: Any) -> List[int]:
    if isinstance(value, str):
        try:
            return parse_cpulist(value, MAX_CPUS)
        except NumaError as error:
            raise NumaError("%s: %s" % (name, error))
    if not isinstance(value, (list, tuple)):
        raise NumaError("%s must be a cpu list like '0-1' or a list of cpu numbers, got %s" % (name, shown(value)))
    return sorted(set(_int(name, item, 0, MAX_CPUS - 1) for item in value))


def _port_base(value: Any, instances: int) -> Optional[int]:
    if value is None:
        return None
    port = _int("port_base", value, 1, MAX_PORT)
    if port + instances - 1 > MAX_PORT:
        raise NumaError("port_base %d + %d instances runs past port 65535: pick a port_base of "
                        "at most %d" % (port, instances, 65536 - instances))
    return port


def _anchors(value: Any, instances: int, node: Optional[int]) -> Optional[List[int]]:
    """The anchor node of every instance, fixed by a deployment that planned them all at once."""
    if value is None or value == "":
        return None
    # Order and repeats matter (instance i -> anchors[i]), so this is no cpulist.
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise NumaError("anchors must be node ids in instance order like '0,1', got %s" % shown(value))
    # Counted before any entry is read: a hostile list costs nothing.
    if len(items) != instances:
        raise NumaError("anchors %s name %d node(s) for %d instance(s): give one node per instance, in "
                        "instance order" % (shown(value), len(items), instances))
    anchors = [_int("anchors entry", item, 0, MAX_NODES - 1) for item in items]
    if node is not None:
        raise NumaError("node and anchors both given: anchors already fix each instance's node; drop one")
    return anchors


def _gpu_selection(value: Any) -> Union[str, int, List[str]]:
    """Normalise gpus to "auto", "none", a positive count or a list of full PCI addresses."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "none"):
            return text
        value = text if _is_integer(text) else text.split(",")
    if _integer(value) is not None:
        return _int("gpus count", value, 0, MAX_GPUS) or "none"
    if isinstance(value, (list, tuple)):
        return _gpu_addresses(value) or "none"
    raise NumaError("gpus must be 'auto', 'none', a count or a list of PCI addresses, got %s" % shown(value))


def _gpu_addresses(items: Union[List[Any], Tuple[Any, ...]]) -> List[str]:
    """Full PCI addresses in the order given; an empty entry or a GPU named twice is a mistake, not a no-op."""
    addresses = []
    seen = set()
    for position, item in enumerate(items, 1):
        if isinstance(item, str) and not item.strip():
            raise NumaError("gpus entry %d of %d is empty: separate PCI addresses by single commas, like "
                            "0000:81:00.0,0000:c1:00.0, or write none" % (position, len(items)))
        address = _pci_address(item)
        if address in seen:
            raise NumaError("gpus names GPU %s twice: list each GPU once" % address)
        seen.add(address)
        addresses.append(address)
    return addresses


def _pci_address(item: Any) -> str:
    import re

    match = re.match(_PCI_ADDRESS, item.strip().lower()) if isinstance(item, str) else None
    if not match:
        raise NumaError("gpus: %s is not a PCI address; write it like 0000:81:00.0 (as lspci -D shows)"
                        % shown(item))
    domain = match.group(1) or "0000"
    return "%s:%s:%s.%s" % (domain, match.group(2), match.group(3), match.group(4))


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
    check_start_options(options)
    chosen = {option.name: options.get(option.name) for option in OPTIONS if option.stage == PLANNER}
    if chosen["node"] == "auto":
        chosen["node"] = None
    models = options.get("model") or []
    # One path as the role gives it, or a list (CLI, numa_plan).
    chosen["model_size"] = _model_size(chosen["model_size"], [models] if isinstance(models, str) else models)
    return Request.from_options(chosen)


def _model_size(model_size: Any, models: List[str]) -> Any:
    """A path measured in bytes; sizes ("14G", bytes) go on to the Request, which parses them."""
    from ..base.sizes import size_of_path

    if model_size is None:
        return sum(size_of_path(path) for path in models) if models else None
    if isinstance(model_size, str) and (os.sep in model_size or os.path.exists(model_size)):
        return size_of_path(model_size)
    return model_size
