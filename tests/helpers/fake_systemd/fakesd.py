"""The fake systemd's core, shared by its ``systemctl``, ``journalctl`` and per-unit supervisor.

State lives in the directory named by ``$FAKE_SYSTEMD_STATE``::

    lock                 the state lock (flock): every read-modify-write of the files below holds it, briefly
    jobs/<unit>.lock     a unit's job lock: one start/stop/restart of a unit at a time, as systemd's job queue
    units/<unit>.json    a unit's runtime state (ActiveState, MainPID, NRestarts, its supervisor, ...)
    loaded/<unit>.json   a unit's definition as last loaded (daemon-reload reloads it; NeedDaemonReload compares)
    journal/<unit>.jsonl the unit's journal, one JSON record per line
    enabled.json         the enabled units; masked.json the masked ones
    spawned              every process the fake started (pid, session, start time): what the reaper may reap
    fail.json            failures on cue (written by tests); fail-counts.json their counters
    calls.log            every systemctl and journalctl call, one JSON argv per line
    supervisor.log       the supervisors' own stderr (their crashes, never a unit's output)

Unit files are read from ``$FAKE_SYSTEMD_UNIT_PATH`` (colon-separated, the first directory the highest
priority, as /etc/systemd/system) and then ``$FAKE_SYSTEMD_ROOT/run/systemd/system`` (the runtime directory,
below /etc as in systemd's search path). Parsing follows systemd.syntax(7), systemd.unit(5),
systemd.service(5) and systemd.exec(5) for the settings the project writes; systemd 252 is the reference.

Standard library only: it runs under whatever ``python3`` PATH names, on Python 3.6 and later.
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import pwd
import re
import signal
import time

STATE_ENV = "FAKE_SYSTEMD_STATE"
UNIT_PATH_ENV = "FAKE_SYSTEMD_UNIT_PATH"
ROOT_ENV = "FAKE_SYSTEMD_ROOT"
TIMEOUT_STOP_ENV = "FAKE_SYSTEMD_TIMEOUT_STOP_SEC"
TIMEOUT_START_ENV = "FAKE_SYSTEMD_TIMEOUT_START_SEC"
HERE = os.path.dirname(os.path.abspath(__file__))
SUPERVISOR = os.path.join(HERE, "supervisor.py")

VERSION = 252
VERSION_TEXT = ("systemd 252 (252.39-1~deb12u1)\n"
                "+PAM +AUDIT +SELINUX +APPARMOR +IMA +SMACK +SECCOMP +GCRYPT -GNUTLS +OPENSSL +ACL +BLKID +CURL "
                "+ELFUTILS +FIDO2 +IDN2 -IDN +IPTC +KMOD +LIBCRYPTSETUP +LIBFDISK +PCRE2 -PWQUALITY +P11KIT "
                "+QRENCODE +TPM2 +BZIP2 +LZ4 +XZ +ZLIB +ZSTD -BPF_FRAMEWORK -XKBCOMMON +UTMP +SYSVINIT "
                "default-hierarchy=unified\n")
# The environment systemd (PID 1) gives every service, before the unit's own (Debian 12, merged /usr).
MANAGER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
DEFAULT_RESTART_SEC = 0.1
DEFAULT_START_LIMIT_BURST = 5
DEFAULT_START_LIMIT_INTERVAL = 10.0
# systemd's DefaultTimeoutStopSec is 90 s; a test waits on it, so the fake's default is short (a unit's own
# TimeoutStopSec= still wins, and $FAKE_SYSTEMD_TIMEOUT_STOP_SEC changes the default).
DEFAULT_TIMEOUT_STOP = 5.0
DEFAULT_TIMEOUT_START = 10.0  # systemd: 90 s, likewise (Type=notify waits this long for READY=1)
UNIT_SUFFIXES = ("service", "socket", "target", "device", "mount", "automount", "swap", "timer", "path", "slice",
                 "scope")
ACTIVE_STATES = ("active", "reloading", "activating", "deactivating")
CLEAN_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)
RESTART_POLICIES = ("no", "on-success", "on-failure", "on-abnormal", "on-watchdog", "on-abort", "always")
SERVICE_TYPES = ("simple", "exec", "forking", "oneshot", "dbus", "notify", "notify-reload", "idle")
# The types the supervisor runs; the others are refused at start, by name (never run half right).
RUN_TYPES = ("simple", "exec", "idle", "notify", "notify-reload")
NOTIFY_TYPES = ("notify", "notify-reload")
NUMA_POLICIES = ("default", "preferred", "bind", "interleave", "local")
MPOL = {"default": 0, "preferred": 1, "bind": 2, "interleave": 3, "local": 4}
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 270, "riscv64": 237}
CLD_EXITED, CLD_KILLED, CLD_DUMPED = 1, 2, 3
CODE_NAMES = {0: "(null)", CLD_EXITED: "exited", CLD_KILLED: "killed", CLD_DUMPED: "dumped"}
# systemd's exit codes for the step of the start that failed (systemd.exec(5), "Process Exit Codes").
EXIT_STEPS = {"CHDIR": 200, "EXEC": 203, "CPUAFFINITY": 215, "GROUP": 216, "USER": 217, "RUNTIME_DIRECTORY": 233,
              "STATE_DIRECTORY": 238, "CACHE_DIRECTORY": 239, "LOGS_DIRECTORY": 240,
              "CONFIGURATION_DIRECTORY": 241, "NUMA_POLICY": 242}
# StateDirectory= and its kin: (the directory they are relative to under the root, the variable naming them).
DIRECTORIES = {"RuntimeDirectory": ("run", "RUNTIME_DIRECTORY"), "StateDirectory": ("var/lib", "STATE_DIRECTORY"),
               "CacheDirectory": ("var/cache", "CACHE_DIRECTORY"), "LogsDirectory": ("var/log", "LOGS_DIRECTORY"),
               "ConfigurationDirectory": ("etc", "CONFIGURATION_DIRECTORY")}
# Settings that change what a service does and that the fake does not do: each one found is a warning in the
# unit's journal ("fake systemd does not emulate ..."), so a test never passes on a setting silently dropped.
NOT_EMULATED = ("ExecStartPre", "ExecStartPost", "ExecCondition", "ExecStop", "ExecStopPost", "ExecReload",
                "EnvironmentFile", "PassEnvironment", "UnsetEnvironment", "PIDFile", "RemainAfterExit", "KillMode",
                "RestartPreventExitStatus", "RestartForceExitStatus", "WatchdogSec",
                "RuntimeMaxSec", "StandardInput", "StandardOutput", "StandardError", "RootDirectory",
                "DynamicUser", "AmbientCapabilities", "Nice", "CPUSchedulingPolicy", "OOMScoreAdjust",
                "MemoryMax", "CPUQuota", "AllowedCPUs", "AllowedMemoryNodes", "Slice", "Delegate",
                "BindsTo", "Requires", "PartOf", "Conflicts", "ConditionPathExists", "AssertPathExists")
EXIT_NAMES = {0: "SUCCESS", 1: "FAILURE", 2: "INVALIDARGUMENT", 3: "NOTIMPLEMENTED", 4: "NOPERMISSION",
              5: "NOTINSTALLED", 6: "NOTCONFIGURED", 7: "NOTRUNNING", 200: "CHDIR", 201: "NICE", 202: "FDS",
              203: "EXEC", 204: "MEMORY", 205: "LIMITS", 206: "OOM_ADJUST", 207: "SIGNAL_MASK", 208: "STDIN",
              209: "STDOUT", 210: "CHROOT", 211: "IOPRIO", 212: "TIMERSLACK", 213: "SECUREBITS",
              214: "SETSCHEDULER", 215: "CPUAFFINITY", 216: "GROUP", 217: "USER", 218: "CAPABILITIES",
              219: "CGROUP", 220: "SETSID", 222: "STDERR", 224: "PAM", 225: "NETWORK", 226: "NAMESPACE",
              227: "NO_NEW_PRIVILEGES", 228: "SECCOMP", 233: "RUNTIME_DIRECTORY", 238: "STATE_DIRECTORY",
              239: "CACHE_DIRECTORY", 240: "LOGS_DIRECTORY", 241: "CONFIGURATION_DIRECTORY", 242: "NUMA_POLICY"}
LINE_MAX = 48 * 1024  # journald's LineMax=: a longer line is split


class FakeError(Exception):
    """A request the fake refuses, with systemctl's message and exit code."""

    def __init__(self, message, code=1):
        Exception.__init__(self, message)
        self.code = code


# --------------------------------------------------------------------------------------------- times, names ---

_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0,
               "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0,
               "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0, "d": 86400.0, "day": 86400.0,
               "days": 86400.0, "w": 604800.0, "week": 604800.0, "weeks": 604800.0, "M": 2629800.0,
               "month": 2629800.0, "months": 2629800.0, "y": 31557600.0, "year": 31557600.0,
               "years": 31557600.0}
_TIME_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z\u00b5]*)\s*")


def parse_timespan(text, default_unit=1.0):
    """systemd.time(7): "200ms", "1min 30s", "5", "infinity" -> seconds (a bare number is seconds)."""
    text = text.strip()
    if text == "infinity":
        return float("inf")
    total, position = 0.0, 0
    if not text:
        raise ValueError("an empty time span")
    while position < len(text):
        match = _TIME_PART.match(text, position)
        if not match or match.end() == position:
            raise ValueError("%r is not a time span" % text)
        number, unit = match.groups()
        if unit and unit not in _TIME_UNITS:
            raise ValueError("%r: unknown time unit %r" % (text, unit))
        total += float(number) * (_TIME_UNITS[unit] if unit else default_unit)
        position = match.end()
    return total


def format_timespan(seconds):
    """Seconds as systemctl shows a time span: "100ms", "1min 30s", "infinity"."""
    if seconds is None or seconds == float("inf"):
        return "infinity"
    usec = int(round(seconds * 1e6))
    if usec == 0:
        return "0"
    parts = []
    for name, size in (("y", 31557600000000), ("month", 2629800000000), ("w", 604800000000),
                       ("d", 86400000000), ("h", 3600000000), ("min", 60000000), ("s", 1000000), ("ms", 1000),
                       ("us", 1)):
        if usec >= size:
            parts.append("%d%s" % (usec // size, name))
            usec %= size
    return " ".join(parts)


def format_timestamp(epoch):
    """A wall-clock time as systemctl shows it ("Sat 2026-05-09 07:35:25 UTC"); empty for never."""
    if not epoch:
        return ""
    return time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(epoch))


def exit_status_text(code, status):
    """"1/FAILURE", "203/EXEC", "9/KILL" as systemd writes an exit status."""
    if code == CLD_EXITED:
        return "%d/%s" % (status, EXIT_NAMES.get(status, "n/a"))
    return "%d/%s" % (status, signal_name(status))


def signal_name(number):
    try:
        return signal.Signals(number).name[3:]
    except ValueError:
        return str(number)


def parse_signal(text):
    """"SIGTERM", "TERM" or "15" -> 15."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(getattr(signal, name))
    except AttributeError:
        raise ValueError("unknown signal %r" % text) from None


_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?\.(%s)$" % "|".join(UNIT_SUFFIXES))


def mangle(name):
    """A unit name as systemctl reads an argument: ".service" added when no unit type ends it."""
    if "." not in name or name.rsplit(".", 1)[1] not in UNIT_SUFFIXES:
        name = name + ".service"
    if not _UNIT_NAME.match(name) or name.startswith("@"):
        raise FakeError("Invalid unit name \"%s\" escaped as \"%s\"." % (name, name), 1)
    return name


def split_name(unit):
    """"foo@0.service" -> ("foo", "0", "service"); "foo.service" -> ("foo", None, "service")."""
    stem, suffix = unit.rsplit(".", 1)
    if "@" in stem:
        prefix, instance = stem.split("@", 1)
        return prefix, instance, suffix
    return stem, None, suffix


def template_of(unit):
    prefix, instance, suffix = split_name(unit)
    return "%s@.%s" % (prefix, suffix) if instance else None


def unescape_name(text):
    """systemd-escape --unescape: "-" is "/", "\\xNN" a byte."""
    out, index = bytearray(), 0
    while index < len(text):
        char = text[index]
        if char == "-":
            out += b"/"
        elif char == "\\" and re.match(r"^x[0-9a-fA-F]{2}$", text[index + 1:index + 4]):
            out.append(int(text[index + 2:index + 4], 16))
            index += 3
        else:
            out += char.encode("utf-8")
        index += 1
    return out.decode("utf-8", "replace")


# --------------------------------------------------------------------------------- unit file syntax -------

class SyntaxProblem(ValueError):
    """A value systemd would refuse: the assignment is ignored, with a warning in the journal."""


def _os_release():
    values = {}
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    key, sep, value = line.strip().partition("=")
                    if sep:
                        values[key] = value.strip("\"'")
            return values
        except OSError:
            continue
    return values


def _read_first_line(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.readline().strip()
    except OSError:
        return ""


def expand_specifiers(text, unit, fragment=None):
    """systemd.unit(5) "Specifiers" for the system manager: "%i", "%n", "%%", ...; an unknown one raises."""
    prefix, instance, suffix = split_name(unit)
    out, index = [], 0
    while index < len(text):
        char = text[index]
        if char != "%":
            out.append(char)
            index += 1
            continue
        if index + 1 >= len(text):
            raise SyntaxProblem("a lone '%' ends the value")
        out.append(_specifier(text[index + 1], unit, prefix, instance, suffix, fragment))
        index += 2
    return "".join(out)


def _specifier(key, unit, prefix, instance, suffix, fragment):
    if key == "%":
        return "%"
    if key == "n":
        return unit
    if key == "N":
        return unit[:-len(suffix) - 1]
    if key == "p":
        return prefix
    if key == "P":
        return unescape_name(prefix)
    if key == "i":
        return instance or ""
    if key == "I":
        return unescape_name(instance or "")
    if key in "jJ":
        last = prefix.rsplit("-", 1)[-1]
        return last if key == "j" else unescape_name(last)
    if key == "f":
        return "/" + unescape_name(instance if instance else prefix).lstrip("/")
    if key == "H":
        return os.uname().nodename
    if key == "l":
        return os.uname().nodename.split(".")[0]
    if key == "q":
        return ""
    if key == "m":
        return _read_first_line("/etc/machine-id")
    if key == "b":
        return _read_first_line("/proc/sys/kernel/random/boot_id").replace("-", "")
    if key == "v":
        return os.uname().release
    if key == "a":
        return {"x86_64": "x86-64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    os_keys = {"o": "ID", "w": "VERSION_ID", "W": "VARIANT_ID", "B": "BUILD_ID", "A": "IMAGE_VERSION",
               "M": "IMAGE_ID"}
    if key in os_keys:
        return _os_release().get(os_keys[key], "")
    paths = {"t": "/run", "S": "/var/lib", "C": "/var/cache", "L": "/var/log", "E": "/etc", "T": "/tmp",
             "V": "/var/tmp", "h": "/root", "s": "/bin/sh", "u": "root", "U": "0", "g": "root", "G": "0",
             "d": "/run/credentials/" + unit}
    if key in paths:
        return paths[key]
    if key == "y":
        return fragment or ""
    if key == "Y":
        return os.path.dirname(fragment) if fragment else ""
    raise SyntaxProblem("unknown specifier '%%%s'" % key)


WHITESPACE = " \t\n\r"
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
                   "\"": "\"", "'": "'", "s": " "}


def _cunescape(text, index):
    """The C escape at text[index] (a backslash) -> (characters, index after it); systemd's cunescape_one."""
    if index + 1 >= len(text):
        raise SyntaxProblem("a backslash ends the value")
    char = text[index + 1]
    if char in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[char], index + 2
    for lead, width in (("x", 2), ("u", 4), ("U", 8)):
        if char == lead:
            digits = text[index + 2:index + 2 + width]
            if len(digits) != width or not re.match(r"^[0-9a-fA-F]+$", digits):
                raise SyntaxProblem("invalid escape \\%s%s" % (char, digits))
            value = int(digits, 16)
            if value == 0 or value > 0x10FFFF:
                raise SyntaxProblem("invalid escape \\%s%s" % (char, digits))
            return chr(value), index + 2 + width
    if char in "01234567":
        digits = text[index + 1:index + 4]
        if len(digits) != 3 or not re.match(r"^[0-3][0-7][0-7]$", digits) or int(digits, 8) == 0:
            raise SyntaxProblem("invalid escape \\%s" % digits)
        return chr(int(digits, 8)), index + 4
    raise SyntaxProblem("invalid escape \\%s" % char)


def extract_word(text, index, cunescape=True, relax=False):
    """systemd's extract_first_word() with EXTRACT_UNQUOTE (and EXTRACT_CUNESCAPE) from text[index:]:
    (word, its raw text, the index after it), or None when only whitespace is left. Quotes may open anywhere
    in a word; a backslash outside quotes escapes. ``relax``: an unbalanced quote or a last backslash is kept
    rather than refused (EXTRACT_RELAX)."""
    while index < len(text) and text[index] in WHITESPACE:
        index += 1
    if index >= len(text):
        return None
    start, word, quote = index, [], None
    while index < len(text):
        char = text[index]
        if quote is None and char in WHITESPACE:
            break
        if quote is None and char in "\"'":
            quote = char
            index += 1
        elif quote is not None and char == quote:
            quote = None
            index += 1
        elif char == "\\":
            if cunescape:
                chars, index = _cunescape(text, index)
                word.append(chars)
            elif index + 1 < len(text):
                word.append(text[index + 1])
                index += 2
            elif relax:
                index += 1
            else:
                raise SyntaxProblem("a backslash ends the value")
        else:
            word.append(char)
            index += 1
    if quote is not None and not relax:
        raise SyntaxProblem("unbalanced quoting")
    return "".join(word), text[start:index], index


def extract_words(text, cunescape=True, relax=False):
    """Every word of text, as extract_word reads them: [(word, raw text)]."""
    words, index = [], 0
    while True:
        found = extract_word(text, index, cunescape, relax)
        if found is None:
            return words
        words.append(found[:2])
        index = found[2]


def parse_unit_text(text):
    """systemd.syntax(7): [(section, key, value, line number)] and [(line number, warning)].

    Comments (# and ;) and empty lines are skipped; a line ending in an odd run of backslashes joins the next
    one (the backslash read as a space, comment lines inside skipped); keys and values are stripped."""
    assignments, warnings = [], []
    section, pending, first_line = None, None, 0
    for number, raw in enumerate(text.split("\n"), 1):
        raw = raw.rstrip("\r")
        stripped = raw.strip(WHITESPACE)
        if pending is None:
            if not stripped or stripped[0] in "#;":
                continue
            first_line = number
            pending = ""
        elif stripped[:1] in ("#", ";"):
            continue
        trailing = len(raw) - len(raw.rstrip("\\"))
        if trailing % 2 == 1:
            pending += raw[:-1] + " "
            continue
        line = (pending + raw).strip(WHITESPACE)
        pending = None
        if line.startswith("["):
            if not line.endswith("]"):
                warnings.append((first_line, "Invalid section header '%s'" % line))
                section = None
                continue
            section = line[1:-1]
            if section not in ("Unit", "Service", "Install") and not section.startswith("X-"):
                warnings.append((first_line, "Unknown section '%s'. Ignoring." % section))
            continue
        key, sep, value = line.partition("=")
        if not sep:
            warnings.append((first_line, "Missing '=', ignoring line."))
            continue
        if section is None:
            warnings.append((first_line, "Assignment outside of section. Ignoring."))
            continue
        assignments.append((section, key.strip(WHITESPACE), value.strip(WHITESPACE), first_line))
    if pending is not None and pending.strip():
        line = pending.strip(WHITESPACE)
        key, sep, value = line.partition("=")
        if sep and section is not None:
            assignments.append((section, key.strip(WHITESPACE), value.strip(WHITESPACE), first_line))
    return assignments, warnings


def parse_cpu_set(text):
    """"0-3,8 10" -> [0, 1, 2, 3, 8, 10] (systemd's parse_cpu_set: whitespace or commas, ranges)."""
    cpus = set()
    for word in re.split(r"[\s,]+", text.strip()):
        if not word:
            continue
        match = re.match(r"^([0-9]+)(?:-([0-9]+))?$", word)
        if not match:
            raise SyntaxProblem("Failed to parse CPU set '%s'" % text)
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high > 8191:
            raise SyntaxProblem("Failed to parse CPU set '%s'" % text)
        cpus.update(range(low, high + 1))
    return sorted(cpus)


def format_cpu_set(cpus):
    """[0, 1, 2, 5] -> "0-2 5" (systemctl show's form of a CPU set)."""
    cpus, ranges = sorted(set(cpus or ())), []
    for cpu in cpus:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return " ".join(str(low) if low == high else "%d-%d" % (low, high) for low, high in ranges)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ACCOUNT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*[$]?$")


def replace_env(word, env):
    """"${VAR}", "${VAR:-default}", "${VAR:+alternate}" in a word and "$$" -> "$" (systemd's replace_env);
    a braceless "$VAR" inside a word stays as written."""
    out, index = [], 0
    while index < len(word):
        char = word[index]
        if char == "$" and word[index + 1:index + 2] == "$":
            out.append("$")
            index += 2
            continue
        if char == "$" and word[index + 1:index + 2] == "{":
            end = word.find("}", index + 2)
            if end < 0:
                out.append(word[index:])
                break
            inner = word[index + 2:end]
            if ":-" in inner:
                name, default = inner.split(":-", 1)
                out.append(env.get(name) or default)
            elif ":+" in inner:
                name, alternate = inner.split(":+", 1)
                out.append(alternate if env.get(name) else "")
            else:
                out.append(env.get(inner, ""))
            index = end + 1
            continue
        out.append(char)
        index += 1
    return "".join(out)


def replace_env_argv(argv, env):
    """systemd's replace_env_argv: a word that is "$VAR" becomes the variable split at whitespace (quotes
    respected, then removed; none when unset); any other word has "${VAR}" and "$$" replaced."""
    out = []
    for word in argv:
        if word.startswith("$") and len(word) > 1 and word[1] not in "{$":
            value = env.get(word[1:])
            if value is not None:
                out.extend(found for found, _raw in extract_words(value, cunescape=False, relax=True))
            continue
        out.append(replace_env(word, env))
    return out


# ------------------------------------------------------------------------------------------- processes ----

def proc_stat(pid):
    """/proc/<pid>/stat as {state, ppid, pgrp, session, start}, or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            data = handle.read().decode("ascii", "replace")
    except (OSError, ValueError):
        return None
    fields = data[data.rindex(")") + 2:].split()
    return {"state": fields[0], "ppid": int(fields[1]), "pgrp": int(fields[2]), "session": int(fields[3]),
            "start": int(fields[19])}


def alive(pid, start=None):
    """The process runs (not a zombie) and, when ``start`` is given, is the one that started then."""
    if not pid:
        return False
    info = proc_stat(pid)
    return bool(info) and info["state"] not in ("Z", "X", "x") and (start is None or info["start"] == start)


def all_processes():
    """{pid: /proc/<pid>/stat} of every process."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = proc_stat(int(name))
            if info:
                found[int(name)] = info
    return found


def descendants(pid, table=None):
    """Every process below ``pid`` (its children, theirs, ...), zombies included."""
    table = all_processes() if table is None else table
    children = {}
    for child, info in table.items():
        children.setdefault(info["ppid"], []).append(child)
    found, queue = [], list(children.get(pid, ()))
    while queue:
        child = queue.pop()
        found.append(child)
        queue.extend(children.get(child, ()))
    return found


def signal_processes(pids, signum):
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def online_cpus():
    try:
        return parse_cpu_set(_read_first_line("/sys/devices/system/cpu/online"))
    except SyntaxProblem:
        return sorted(os.sched_getaffinity(0))


def node_cpus(nodes):
    cpus = set()
    for node in nodes:
        with contextlib.suppress(SyntaxProblem):
            cpus.update(parse_cpu_set(_read_first_line("/sys/devices/system/node/node%d/cpulist" % node)))
    return sorted(cpus)


def set_mempolicy(policy, nodes):
    """set_mempolicy(2) for a NUMAPolicy=/NUMAMask= pair; OSError as the kernel refuses it. Skipped (None) on
    an architecture whose system call number is not known here."""
    import ctypes  # only in the service's child, before exec
    number = SYS_SET_MEMPOLICY.get(os.uname().machine)
    if number is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    words = 16  # 1024 nodes
    mask = (ctypes.c_ulong * words)()
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    for node in nodes or ():
        if node >= words * bits:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        mask[node // bits] |= 1 << (node % bits)
    mode = MPOL[policy]
    if mode == MPOL["default"] or mode == MPOL["local"]:
        result = libc.syscall(number, mode, None, 0)
    else:
        result = libc.syscall(number, mode, mask, words * bits + 1)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return True


# --------------------------------------------------------------------------------------------- the state --

def fresh_state():
    return {"active": "inactive", "sub": "dead", "result": "success", "main_pid": 0, "exec_main_pid": 0,
            "exec_main_code": 0, "exec_main_status": 0, "exec_main_start": 0, "exec_main_exit": 0,
            "n_restarts": 0, "invocation_id": "", "supervisor": None, "generation": 0, "stop_requested": False,
            "rl_begin": 0.0, "rl_num": 0, "active_enter": 0, "active_exit": 0, "inactive_enter": 0,
            "inactive_exit": 0, "state_change": 0, "status_text": ""}


def set_state(state, active, sub):
    """Move a unit to ActiveState ``active``/SubState ``sub``, with systemd's transition timestamps."""
    now = time.time()
    before = state["active"]
    if before != active:
        if active == "active":
            state["active_enter"] = now
        if before == "active":
            state["active_exit"] = now
        if active in ("inactive", "failed"):
            state["inactive_enter"] = now
        if before in ("inactive", "failed"):
            state["inactive_exit"] = now
        state["state_change"] = now
    state["active"], state["sub"] = active, sub


def start_limit_ok(state, definition):
    """systemd's ratelimit_below on the unit's starts: at most StartLimitBurst= starts in a window of
    StartLimitIntervalSec= (0 turns the limit off)."""
    interval, burst = definition["start_limit_interval"], definition["start_limit_burst"]
    if interval <= 0 or burst <= 0:
        return True
    now = time.monotonic()
    if state["rl_begin"] <= 0 or now - state["rl_begin"] > interval:
        state["rl_begin"], state["rl_num"] = now, 0
    if state["rl_num"] < burst:
        state["rl_num"] += 1
        return True
    return False


def start_limit_hit(context, unit, state, name):
    """A start refused by the start limit (systemd's service_enter_dead with start-limit-hit): the unit fails,
    and its Result stays the failure that came first (a crash loop's "exit-code"; "start-limit-hit" only when
    the unit had not failed), as systemd keeps the first failure."""
    if state["result"] == "success":
        state["result"] = "start-limit-hit"
    set_state(state, "failed", "failed")
    invocation = state["invocation_id"]
    context.journal(unit, "%s: Start request repeated too quickly." % unit, invocation=invocation)
    context.journal(unit, "%s: Failed with result '%s'." % (unit, state["result"]), invocation=invocation)
    context.journal(unit, "Failed to start %s." % name, invocation=invocation)


def read_json(path, default):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return default
    except ValueError:
        return default


def write_json(path, data):
    scratch = "%s.%d.tmp" % (path, os.getpid())
    with open(scratch, "w", encoding="utf-8") as handle:
        json.dump(data, handle, sort_keys=True)
    os.replace(scratch, path)


@contextlib.contextmanager
def flocked(path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Context:
    """The fake's state directory, unit search path and runtime root, from the environment."""

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        state = environ.get(STATE_ENV)
        if not state:
            raise FakeError("fake systemd: %s is not set; it names the directory the fake keeps its state in"
                            % STATE_ENV)
        self.state = os.path.abspath(state)
        self.root = environ.get(ROOT_ENV) or "/"
        self.runtime_dir = os.path.join(self.root, "run/systemd/system")
        given = environ.get(UNIT_PATH_ENV)
        if given:
            self.search = [os.path.abspath(path) for path in given.split(":") if path] + [self.runtime_dir]
        else:
            self.search = [os.path.join(self.root, "etc/systemd/system"), self.runtime_dir,
                           os.path.join(self.root, "usr/local/lib/systemd/system"),
                           os.path.join(self.root, "usr/lib/systemd/system")]
        try:
            self.timeout_stop = parse_timespan(environ.get(TIMEOUT_STOP_ENV) or str(DEFAULT_TIMEOUT_STOP))
        except ValueError:
            self.timeout_stop = DEFAULT_TIMEOUT_STOP
        try:
            self.timeout_start = parse_timespan(environ.get(TIMEOUT_START_ENV) or str(DEFAULT_TIMEOUT_START))
        except ValueError:
            self.timeout_start = DEFAULT_TIMEOUT_START
        for sub in ("units", "loaded", "jobs", "journal"):
            os.makedirs(os.path.join(self.state, sub), exist_ok=True)

    def path(self, *parts):
        return os.path.join(self.state, *parts)

    def lock(self):
        """The state lock: held only for a read-modify-write, never while waiting on a process."""
        return flocked(self.path("lock"))

    def job_lock(self, unit):
        """One job (start, stop, restart) of a unit at a time."""
        return flocked(self.path("jobs", unit + ".lock"))

    # --- runtime state ---
    def read_state(self, unit):
        state = fresh_state()
        state.update(read_json(self.path("units", unit + ".json"), {}))
        return state

    def write_state(self, unit, state):
        write_json(self.path("units", unit + ".json"), state)

    def known_units(self):
        names = set()
        for sub, ending in (("units", ".json"), ("loaded", ".json")):
            for name in os.listdir(self.path(sub)):
                if name.endswith(ending):
                    names.add(name[:-len(ending)])
        return sorted(names)

    def enabled(self):
        return set(read_json(self.path("enabled.json"), []))

    def set_enabled(self, units):
        write_json(self.path("enabled.json"), sorted(units))

    def masked(self):
        return set(read_json(self.path("masked.json"), []))

    def set_masked(self, units):
        write_json(self.path("masked.json"), sorted(units))

    def register(self, pid, role, unit):
        """Note a process the fake started, for the reaper and stop-all (pid, session, start time)."""
        info = proc_stat(pid) or {"session": 0, "start": 0}
        line = json.dumps({"pid": pid, "session": info["session"], "start": info["start"], "role": role,
                           "unit": unit}) + "\n"
        fd = os.open(self.path("spawned"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)

    def spawned(self):
        records = []
        try:
            with open(self.path("spawned"), encoding="utf-8") as handle:
                for line in handle:
                    with contextlib.suppress(ValueError):
                        records.append(json.loads(line))
        except FileNotFoundError:
            pass
        return records

    # --- the journal ---
    def journal(self, unit, message, pid=1, ident="systemd", invocation="", priority=6, stamp=None):
        record = {"t": time.time() if stamp is None else stamp, "u": unit, "p": pid, "c": ident, "i": invocation,
                  "pr": priority, "m": message}
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "surrogateescape")
        fd = os.open(self.path("journal", (unit or "-") + ".jsonl"),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def journal_records(self, units=None):
        names = [unit + ".jsonl" for unit in units] if units else sorted(os.listdir(self.path("journal")))
        records = []
        for name in names:
            try:
                with open(self.path("journal", name), encoding="utf-8", errors="surrogateescape") as handle:
                    for line in handle:
                        with contextlib.suppress(ValueError):
                            records.append(json.loads(line))
            except FileNotFoundError:
                continue
        records.sort(key=lambda record: record["t"])
        return records

    # --- calls and failures on cue ---
    def log_call(self, argv):
        fd = os.open(self.path("calls.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (json.dumps(argv) + "\n").encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)

    def failure_on_cue(self, tool, verb, units):
        """The rule of fail.json this call trips, or None; counts every call each rule matches.

        A rule: {"verb": "restart", "unit": "llama@1.service" (a glob; any when absent), "tool": "systemctl",
        "times": 2 (the next 2 matching calls) or "nth": 3 (the 3rd matching call; every one when neither),
        "rc": 1, "stderr": "...", "stdout": "", "delay": 0.5 (seconds before answering), "do": false (true:
        carry the call out, then answer with rc and stderr anyway)}. Counters restart when fail.json is
        written again."""
        path = self.path("fail.json")
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return None
        import fnmatch
        rules = read_json(path, [])
        if isinstance(rules, dict):
            rules = [rules]
        with self.lock():
            counts = read_json(self.path("fail-counts.json"), {})
            fired, kept = None, {}
            for index, rule in enumerate(rules):
                if not isinstance(rule, dict):
                    continue
                key = "%d:%d:%d:%s" % (index, info.st_mtime_ns, info.st_size, hashlib.sha1(
                    json.dumps(rule, sort_keys=True).encode("utf-8")).hexdigest())
                kept[key] = counts.get(key, 0)
                if rule.get("tool", "systemctl") != tool or rule.get("verb") not in (verb, "*"):
                    continue
                pattern = rule.get("unit")
                if pattern and not any(fnmatch.fnmatchcase(unit, pattern) for unit in units):
                    continue
                kept[key] += 1
                count = kept[key]
                if fired is None and (rule.get("nth") == count if rule.get("nth") is not None else
                                      (rule.get("times") is None or count <= rule["times"])):
                    fired = dict(rule, index=index)
            write_json(self.path("fail-counts.json"), kept)
        return fired

    # --- unit files ---
    def discover(self, unit):
        """(fragment path or None, [drop-in paths in the order systemd applies them])."""
        prefix, _instance, suffix = split_name(unit)
        template = template_of(unit)
        fragment = None
        for name in [unit] + ([template] if template else []):
            for directory in self.search:
                candidate = os.path.join(directory, name)
                if os.path.lexists(candidate):
                    fragment = candidate
                    break
            if fragment:
                break
        names = [unit] + ([template] if template else [])
        parts = prefix.split("-")
        names += ["%s-.%s" % ("-".join(parts[:count]), suffix) for count in range(len(parts) - 1, 0, -1)]
        names.append(suffix)
        dropins = {}
        for directory in self.search:
            for name in names:
                folder = os.path.join(directory, name + ".d")
                try:
                    entries = os.listdir(folder)
                except OSError:
                    continue
                for entry in entries:
                    if entry.endswith(".conf") and entry not in dropins:
                        dropins[entry] = os.path.join(folder, entry)
        return fragment, [dropins[name] for name in sorted(dropins)]

    def fingerprint(self, fragment, dropins):
        """What a daemon-reload would read: each file's path, mtime and content hash."""
        prints = []
        for path in [fragment] + list(dropins):
            if path is None:
                prints.append(None)
                continue
            try:
                info = os.stat(path)
                with open(path, "rb") as handle:
                    digest = hashlib.sha1(handle.read()).hexdigest()
                prints.append([path, info.st_mtime_ns, info.st_size, digest])
            except OSError:
                prints.append([path, 0, 0, ""])
        return prints

    def load(self, unit):
        """The unit's definition read from disk now (the journal gets systemd's warnings about it)."""
        fragment, dropins = self.discover(unit)
        definition = new_definition(unit)
        definition["sources"] = self.fingerprint(fragment, dropins)
        if unit in self.masked():
            definition.update(load_state="masked", fragment="/dev/null",
                              load_error="org.freedesktop.systemd1.UnitMasked \"Unit %s is masked.\"" % unit)
            return definition
        if fragment is None:
            definition.update(load_state="not-found", dropins=dropins,
                              load_error="org.freedesktop.systemd1.NoSuchUnit \"Unit %s not found.\"" % unit)
            return definition
        definition["fragment"], definition["dropins"] = fragment, dropins
        if os.path.realpath(fragment) == "/dev/null" or _is_empty(fragment):
            definition.update(load_state="masked", fragment="/dev/null",
                              load_error="org.freedesktop.systemd1.UnitMasked \"Unit %s is masked.\"" % unit)
            return definition
        entries = []
        for path in [fragment] + dropins:
            try:
                with open(path, "rb") as handle:
                    text = handle.read().decode("utf-8", "replace")
            except OSError as exc:
                definition["warnings"].append("%s: %s" % (path, exc.strerror))
                continue
            assignments, warnings = parse_unit_text(text)
            definition["warnings"] += ["%s:%d: %s" % (path, line, message) for line, message in warnings]
            entries += [(path, line, section, key, value) for section, key, value, line in assignments]
        interpret(definition, entries)
        return definition

    def loaded(self, unit):
        """The unit's loaded definition: the one kept since the last daemon-reload, else loaded now (and kept
        unless not found, as systemd loads a unit when first referenced and forgets one it did not find)."""
        path = self.path("loaded", unit + ".json")
        definition = read_json(path, None)
        if definition is not None:
            return definition
        definition = self.load(unit)
        if definition["load_state"] != "not-found":
            self.keep(unit, definition)
        return definition

    def keep(self, unit, definition):
        write_json(self.path("loaded", unit + ".json"), definition)
        for warning in definition["warnings"]:
            self.journal(unit, warning, priority=4)

    def need_reload(self, unit, definition):
        if definition["load_state"] == "not-found" and not os.path.exists(self.path("loaded", unit + ".json")):
            return False
        fragment, dropins = self.discover(unit)
        return self.fingerprint(fragment, dropins) != definition["sources"]

    def reload_all(self):
        """daemon-reload: every loaded unit read again; one no longer found is forgotten unless it runs."""
        for name in os.listdir(self.path("loaded")):
            if not name.endswith(".json"):
                continue
            unit = name[:-len(".json")]
            definition = self.load(unit)
            state = self.read_state(unit)
            if definition["load_state"] == "not-found" and state["active"] not in ACTIVE_STATES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path("loaded", name))
                continue
            self.keep(unit, definition)

    def unit_file_state(self, unit):
        """UnitFileState: from the files on disk now, as systemd reads it (no daemon-reload needed)."""
        if unit in self.masked():
            return "masked"
        fragment, _dropins = self.discover(unit)
        if fragment is None:
            return ""
        if os.path.realpath(fragment) == "/dev/null" or _is_empty(fragment):
            return "masked"
        if unit in self.enabled():
            return "enabled"
        return "disabled" if install_targets(fragment) else "static"

    def reconcile(self, unit, state):
        """A unit whose supervisor vanished (killed from outside): not running any more. True if changed."""
        supervisor = state.get("supervisor")
        if supervisor and not alive(supervisor["pid"], supervisor["start"]):
            state["supervisor"] = None
            if state["active"] in ACTIVE_STATES:
                if state["main_pid"] and alive(state["main_pid"]):
                    signal_processes([state["main_pid"]], signal.SIGKILL)
                state["main_pid"] = 0
                state["result"] = "resources"
                set_state(state, "failed", "failed")
                self.journal(unit, "%s: fake systemd: its supervisor is gone; the unit failed." % unit)
            return True
        return False


def _is_empty(path):
    try:
        return os.path.getsize(path) == 0 and os.path.isfile(path)
    except OSError:
        return False


def install_targets(fragment):
    """Whether the unit file has an [Install] section that enables it (WantedBy=, RequiredBy=, Alias=, ...)."""
    try:
        with open(fragment, "rb") as handle:
            assignments, _warnings = parse_unit_text(handle.read().decode("utf-8", "replace"))
    except OSError:
        return False
    return any(section == "Install" and key in ("WantedBy", "RequiredBy", "UpheldBy", "Alias", "Also")
               and value for section, key, value, _line in assignments)


# ------------------------------------------------------------------------------------------ definitions ---

def new_definition(unit):
    return {"id": unit, "load_state": "loaded", "load_error": "", "fragment": "", "dropins": [], "sources": [],
            "description": "", "type": "simple", "exec_start": [], "environment": [], "user": "", "group": "",
            "working_directory": "", "working_directory_optional": False, "cpu_affinity": None,
            "cpu_affinity_numa": False, "numa_policy": "", "numa_mask": None, "restart": "no",
            "restart_sec": DEFAULT_RESTART_SEC, "timeout_stop_sec": None, "timeout_start_sec": None,
            "notify_access": "", "kill_signal": int(signal.SIGTERM),
            "success_exit_status": [], "success_exit_signals": [],
            "start_limit_burst": DEFAULT_START_LIMIT_BURST, "start_limit_interval": DEFAULT_START_LIMIT_INTERVAL,
            "ignore_sigpipe": True, "umask": 0o022, "directories": {}, "warnings": [], "not_emulated": []}


def _exec_prefixes(raw):
    """The prefixes of a command's first word ("-", "@", ":", "+", "!", "!!"), as config_parse_exec reads them:
    (prefixes, the rest of the word)."""
    seen = []
    while raw:
        char = raw[0]
        if char in "-@:+" and char not in seen and not (char == "+" and "!" in seen):
            seen.append(char)
        elif char == "!" and "!" not in seen and "+" not in seen:
            seen.append("!")
        elif char == "!" and "!" in seen and "!!" not in seen:
            seen.append("!!")
        else:
            break
        raw = raw[1:]
    return "".join(seen), raw


def _exec_entry(value, unit, fragment):
    """An ExecStart= value (systemd.service(5), "Command lines") -> [command, ...]; raises SyntaxProblem.

    Specifiers are expanded on the whole value first, then the words are read (quotes, C escapes); a lone ";"
    separates commands and "\\;" is a literal ";"."""
    text = expand_specifiers(value, unit, fragment)
    commands, current, index = [], None, 0
    while True:
        while index < len(text) and text[index] in WHITESPACE:
            index += 1
        if text.startswith("\\;", index) and (index + 2 == len(text) or text[index + 2] in WHITESPACE):
            word, raw, index = ";", "\\;", index + 2
        else:
            if current is None and index < len(text):
                prefixes, _body = _exec_prefixes(text[index:].split(None, 1)[0])
                found = extract_word(text, index + len(prefixes))
                if found is None:
                    raise SyntaxProblem("Empty path in command line, ignoring: \"%s\"" % value)
                current = {"prefixes": prefixes, "words": [found[0]]}
                commands.append(current)
                index = found[2]
                continue
            found = extract_word(text, index)
            if found is None:
                break
            word, raw, index = found
            if raw == ";":
                current = None
                continue
        if current is None:
            raise SyntaxProblem("Empty command line before ';', ignoring: %s" % value)
        current["words"].append(word)
    entries = []
    for command in commands:
        words, prefixes = command["words"], command["prefixes"]
        if "@" in prefixes:
            if len(words) < 2:
                raise SyntaxProblem("Empty argv[0] with the '@' prefix, ignoring: %s" % value)
            path, argv = words[0], words[1:]
        else:
            path, argv = words[0], list(words)
        if not path or (not path.startswith("/") and "/" in path) or path.endswith("/") or path in (".", ".."):
            raise SyntaxProblem("Neither a valid executable name nor an absolute path: %s" % path)
        entries.append({"path": path, "argv": argv, "ignore": "-" in prefixes, "no_env": ":" in prefixes,
                        "privileged": "+" in prefixes or "!" in prefixes, "prefixes": prefixes, "raw": value})
    return entries


def _environment_words(value, unit, fragment):
    found = []
    for word, _raw in extract_words(value):
        word = expand_specifiers(word, unit, fragment)
        name, sep, text = word.partition("=")
        if not sep or not _ENV_NAME.match(name) or re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text):
            raise SyntaxProblem("Invalid environment assignment, ignoring: %s" % word)
        found.append(word)
    return found


def interpret(definition, entries):
    """Apply the assignments in order (fragment first, then each drop-in): later ones win, an empty one resets
    a list; each refused value is a warning, as systemd logs it, and the setting keeps its earlier value."""
    unit = definition["id"]
    fragment = definition["fragment"]
    install = {}
    for path, line, section, key, value in entries:
        where = "%s:%d" % (path, line)
        try:
            if section == "Install":
                if key in ("WantedBy", "RequiredBy", "UpheldBy", "Alias", "Also", "DefaultInstance"):
                    install[key] = [] if not value else install.get(key, []) + value.split()
                continue
            if section == "Unit":
                _unit_setting(definition, key, value, unit, fragment)
            elif section == "Service":
                _service_setting(definition, key, value, unit, fragment)
        except SyntaxProblem as exc:
            definition["warnings"].append("%s: %s" % (where, exc))
    definition["install"] = install
    if unit.endswith(".service") and definition["load_state"] == "loaded":
        commands = definition["exec_start"]
        problem = None
        if not commands:
            problem = "Service has no ExecStart=, ExecStop=, or SuccessAction=. Refusing."
        elif len(commands) > 1 and definition["type"] != "oneshot":
            problem = ("Service has more than one ExecStart= setting, which is only allowed for Type=oneshot "
                       "services. Refusing.")
        if problem:
            definition["load_state"] = "bad-setting"
            definition["load_error"] = ("org.freedesktop.systemd1.BadUnitSetting \"Unit %s has a bad unit file "
                                        "setting.\"" % unit)
            definition["warnings"].append("%s: %s" % (unit, problem))


def _unit_setting(definition, key, value, unit, fragment):
    if key == "Description":
        definition["description"] = expand_specifiers(value, unit, fragment)
    elif key in ("StartLimitIntervalSec", "StartLimitInterval"):
        definition["start_limit_interval"] = _timespan(key, value, DEFAULT_START_LIMIT_INTERVAL)
    elif key == "StartLimitBurst":
        definition["start_limit_burst"] = _unsigned(key, value, DEFAULT_START_LIMIT_BURST)
    else:
        _not_emulated(definition, key)


def _not_emulated(definition, key):
    definition["not_emulated"].append(key)
    if key in NOT_EMULATED:
        raise SyntaxProblem("fake systemd does not emulate %s=, ignoring." % key)


def _service_setting(definition, key, value, unit, fragment):
    if key == "ExecStart":
        definition["exec_start"] = [] if not value else definition["exec_start"] + _exec_entry(value, unit,
                                                                                               fragment)
    elif key == "Type":
        if value not in SERVICE_TYPES:
            raise SyntaxProblem("Failed to parse service type, ignoring: %s" % value)
        definition["type"] = value
    elif key == "Environment":
        definition["environment"] = [] if not value else definition["environment"] + _environment_words(
            value, unit, fragment)
    elif key in ("User", "Group"):
        name = expand_specifiers(value, unit, fragment)
        if name and not (name.isdigit() or _ACCOUNT.match(name)):
            raise SyntaxProblem("Invalid user/group name or numeric ID, ignoring: %s" % name)
        definition[key.lower()] = name
    elif key == "WorkingDirectory":
        path = expand_specifiers(value, unit, fragment)
        optional = path.startswith("-")
        path = path[1:] if optional else path
        if path and path != "~" and not path.startswith("/"):
            raise SyntaxProblem("Not an absolute path, ignoring: %s" % path)
        definition["working_directory"], definition["working_directory_optional"] = path, optional
    elif key == "CPUAffinity":
        if not value:
            definition["cpu_affinity"], definition["cpu_affinity_numa"] = None, False
        elif value == "numa":
            definition["cpu_affinity"], definition["cpu_affinity_numa"] = None, True
        else:
            definition["cpu_affinity"] = sorted(set(definition["cpu_affinity"] or []) | set(parse_cpu_set(value)))
            definition["cpu_affinity_numa"] = False
    elif key == "NUMAPolicy":
        if value and value not in NUMA_POLICIES:
            raise SyntaxProblem("Failed to parse NUMA policy, ignoring: %s" % value)
        definition["numa_policy"] = value
    elif key == "NUMAMask":
        if not value:
            definition["numa_mask"] = None
        elif value == "all":
            definition["numa_mask"] = _present_nodes()
        else:
            definition["numa_mask"] = sorted(set(definition["numa_mask"] or []) | set(parse_cpu_set(value)))
    elif key == "Restart":
        if value not in RESTART_POLICIES:
            raise SyntaxProblem("Failed to parse service restart specifier, ignoring: %s" % value)
        definition["restart"] = value
    elif key == "RestartSec":
        definition["restart_sec"] = _timespan(key, value, DEFAULT_RESTART_SEC)
    elif key in ("TimeoutStopSec", "TimeoutStartSec", "TimeoutSec"):
        seconds = _timespan(key, value, None)
        if key != "TimeoutStartSec":
            definition["timeout_stop_sec"] = seconds
        if key != "TimeoutStopSec":
            definition["timeout_start_sec"] = seconds
    elif key == "NotifyAccess":
        if value not in ("", "none", "main", "exec", "all"):
            raise SyntaxProblem("Failed to parse notify access specifier, ignoring: %s" % value)
        definition["notify_access"] = value
    elif key == "KillSignal":
        try:
            definition["kill_signal"] = parse_signal(value) if value else int(signal.SIGTERM)
        except ValueError:
            raise SyntaxProblem("Failed to parse signal, ignoring: %s" % value) from None
    elif key == "SuccessExitStatus":
        if not value:
            definition["success_exit_status"], definition["success_exit_signals"] = [], []
        for word in value.split():
            if word.isdigit():
                definition["success_exit_status"].append(int(word))
            else:
                try:
                    definition["success_exit_signals"].append(parse_signal(word))
                except ValueError:
                    raise SyntaxProblem("Failed to parse exit status, ignoring: %s" % word) from None
    elif key in ("StartLimitInterval", "StartLimitBurst"):
        _unit_setting(definition, key, value, unit, fragment)
    elif key in DIRECTORIES:
        names = []
        for word, _raw in extract_words(expand_specifiers(value, unit, fragment)):
            name = word.split(":", 1)[0]
            if name.startswith("/") or ".." in name.split("/") or not name:
                raise SyntaxProblem("%s= path is not valid, ignoring: %s" % (key, word))
            names.append(name)
        definition["directories"][key] = definition["directories"].get(key, []) + names if names else []
    elif key == "IgnoreSIGPIPE":
        definition["ignore_sigpipe"] = value.lower() in ("1", "yes", "true", "on")
    elif key == "UMask":
        try:
            definition["umask"] = int(value, 8) if value else 0o022
        except ValueError:
            raise SyntaxProblem("Failed to parse mode value, ignoring: %s" % value) from None
    else:
        _not_emulated(definition, key)


def _timespan(key, value, default):
    if not value:
        return default
    try:
        return parse_timespan(value)
    except ValueError:
        raise SyntaxProblem("Failed to parse %s= parameter, ignoring: %s" % (key, value)) from None


def _unsigned(key, value, default):
    if not value:
        return default
    if not value.isdigit():
        raise SyntaxProblem("Failed to parse %s= value, ignoring: %s" % (key, value))
    return int(value)


def _present_nodes():
    try:
        return parse_cpu_set(_read_first_line("/sys/devices/system/node/online")) or [0]
    except SyntaxProblem:
        return [0]


def unit_status_name(definition):
    """How systemd 252 names a unit in "Started ..." lines: "foo.service - Its Description"."""
    description = definition.get("description")
    unit = definition["id"]
    return "%s - %s" % (unit, description) if description and description != unit else unit


def exec_plan(definition, invocation_id, context):
    """What the supervisor's child does for the unit's ExecStart=: paths, argv, environment, placement."""
    command = definition["exec_start"][0]
    env = {"PATH": MANAGER_PATH, "INVOCATION_ID": invocation_id}
    notes = []
    user = None if command["privileged"] else account(definition["user"])
    if user:
        env.update(USER=user.pw_name, LOGNAME=user.pw_name, HOME=user.pw_dir, SHELL=user.pw_shell)
    elif definition["user"] and not command["privileged"]:
        notes.append("fake systemd: User=%s is not applied (%s); the service runs as uid %d" % (
            definition["user"], "no such user here" if os.geteuid() == 0 else "the fake does not run as root",
            os.geteuid()))
    directories = []
    for key, names in sorted(definition.get("directories", {}).items()):
        if names:
            base, variable = DIRECTORIES[key]
            paths = [os.path.join(context.root, base, name) for name in names]
            env[variable] = ":".join(paths)
            directories += [(key, path) for path in paths]
    for assignment in definition["environment"]:
        name, _sep, value = assignment.partition("=")
        env[name] = value
    argv = command["argv"] if command["no_env"] else replace_env_argv(command["argv"], env)
    cpus = definition["cpu_affinity"]
    if definition["cpu_affinity_numa"]:
        cpus = node_cpus(definition["numa_mask"] or []) if definition["numa_mask"] else None
    directory = definition["working_directory"]
    if directory == "~":
        directory = user.pw_dir if user else "/root"
    return {"path": command["path"], "argv": argv, "env": env, "cpus": cpus,
            "numa_policy": definition["numa_policy"], "numa_mask": definition["numa_mask"] or [],
            "user": user.pw_name if user else None, "uid": user.pw_uid if user else None,
            "gid": group_id(definition["group"], user) if user or definition["group"] else None,
            "cwd": directory or "/", "cwd_optional": definition["working_directory_optional"],
            "umask": definition["umask"], "ignore_sigpipe": definition["ignore_sigpipe"],
            "ident": os.path.basename(command["path"]), "ignore": command["ignore"], "directories": directories,
            "notes": notes}


def account(name):
    """User=: the passwd entry to run as when the fake runs as root and the user exists; else None (the
    fake then runs the service as itself: a test host need not have the service's account)."""
    if not name or os.geteuid() != 0:
        return None
    try:
        return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        return None


def group_id(name, user):
    import grp
    if name and os.geteuid() == 0:
        try:
            return grp.getgrgid(int(name)).gr_gid if name.isdigit() else grp.getgrnam(name).gr_gid
        except (KeyError, OverflowError):
            pass
    return user.pw_gid if user else None


def new_invocation_id():
    return os.urandom(16).hex()


# ------------------------------------------------------------------------------------------- show ---------

def properties(context, unit, definition, state):
    """systemctl show's properties of a unit, in systemd's order: [(name, value)]."""
    service = unit.endswith(".service")
    props = []
    add = props.append
    if service:
        timeout = definition.get("timeout_stop_sec")
        commands = definition.get("exec_start") or []
        add(("Type", definition.get("type", "simple")))
        add(("Restart", definition.get("restart", "no")))
        add(("NotifyAccess", definition.get("notify_access") or (
            "main" if definition.get("type") in NOTIFY_TYPES else "none")))
        add(("RestartUSec", format_timespan(definition.get("restart_sec", DEFAULT_RESTART_SEC))))
        add(("TimeoutStopUSec", format_timespan(context.timeout_stop if timeout is None else timeout)))
        add(("TimeoutStartUSec", format_timespan(context.timeout_start if definition.get("timeout_start_sec") is None
                                                 else definition["timeout_start_sec"])))
        add(("MainPID", str(state["main_pid"])))
        add(("StatusText", state.get("status_text", "")))
        add(("ControlPID", "0"))
        add(("Result", state["result"]))
        add(("NRestarts", str(state["n_restarts"])))
        add(("ExecMainStartTimestamp", format_timestamp(state["exec_main_start"])))
        add(("ExecMainExitTimestamp", format_timestamp(state["exec_main_exit"])))
        add(("ExecMainPID", str(state["exec_main_pid"])))
        add(("ExecMainCode", str(state["exec_main_code"])))
        add(("ExecMainStatus", str(state["exec_main_status"])))
        for command in commands[:1]:
            add(("ExecStart", "{ path=%s ; argv[]=%s ; ignore_errors=%s ; start_time=[%s] ; stop_time=[%s] ; "
                              "pid=%d ; code=%s ; status=%d }" % (
                                  command["path"], " ".join(command["argv"]), "yes" if command["ignore"] else "no",
                                  format_timestamp(state["exec_main_start"]) or "n/a",
                                  format_timestamp(state["exec_main_exit"]) or "n/a", state["exec_main_pid"],
                                  CODE_NAMES.get(state["exec_main_code"], "(null)"), state["exec_main_status"])))
        add(("ControlGroup", ""))
        add(("Environment", " ".join(_show_word(word) for word in definition.get("environment", []))))
        add(("UMask", "%04o" % definition.get("umask", 0o022)))
        add(("WorkingDirectory", definition.get("working_directory") or "/"))
        add(("CPUAffinityFromNUMA", "yes" if definition.get("cpu_affinity_numa") else "no"))
        add(("CPUAffinity", format_cpu_set(definition.get("cpu_affinity"))))
        add(("NUMAPolicy", definition.get("numa_policy") or "n/a"))
        add(("NUMAMask", format_cpu_set(definition.get("numa_mask"))))
        add(("User", definition.get("user", "")))
        add(("Group", definition.get("group", "")))
        add(("KillSignal", str(definition.get("kill_signal", 15))))
    add(("Id", unit))
    add(("Names", unit))
    add(("Description", definition.get("description") or unit))
    add(("LoadState", definition["load_state"]))
    add(("ActiveState", state["active"]))
    add(("SubState", state["sub"]))
    add(("FragmentPath", definition.get("fragment", "")))
    add(("DropInPaths", " ".join(definition.get("dropins") or [])))
    add(("UnitFileState", context.unit_file_state(unit)))
    add(("UnitFilePreset", "enabled" if definition["load_state"] != "not-found" else ""))
    add(("StateChangeTimestamp", format_timestamp(state["state_change"])))
    add(("InactiveExitTimestamp", format_timestamp(state["inactive_exit"])))
    add(("ActiveEnterTimestamp", format_timestamp(state["active_enter"])))
    add(("ActiveExitTimestamp", format_timestamp(state["active_exit"])))
    add(("InactiveEnterTimestamp", format_timestamp(state["inactive_enter"])))
    add(("CanStart", "yes" if definition["load_state"] == "loaded" else "no"))
    add(("CanStop", "yes"))
    add(("NeedDaemonReload", "yes" if context.need_reload(unit, definition) else "no"))
    add(("StartLimitIntervalUSec", format_timespan(definition.get("start_limit_interval",
                                                                  DEFAULT_START_LIMIT_INTERVAL))))
    add(("StartLimitBurst", str(definition.get("start_limit_burst", DEFAULT_START_LIMIT_BURST))))
    add(("StartLimitAction", "none"))
    add(("InvocationID", state["invocation_id"]))
    if definition.get("load_error"):
        add(("LoadError", definition["load_error"]))
    return props


def _show_word(word):
    return word if re.match(r"^[A-Za-z0-9_=:,./@%+-]*$", word) else '"%s"' % word.replace("\\", "\\\\").replace(
        '"', '\\"')
