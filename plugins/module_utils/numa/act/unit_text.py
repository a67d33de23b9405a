"""Unit-file text: a service definition and a Plan turned into systemd unit settings, safely.

A unit file is parsed by systemd in three passes that each give characters a
meaning: specifier expansion (``%i``, on the whole line), word splitting with
C-style unescaping and quotes (``"a b"``, ``\\\\``), and for ``ExecStart=``
environment expansion at start (``$VAR``, ``${VAR}``). An argument that reaches
``ExecStart=`` verbatim can therefore change the command line (``%n``, ``$PATH``,
``;``), so every value written into a unit goes through the functions here.
Before all three, systemd reads lines: a newline, carriage return or NUL ends the
setting there, and a line ending in an unpaired backslash swallows the next one.

Also here: the ``numa-pin exec`` flags for a placement request, the ``{token}``
substitution the wrapper does at start (done at deploy time in ``pin_mode:
systemd``), and the ``CPUAffinity=``/``NUMAPolicy=``/``NUMAMask=`` a Plan maps to.
"""

import json
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..base.cpulist import format_cpulist, parse_cpulist
from ..base.errors import NumaError, shown
from ..base.tokens import BASELINE_ENV, OWN_ENV_PREFIX
from ..inputs.request import OPTIONS, Option, check_names
from ..system import trusted_files

# Characters that mean nothing to systemd's parsers in any pass: a word made
# only of these is written bare, anything else is double-quoted.
_BARE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./{}-]+$")
# A leading one of these on the executable is a prefix for systemd ("-" ignores
# failure, "+" runs with full privileges, ...), not part of the path.
_EXEC_PREFIXES = "@-:+!|"
# systemd refuses an executable holding one of these ("contains special characters").
_EXEC_SPECIAL = re.compile(r"[\x00-\x1f\x7f\\\"']")
_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\t": "\\t"}
_FORBIDDEN = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# An odd run of backslashes ending a line joins the next line to it (systemd.syntax(7)).
_JOINS_NEXT_LINE = re.compile(r"(?<!\\)(\\\\)*\\$")
_SETTING_NAME = re.compile(r"^[A-Z][A-Za-z0-9]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The runtime drop-in of that baseline: numa-pin reads its Environment=, systemd itself (pin_mode systemd) the
# resets of its own placement.
BASELINE_DROP_IN = "90-inferops-numa-ab-baseline.conf"
BASELINE_DROP_IN_TEXT = ("# inferops.numa A/B gate: this instance's unbound baseline, removed once measured\n"
                         "[Service]\nEnvironment=%s=unbound\nCPUAffinity=\nNUMAPolicy=default\nNUMAMask=\n"
                         % BASELINE_ENV)
# systemd's unit_name_is_valid for the prefix of a template (no "@", max 255 with suffix), less
# ":" and the names "." and "..": the name is also the default user and group, which systemd
# ignores when they hold these (the service would run as root), and the StateDirectory=.
_UNIT_PREFIX = re.compile(r"^(?!\.\.?$)[A-Za-z0-9_.-]{1,200}$")
# A User=/Group= of ASCII digits only is an ID; uid_is_valid: (uid_t) -1 and its 16-bit form are none.
_DECIMAL = re.compile(r"^[0-9]+$")
_INVALID_IDS = (0xFFFFFFFF, 0xFFFF)

# What a Plan means to systemd's own NUMA settings (systemd.exec(5), >= 243).
SYSTEMD_POLICIES = {"bind": "bind", "preferred": "preferred", "interleave": "interleave"}
SYSTEMD_NUMA_MIN_VERSION = 243
# The Plan keys that describe a placement; the rest (free memory, reasons) move
# between two runs on an idle host and would restart services for nothing.
PLAN_RECORD_KEYS = ("policy", "mem_nodes", "cpu_nodes", "node", "cpus", "cpulist", "threads", "gpus", "gpu_map",
                    "engine", "env", "instance", "instances", "port", "required_bytes", "inputs")


def _reject_forbidden(text: str, what: str) -> None:
    for char, name in _FORBIDDEN.items():
        if char in text:
            raise NumaError("%s %r contains %s, which a systemd unit file cannot hold: "
                            "remove it (pass multi-line data through a file)" % (what, text, name))


def _expect_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise NumaError("%s %r is a %s, not a string: quote it in YAML" % (what, value, type(value).__name__))
    return value


def escape_specifiers(text: str) -> str:
    """``%`` -> ``%%`` so systemd does not expand ``%i``, ``%n``, ... inside our values."""
    return text.replace("%", "%%")


def quote_word(arg: str, what: str = "argument") -> str:
    """One command-line argument as systemd reads it back into exactly ``arg``.

    ``$`` is doubled because systemd expands ``$VAR`` in ``ExecStart=`` arguments,
    ``%`` because it expands specifiers; a word with anything outside a small safe
    set is double-quoted with ``\\`` and ``"`` escaped, and control characters
    other than newlines written as ``\\xNN``.
    """
    _reject_forbidden(_expect_str(arg, what), what)
    return _word(arg.replace("$", "$$"))


def _word(text: str) -> str:
    """``text`` as one word that specifier expansion and unquoting read back as it is (``$`` as it is)."""
    text = escape_specifiers(text)
    if _BARE_WORD.match(text):
        return text
    return '"%s"' % "".join(_escape_char(char) for char in text)


def _escape_char(char: str) -> str:
    if char in _C_ESCAPES:
        return _C_ESCAPES[char]
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return "\\x%02x" % ord(char)
    return char


def exec_args(args: Sequence[str]) -> str:
    """Arguments (not the executable) for an ``ExecStart=`` line, space separated."""
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise NumaError("command arguments %r are not a list: write the command as a YAML list, "
                        "one argument per item, never as one shell string" % (args,))
    return " ".join(quote_word(arg, "argument %d" % (index + 1)) for index, arg in enumerate(args))


def exec_line(argv: Sequence[str]) -> str:
    """A whole ``ExecStart=`` value for ``argv``; systemd executes ``argv[0]``.

    systemd takes the path of the program from the first word as written, but expands
    ``$`` in every word it passes, the first included: a path holding ``$`` is therefore
    named with the ``@`` prefix, followed by its ``argv[0]`` written as an argument.
    """
    executable = _executable(argv)
    if "$" in executable:
        words = [_word("@" + executable), quote_word(executable)]
    else:
        words = [_word(executable)]
    return " ".join(words + _argument_words(argv))


def command_args(argv: Sequence[str]) -> str:
    """A command handed as arguments to a program that executes it (``numa-pin exec -- argv``).

    Checked as ``exec_line`` checks it, so the same command works in either pin mode.
    """
    return " ".join([quote_word(_executable(argv), "executable")] + _argument_words(argv))


def _argument_words(argv: Sequence[str]) -> List[str]:
    """The quoted arguments after the executable, as one string, or none."""
    return [exec_args(argv[1:])] if len(argv) > 1 else []


def _executable(argv: Sequence[str]) -> str:
    """``argv[0]`` when systemd would execute exactly that file (systemd.service(5), "Command lines")."""
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence) or not argv:
        raise NumaError("command %r is not a non-empty list: write the command as a YAML list, "
                        "one argument per item, never as one shell string" % (argv,))
    executable = _expect_str(argv[0], "executable")
    if not executable or executable[0] in _EXEC_PREFIXES:
        raise NumaError("executable %r is empty or starts with one of %s, which systemd reads as an "
                        "ExecStart= prefix: give the path of the program (absolute is best)"
                        % (executable, _EXEC_PREFIXES))
    if _EXEC_SPECIAL.search(executable):
        raise NumaError("executable %r holds a control character, quote or backslash, which systemd refuses "
                        "in the program's path: rename or link the program" % (executable,))
    if executable.endswith("/") or ("/" in executable and not executable.startswith("/")) \
            or executable in (".", ".."):
        raise NumaError("executable %r is neither an absolute path nor a program name systemd looks up: "
                        "give the absolute path of the program" % (executable,))
    return executable


def setting_value(value: Any, what: str = "value") -> str:
    """A one-line unit setting that expands specifiers (``Description=``, ``User=``): ``%`` escaped."""
    return escape_specifiers(_line_value(value, what))


def account_name(value: Any, what: str = "user") -> str:
    """``User=``/``Group=``: a name or numeric ID systemd applies, never one it ignores.

    systemd skips a name it finds invalid with a warning (systemd.exec(5), systemd.io/USER_NAMES),
    and the service then runs as root: refuse those here instead.
    """
    text = _line_value(value, what)
    if _DECIMAL.match(text):
        if str(int(text)) != text or int(text) > 0xFFFFFFFF or int(text) in _INVALID_IDS:
            raise NumaError("%s %r is no numeric ID systemd accepts: write the ID without leading zeros, "
                            "below 4294967295 and not 65535, or give the name" % (what, text))
    elif not text or text in (".", "..") or ":" in text or "/" in text \
            or (text[0] == "-" and _DECIMAL.match(text[1:])):
        raise NumaError("%s %r is no user or group name systemd accepts, and without one the service runs as "
                        "root: use letters, digits, '_' and '-', starting with a letter" % (what, text))
    return escape_specifiers(text)


def extra_setting_value(value: Any, name: str = "value") -> str:
    """The value of an extra unit setting, written as given.

    Some settings expand specifiers and others do not (``CPUQuota=50%``), so a ``%`` has no
    single escaped form. Only a last ``%`` reads as itself in both (a stray specifier start is
    kept), and any other is refused.
    """
    text = _line_value(value, name)
    if "%" in text[:-1]:
        raise NumaError("%s %r has a '%%' before its end, which systemd reads as a specifier in some "
                        "settings and as itself in others: keep '%%' to the end of the value or set this "
                        "setting in a drop-in of your own" % (name, text))
    return text


def _line_value(value: Any, what: str) -> str:
    """A value that reads back as itself from the rest of a ``Key=`` line."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise NumaError("%s %r is not a string or number: quote it in YAML" % (what, value))
    text = str(value)
    _reject_forbidden(text, what)
    if _CONTROL.search(text):
        raise NumaError("%s %r holds a control character, which no systemd setting takes as written: "
                        "remove it" % (what, text))
    if text != text.strip(" "):
        raise NumaError("%s %r starts or ends with whitespace, which systemd drops: remove it" % (what, text))
    if _JOINS_NEXT_LINE.search(text):
        raise NumaError("%s %r ends with a backslash, which makes systemd join the next line to this "
                        "setting: remove it or double it" % (what, text))
    return text


def environment_assignment(name: Any, value: Any) -> str:
    """``"NAME=value"`` for ``Environment=``: quoted so spaces, quotes and ``\\`` survive."""
    key = _expect_str(name, "environment variable name")
    if not _ENV_NAME.match(key):
        raise NumaError("environment variable name %r is not a valid name: use letters, digits and _, "
                        "not starting with a digit" % (key,))
    if key.startswith(OWN_ENV_PREFIX):
        raise NumaError("environment variable %s is numa-pin's own (%s* tell it how to place the server): remove it "
                        "from the service's environment" % (key, OWN_ENV_PREFIX))
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise NumaError("environment variable %s has the value %r: give a string" % (key, value))
    text = str(value)
    _reject_forbidden(text, "environment variable %s" % key)
    # Environment= unquotes like ExecStart= but never expands "$", so only "%" is doubled.
    body = escape_specifiers("%s=%s" % (key, text))
    return '"%s"' % "".join(_escape_char(char) for char in body)


def environment_lines(env: Optional[Mapping[str, Any]]) -> List[str]:
    """Sorted ``Environment=`` values for a mapping (sorted so the unit is stable)."""
    if env is None:
        return []
    if not isinstance(env, Mapping):
        raise NumaError("environment %r is not a mapping of NAME: value" % (env,))
    return [environment_assignment(key, env[key]) for key in sorted(env)]


def path_value(path: Any, what: str = "path") -> str:
    """An absolute path for a path-list setting (``ReadWritePaths=``, ``WorkingDirectory=``)."""
    text = _expect_str(path, what)
    _reject_forbidden(text, what)
    if not text.startswith("/") or re.search(r'[\s"\'\\]', text):
        raise NumaError("%s %r must be an absolute path without whitespace, quotes or backslashes" % (what, text))
    return escape_specifiers(text)


def setting_name(name: Any) -> str:
    """A unit setting name for extra settings (``LimitMEMLOCK``); returns it unchanged."""
    text = _expect_str(name, "setting name")
    if not _SETTING_NAME.match(text):
        raise NumaError("%r is not a systemd setting name: write it like LimitMEMLOCK or ProtectHome" % (text,))
    return text


def unit_prefix(name: Any) -> str:
    """Check a service name usable as ``<name>@.service``; returns it unchanged."""
    text = _expect_str(name, "service name")
    if not _UNIT_PREFIX.match(text):
        raise NumaError("service name %s cannot name a systemd template unit: use 1 to 200 ASCII letters, digits, "
                        "'_', '.' and '-' (no '@', '/', ':' or spaces)" % shown(text))
    return text


def request_flags(request: Mapping[str, Any]) -> List[str]:
    """``numa-pin exec`` flags for a placement request (request.py's option names, None = unset)."""
    check_names(request)
    flags: List[str] = []
    for option in OPTIONS:
        value = request.get(option.name)
        if value is not None:
            flags.extend(_option_flags(option, value))
    return flags


def _option_flags(option: Option, value: Any) -> List[str]:
    """A bool as its flag or ``--no-`` flag; a list as a repeated flag where the option repeats
    (``--model``), else as one comma-separated value (``--gpus 0000:81:00.0,0000:c1:00.0``)."""
    if option.kind == "bool":
        if not isinstance(value, bool):
            raise NumaError("placement option %s is %r: give true or false" % (option.name, value))
        return [option.flag if value else option.negative_flag]
    if not isinstance(value, (list, tuple)):
        return [option.flag, _option_word(option, value)]
    words = [_option_word(option, item) for item in value]
    if option.kind == "list":
        return [word for item in words for word in (option.flag, item)]
    if any("," in word for word in words):
        raise NumaError("placement option %s lists %r, an item holding a comma, which numa-pin would split: "
                        "give one value per item" % (option.name, value))
    return [option.flag, ",".join(words)]


def _option_word(option: Option, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise NumaError("placement option %s has the value %r: give a string or a number" % (option.name, value))
    word = str(value)
    if word.startswith("-"):
        raise NumaError("placement option %s is %r, which numa-pin would read as a flag: "
                        "give the value without a leading '-'" % (option.name, word))
    return word


def plan_record(plan: Mapping[str, Any], container: Optional[str] = None) -> Dict[str, Any]:
    """The stable part of a Plan, written next to the unit and compared between runs; for an instance run in a
    ``container``, its runtime too (the audit finds the container's processes by it).

    A plan spread over several nodes places nothing by its ``node``: that is only the node
    the set grew from, picked by a few MiB of free memory that the running instance itself
    changes. Recording it would restart the instance whenever another node scored better.
    """
    record = dict((key, plan[key]) for key in PLAN_RECORD_KEYS if key in plan)
    if isinstance(record.get("engine"), dict):  # what the engine is told, not the words for it
        record["engine"] = dict((key, value) for key, value in record["engine"].items() if key != "reasons")
    if len(plan.get("mem_nodes") or ()) > 1:
        record.pop("node", None)
    if container:
        record["container"] = container
    return record


def record_is_current(path: str, record: Mapping[str, Any]) -> bool:
    """Whether the plan record file at path holds exactly this record, as root wrote it.

    Anything else (missing, or one root cannot trust: trusted_files.read_plan_record) is not current, so the
    caller writes it again.
    """
    try:
        written = trusted_files.read_plan_record(path, "it is written again")
    except NumaError:
        return False
    return written is not None and written == json.loads(json.dumps(record))


def parse_systemd_version(text: str) -> int:
    """``systemctl --version`` output -> 252 (first line ``systemd 252 (252.39-1~deb12u2)``)."""
    match = re.match(r"^\s*systemd\s+(\d+)", text or "")
    if not match:
        raise NumaError("cannot read the systemd version from %r: is systemd the init system of this host?"
                        % ((text or "").splitlines()[:1],))
    return int(match.group(1))


def numa_settings(plan: Mapping[str, Any], systemd_version: int) -> List[Tuple[str, str]]:
    """``[("CPUAffinity", "2-3"), ("NUMAPolicy", "bind"), ("NUMAMask", "1")]`` for a Plan.

    Raises NumaError when systemd cannot express the plan, naming the fix
    (``pin_mode: wrapper`` applies every policy the planner can choose).
    """
    if systemd_version < SYSTEMD_NUMA_MIN_VERSION:
        raise NumaError("pin_mode systemd needs systemd >= %d for NUMAPolicy=/NUMAMask= but this host has "
                        "systemd %d: use pin_mode wrapper" % (SYSTEMD_NUMA_MIN_VERSION, systemd_version))
    policy = plan.get("policy")
    if policy not in SYSTEMD_POLICIES:
        raise NumaError("the plan's memory policy %r has no systemd NUMAPolicy= equivalent: use pin_mode wrapper"
                        % (policy,))
    mem_nodes = [int(node) for node in plan.get("mem_nodes") or []]
    if not mem_nodes:
        raise NumaError("the plan names no memory node; systemd would not bind memory: check the plan "
                        "with `numa-pin explain`")
    if policy == "preferred" and len(mem_nodes) > 1:
        raise NumaError("the plan prefers several nodes %s, which systemd's NUMAPolicy=preferred cannot "
                        "express: use pin_mode wrapper" % format_cpulist(mem_nodes))
    cpulist = plan.get("cpulist") or format_cpulist(plan.get("cpus") or [])
    if not parse_cpulist(cpulist):
        raise NumaError("the plan has no CPUs to pin to: check the plan with `numa-pin explain`")
    return [("CPUAffinity", cpulist),
            ("NUMAPolicy", SYSTEMD_POLICIES[policy]),
            ("NUMAMask", format_cpulist(mem_nodes))]
