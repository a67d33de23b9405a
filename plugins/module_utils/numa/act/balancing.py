"""Automatic NUMA balancing: desired value, boot-time conflicts, and the plan of changes.

The kernel's automatic NUMA balancing unmaps pages to sample accesses and migrates
them. On a service whose CPUs and memory are bound on purpose it only adds hinting
faults and moves pages away from where they were bound, so the kernel documentation
says to disable it for workloads that are already NUMA-bound.

This module decides, then changes things only through ``apply_runtime`` and
``write_dropin``. It reads ``<root>/proc/sys`` and the sysctl configuration under
``<root>`` and returns a ``BalancingPlan``: the runtime writes, the content of the one
drop-in file the collection owns (``/etc/sysctl.d/60-inferops-numa.conf``), the
settings elsewhere that would undo it at boot, and what an active tuned profile does
to it. The Ansible module turns ``NumaError`` into ``fail_json``.

It runs as root on whatever tree ``root`` names, so nothing under ``root`` is reached
through a symlink it did not resolve itself (system/root_files reaches them all), and no
error quotes a file's content.

Boot order follows systemd-sysctl (sysctl.d(5)): ``*.conf`` files from /etc/sysctl.d,
/run/sysctl.d, /usr/local/lib/sysctl.d, /usr/lib/sysctl.d and /lib/sysctl.d; a name
found in an earlier directory hides the same name in later ones (a symlink to
/dev/null disables it); the survivors are applied sorted by file name whatever their
directory, and a later assignment wins. /etc/sysctl.conf is treated as applied after
every sysctl.d file: Debian reaches it through the 99-sysctl.conf symlink, and
``sysctl --system`` (procps, also used by tuned) reads it last.
"""

import configparser
import errno
import os
import posixpath
import re
import stat
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..system import safe_fs
from ..base.errors import NumaError
from ..base.cpulist import format_cpulist
from ..read.kernel_files import read_vmstat
from ..read.topology import memory_tiers
from ..system.root_files import (BECOME_FIX, DROPIN_MODE, MAX_TEXT_BYTES, TEMPORARY_PREFIX, Refused, dropin_distrust,
                                 host_path, is_dir, is_file, open_dir, open_in, read_config, read_handle, read_under,
                                 refusal, remove, resolve, write_error, write_under)

BALANCING_KEY = "kernel.numa_balancing"
ZONE_RECLAIM_KEY = "vm.zone_reclaim_mode"
STATE_VALUES = {"disabled": 0, "enabled": 1, "tiering": 2}
STATES = tuple(STATE_VALUES) + ("raw", "auto")

DROPIN_NAME = "60-inferops-numa.conf"
DROPIN_DIR = "/etc/sysctl.d"
DROPIN_PATH = DROPIN_DIR + "/" + DROPIN_NAME
SYSCTL_CONF = "/etc/sysctl.conf"
# Highest precedence first (sysctl.d(5)); /lib is a separate tree on non-merged-/usr systems.
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
MASK_TARGET = "/dev/null"

TUNED_ACTIVE = "/etc/tuned/active_profile"
TUNED_MAIN = "/etc/tuned/tuned-main.conf"
# Where tuned finds a profile, user directories first (tuned >= 2.23 adds the profiles/ level).
TUNED_PROFILE_DIRS = ("/etc/tuned/profiles", "/etc/tuned", "/usr/lib/tuned/profiles", "/usr/lib/tuned")
# Options of a tuned unit that are not sysctl names.
TUNED_UNIT_OPTIONS = frozenset(("type", "enabled", "replace", "drop", "devices", "devices_udev_regex",
                                "priority", "script", "include"))

VMSTAT_COUNTERS = ("numa_pte_updates", "numa_hint_faults")
_MAX_KNOB_BYTES = 4096
_GLOB_CHARS = re.compile(r"[*?\[]")
_TRUE_WORDS = frozenset(("1", "true", "yes", "on", "y"))
_FALSE_WORDS = frozenset(("0", "false", "no", "off", "n"))


class BalancingRequest(NamedTuple):
    """What the caller asked for (the module's options)."""

    state: str = "disabled"
    value: Optional[int] = None
    persist: bool = True
    zone_reclaim_mode: Optional[int] = None
    on_conflict: str = "fail"
    force: bool = False  # replace (or remove) a drop-in that was masked on purpose


class StateChoice(NamedTuple):
    """The state written for the one requested (``auto`` decided on this host), and what to say about it."""

    state: str  # disabled, enabled, tiering or raw
    notes: List[str]
    warnings: List[str]


class Dropin(NamedTuple):
    """What sits at the drop-in's path now."""

    content: Optional[str]  # None when absent, or not a regular file this module may read
    flaw: Optional[str]  # why it must be rewritten even when the content is right, e.g. "a symlink to '/x'"
    masked: bool  # a symlink to /dev/null: systemd-sysctl skips the name on purpose


class ConfFile(NamedTuple):
    """A sysctl configuration file as systemd-sysctl sees it."""

    path: str  # root-relative, e.g. /usr/lib/sysctl.d/50-default.conf
    target: str  # root-relative path it finally points to (== path unless a symlink)


class Assignment(NamedTuple):
    key: str  # path form from canonical_key, e.g. kernel/numa_balancing
    value: str
    line: int


class Setting(NamedTuple):
    """An assignment of a key we manage, in boot order."""

    path: str
    key: str  # dotted name as in BALANCING_KEY
    value: str
    line: int
    position: int  # index of its file in the boot sequence


class BalancingPlan(NamedTuple):
    """Everything the module needs to act and report; built by ``make_plan``."""

    root: str
    supported: bool
    desired: Dict[str, int]  # sysctl name -> value, in drop-in order
    before: Dict[str, int]  # runtime values read now
    dropin_before: Optional[str]  # current drop-in content, None when absent
    dropin_after: Optional[str]  # wanted drop-in content, None when it must not exist (or stays masked)
    dropin_flaw: Optional[str]  # Dropin.flaw of the file being replaced or removed
    dropin_masked: bool  # masked on purpose and left alone (force is false)
    conflicts: List[Dict[str, object]]
    tuned: Optional[Dict[str, object]]
    notes: List[str]  # informational, folded into msg
    warnings: List[str]
    error: Optional[str]  # set when on_conflict=fail and the boot config would undo us
    state: str  # what is written: the requested state, or what auto chose on this host

    @property
    def after(self) -> Dict[str, int]:
        merged = dict(self.before)
        merged.update(self.desired)
        return merged

    @property
    def runtime_changes(self) -> List[Tuple[str, int]]:
        if not self.supported:
            return []
        return [(key, value) for key, value in self.desired.items() if self.before.get(key) != value]

    @property
    def dropin_changed(self) -> bool:
        return self.dropin_before != self.dropin_after or self.dropin_flaw is not None

    @property
    def changed(self) -> bool:
        return bool(self.runtime_changes) or self.dropin_changed

    @property
    def dropin_file(self) -> str:
        return host_path(self.root, DROPIN_PATH)


# ---------------------------------------------------------------- paths and keys


def knob_file(key: str) -> str:
    """Path of a sysctl's /proc/sys file on the target, e.g. /proc/sys/kernel/numa_balancing."""
    return "/proc/sys/" + key.replace(".", "/")


def knob_path(root: str, key: str) -> str:
    return host_path(root, knob_file(key))


def canonical_key(key: str) -> str:
    """Path form of a sysctl name written with either separator, as systemd-sysctl compares them.

    sysctl.d(5): if the first separator is a slash the name is already a path (dots stay
    dots: net/ipv4/conf/eth0.200/...); if it is a dot, dots and slashes swap.
    """
    key = key.strip()
    first = re.search(r"[./]", key)
    if first is not None and first.group(0) == ".":
        key = key.translate(str.maketrans("./", "/."))
    return re.sub(r"/+", "/", key).strip("/")


def choose_state(requested: str, tiers: List[Dict[str, Any]]) -> StateChoice:
    """What ``requested`` writes on a host with memory ``tiers`` (fastest first, as topology.memory_tiers).

    A host whose nodes sit in more than one tier (CXL, PMEM or HBM beside DRAM) gets ``tiering`` for ``auto``:
    mode 2 keeps promoting hot pages from the slower tiers without balancing pages across sockets, which
    ``disabled`` would stop too. Any other host gets ``disabled``, what NUMA-bound services want. Memory tiers
    came in Linux 6.1, after mode 2 (5.18), so a kernel that shows them has the mode. ``disabled`` asked for on a
    tiered host is written, with a warning that promotion stops."""
    holding = [tier for tier in tiers if tier["nodes"]]  # an empty tier (a captured tree's) ranks no node
    slower = sorted(node for tier in holding[1:] for node in tier["nodes"])
    if requested == "auto" and slower:
        return StateChoice("tiering", ["state auto: memory tiers, node(s) %s slower: tiering (mode 2) promotes their "
                                       "hot pages without balancing across sockets" % format_cpulist(slower)], [])
    if requested == "auto":
        return StateChoice("disabled", ["state auto: no slower memory tier, so disabled"], [])
    if requested == "disabled" and slower:
        return StateChoice("disabled", [], [
            "%s = 0 on a host with memory tiers also stops promoting hot pages from the slower node(s) %s: state "
            "tiering (or auto) keeps that without balancing across sockets" % (BALANCING_KEY, format_cpulist(slower))])
    return StateChoice(requested, [], [])


def desired_value(state: str, value: Optional[int]) -> int:
    if state == "raw":
        if value is None:
            raise NumaError("state=raw needs value: set value to the integer to write to %s" % BALANCING_KEY)
        if value < 0:
            raise NumaError("value must be >= 0 (got %d): %s is a bit mask" % (value, BALANCING_KEY))
        return value
    if value is not None:
        raise NumaError("value is only used with state=raw: drop value, or set state=raw")
    if state not in STATE_VALUES:
        raise NumaError("unknown state %r: use one of %s" % (state, ", ".join(STATES)))
    return STATE_VALUES[state]


def by_path(keys: List[str]) -> Dict[str, str]:
    """canonical_key form -> dotted name, to match any spelling of the keys we manage."""
    return {canonical_key(key): key for key in keys}


def same_value(written: str, wanted: int) -> bool:
    try:
        return int(written.split()[0]) == wanted
    except (ValueError, IndexError):
        return False


# ---------------------------------------------------------------- sysctl.d parsing


def parse_sysctl(text: str) -> List[Assignment]:
    """Assignments in a sysctl.d/sysctl.conf text, as systemd-sysctl reads them.

    Comment lines start with '#' or ';' after optional whitespace; a leading '-' on
    the key only means "ignore errors"; a bare '-key' (no '=') excludes a key from glob
    matching and assigns nothing; a line without '=' is a syntax error systemd skips.
    Glob keys are skipped: systemd never applies a glob to a key that an explicit
    assignment (ours) sets.
    """
    found = []  # type: List[Assignment]
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        key = key[1:].strip() if key.startswith("-") else key
        if not key or _GLOB_CHARS.search(key):
            continue
        found.append(Assignment(canonical_key(key), value.strip(), number))
    return found


def render_dropin(desired: Dict[str, int], state: str) -> str:
    lines = [
        "# Managed by Ansible: inferops.numa numa_balancing module. Local edits are overwritten;",
        "# change the module's options instead. See the collection's docs/numa_balancing.md.",
        "# Automatic NUMA balancing unmaps pages to sample accesses and migrates them: on",
        "# inference services whose CPUs and memory are bound on purpose it adds fault stalls",
        "# and moves bound pages, so the kernel docs advise disabling it for NUMA-bound work.",
        "# Requested state: %s." % state,
    ]
    lines.extend("%s = %d" % (key, value) for key, value in desired.items())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- boot order


def _listing(root: str, directory: str) -> List[str]:
    try:
        handle = open_dir(root, resolve(root, directory))
    except OSError:
        return []
    try:
        names = os.listdir(handle)
    except OSError:
        return []
    finally:
        os.close(handle)
    # systemd skips hidden files and anything not named *.conf or not a file.
    return [name for name in names
            if name.endswith(".conf") and not name.startswith(".")
            and not is_dir(root, directory + "/" + name)]


def boot_sequence(root: str, with_ours: bool) -> List[ConfFile]:
    """sysctl files in the order they are applied at boot; /etc/sysctl.conf last.

    The drop-in on disk is left out: ``with_ours`` puts it where its name sorts (its
    wanted content is applied by the caller). Without it, a same-named file in /run or
    /usr/lib that ours would have hidden takes its place.
    """
    by_name = {}  # type: Dict[str, ConfFile]
    for directory in SYSCTL_DIRS:
        for name in _listing(root, directory):
            path = directory + "/" + name
            if name not in by_name and path != DROPIN_PATH:
                by_name[name] = ConfFile(path, resolve(root, path))
    if with_ours:
        by_name[DROPIN_NAME] = ConfFile(DROPIN_PATH, DROPIN_PATH)
    ordered = [by_name[name] for name in sorted(by_name) if by_name[name].target != SYSCTL_CONF]
    if is_file(root, SYSCTL_CONF):
        ordered.append(ConfFile(SYSCTL_CONF, SYSCTL_CONF))
    return ordered


def _read_text(root: str, conf: ConfFile, warnings: List[str]) -> str:
    if conf.target == MASK_TARGET:
        return ""
    try:
        return read_under(root, conf.target)
    except OSError as exc:
        warnings.append("%s: cannot read (%s); its settings were not checked"
                        % (host_path(root, conf.path), exc.strerror or exc))
        return ""


def boot_settings(root: str, keys: List[str], dropin: Optional[str],
                  warnings: List[str]) -> Tuple[List[Setting], int]:
    """Assignments of ``keys`` in boot order, and the position of our drop-in (-1: none)."""
    sequence = boot_sequence(root, dropin is not None)
    wanted = by_path(keys)
    settings = []  # type: List[Setting]
    ours = -1
    for position, conf in enumerate(sequence):
        if conf.path == DROPIN_PATH:
            ours = position
            text = dropin or ""
        else:
            text = _read_text(root, conf, warnings)
        settings.extend(Setting(conf.path, wanted[a.key], a.value, a.line, position)
                        for a in parse_sysctl(text) if a.key in wanted)
    return settings, ours


def find_conflicts(root: str, settings: List[Setting], ours: int,
                   desired: Dict[str, int]) -> List[Dict[str, object]]:
    """Other files' settings that differ from ours, each with whether it wins at boot."""
    winners = {}  # type: Dict[str, Setting]
    for setting in settings:
        winners[setting.key] = setting
    conflicts = []  # type: List[Dict[str, object]]
    for setting in settings:
        if setting.path == DROPIN_PATH or same_value(setting.value, desired[setting.key]):
            continue
        conflicts.append({
            "file": host_path(root, setting.path),
            "key": setting.key,
            "value": setting.value,
            "line": setting.line,
            "applied_after_ours": ours < 0 or setting.position > ours,
            "wins_at_boot": winners[setting.key] is setting,
            "fix": _conflict_fix(root, setting),
        })
    return conflicts


def _conflict_fix(root: str, setting: Setting) -> str:
    where = host_path(root, setting.path)
    if setting.path.startswith("/etc/"):
        return "remove or change line %d of %s" % (setting.line, where)
    # Files under /usr, /lib and /run belong to packages or generators: an edit would not last.
    return ("mask %s with a same-named symlink to /dev/null in /etc/sysctl.d (that disables the whole file), "
            "or override it in an /etc/sysctl.d file that sorts after it" % where)


def describe_mask(dropin: str) -> str:
    return ("%s is masked (a symlink to %s), so systemd-sysctl skips that name at boot and this value is not "
            "persisted; left alone on purpose: remove the mask, or set force: true to replace it (with "
            "persist: false, to remove it)" % (dropin, MASK_TARGET))


def _where(conflict: Dict[str, object]) -> str:
    return "%s = %s in %s (line %s)" % (conflict["key"], conflict["value"], conflict["file"], conflict["line"])


def describe_conflict(conflict: Dict[str, object], dropin: str, accepted: bool) -> str:
    tail = "Accepted because on_conflict=warn." if accepted else "Or set on_conflict=warn to accept it."
    return ("%s is applied after %s at boot and wins, so the setting comes back after a reboot. Fix: %s. %s"
            % (_where(conflict), dropin, conflict["fix"], tail))


def _describe_harmless(conflict: Dict[str, object], dropin: str) -> str:
    if conflict["applied_after_ours"]:
        return "%s is applied after %s but a later file sets the wanted value again" % (_where(conflict), dropin)
    return "%s is applied before %s, which overrides it" % (_where(conflict), dropin)


# ---------------------------------------------------------------- tuned


def _parse_bool(text: str, default: bool) -> bool:
    word = text.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    return default


def _tuned_reapplies_sysctl(root: str) -> bool:
    """tuned-main.conf ``reapply_sysctl`` (default on): re-run /etc/sysctl.d after the profile."""
    try:
        lines = read_config(root, TUNED_MAIN).splitlines()
    except OSError:
        return True
    value = True
    for line in lines:
        key, sep, rest = line.partition("=")
        if sep and key.strip() == "reapply_sysctl":
            value = _parse_bool(rest.split("#")[0], True)
    return value


def _find_profile(root: str, name: str, seen: List[str]) -> Optional[str]:
    for directory in TUNED_PROFILE_DIRS:
        path = "%s/%s/tuned.conf" % (directory, posixpath.basename(name))
        # A profile in /etc may include the vendor profile of the same name.
        if path not in seen and is_file(root, path):
            return path
    return None


def _read_profile(root: str, path: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(delimiters=("=",), inline_comment_prefixes=("#",),
                                       strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(read_config(root, path), path)
    return parser


def _parse_failure(exc: configparser.Error) -> str:
    """Where a profile stopped parsing; configparser's own message quotes the line, which is not ours to echo."""
    numbers = [number for number, _text in getattr(exc, "errors", None) or ()]
    if not numbers and getattr(exc, "lineno", None):
        numbers = [exc.lineno]  # type: ignore[attr-defined]
    where = " at line %s" % ", ".join(str(number) for number in numbers) if numbers else ""
    return "expected [section] headers and key = value lines%s" % where


def _profile_sysctls(parser: configparser.ConfigParser) -> List[Tuple[str, str]]:
    found = []  # type: List[Tuple[str, str]]
    for section in parser.sections():
        if section != "sysctl" and parser.get(section, "type", fallback="") != "sysctl":
            continue
        if not _parse_bool(parser.get(section, "enabled", fallback="true"), True):
            continue
        found.extend((canonical_key(option), value) for option, value in parser.items(section)
                     if option not in TUNED_UNIT_OPTIONS)
    return found


def _load_tuned(root: str, names: List[str], seen: List[str], settings: Dict[str, Dict[str, str]],
                warnings: List[str]) -> None:
    """Walk profiles the way tuned loads them: includes first, the including profile last wins.

    ``settings`` maps canonical_key form -> the last assignment seen.
    """
    for name in filter(None, names):
        if "$" in name:
            warnings.append("tuned include %r uses a variable; that profile was not checked" % name)
            continue
        path = _find_profile(root, name, seen)
        if path is None:
            warnings.append("tuned profile %r not found under %s" % (name, ", ".join(TUNED_PROFILE_DIRS)))
            continue
        seen.append(path)
        try:
            parser = _read_profile(root, path)
        except OSError as exc:
            warnings.append("%s: cannot read tuned profile (%s)" % (host_path(root, path), exc.strerror or exc))
            continue
        except configparser.Error as exc:
            warnings.append("%s: cannot parse tuned profile (%s)" % (host_path(root, path), _parse_failure(exc)))
            continue
        include = parser.get("main", "include", fallback="").strip()
        if include:
            _load_tuned(root, re.split(r"\s*[,;]\s*", include), seen, settings, warnings)
        for key, value in _profile_sysctls(parser):
            settings[key] = {"profile": name, "file": host_path(root, path), "value": value}


def read_tuned(root: str, keys: List[str], warnings: List[str]) -> Optional[Dict[str, object]]:
    """The active tuned profile and what it sets for ``keys``; None when none is active."""
    try:
        names = read_config(root, TUNED_ACTIVE).split()
    except OSError:
        return None
    if not names:
        return None
    settings = {}  # type: Dict[str, Dict[str, str]]
    seen = []  # type: List[str]
    _load_tuned(root, names, seen, settings, warnings)
    found = [dict(settings[path], key=key) for path, key in by_path(keys).items() if path in settings]
    return {
        "active_profile": " ".join(names),
        "files": [host_path(root, path) for path in seen],
        "settings": found,
        "reapply_sysctl": _tuned_reapplies_sysctl(root),
    }


def describe_tuned(tuned: Dict[str, object], setting: Dict[str, str], ours_persisted: bool) -> str:
    head = ("tuned profile '%s' sets %s = %s in %s; tuned writes it when it starts (after systemd-sysctl) "
            "and on every profile switch. " % (setting["profile"], setting["key"], setting["value"], setting["file"]))
    if tuned["reapply_sysctl"] and ours_persisted:
        effect = ("With reapply_sysctl on it then re-applies /etc/sysctl.d, so this module's value returns, "
                  "but the knob flips in between. ")
    else:
        effect = "Its value stays in force until this module runs again. "
    return head + effect + ("Fix: remove the line from the profile, or activate a custom profile that includes "
                            "'%s' and sets %s to the wanted value." % (setting["profile"], setting["key"]))


# ---------------------------------------------------------------- runtime knobs


def read_runtime(root: str, key: str) -> Optional[int]:
    """Current value of a /proc/sys knob; None when this kernel does not have it."""
    path = knob_path(root, key)
    try:
        text = read_under(root, knob_file(key), _MAX_KNOB_BYTES)
    except FileNotFoundError:
        return None
    except Refused as exc:
        raise refusal(exc, "read %s from %s" % (key, path)) from None
    except PermissionError as exc:
        raise NumaError("cannot read %s (%s): %s" % (path, exc.strerror, BECOME_FIX)) from None
    except OSError as exc:
        raise NumaError("cannot read %s (%s): check that /proc is mounted" % (path, exc.strerror or exc)) from None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        raise NumaError("%s does not hold an integer (expected one such as 0 or 1): is %s the procfs of a "
                        "Linux host?" % (path, root)) from None


def _knob_write_error(path: str, key: str, value: int, exc: OSError) -> NumaError:
    if isinstance(exc, Refused):
        return refusal(exc, "write %s to %s" % (key, path))
    if exc.errno in (errno.EACCES, errno.EPERM):
        return NumaError("cannot write %s (%s): %s" % (path, exc.strerror, BECOME_FIX))
    if exc.errno == errno.EROFS:
        return NumaError("cannot write %s: /proc/sys is read-only here (a container?); run the module on the "
                         "host, %s is not namespaced" % (path, key))
    if exc.errno == errno.EINVAL:
        hint = " (tiering mode needs Linux >= 5.18)" if key == BALANCING_KEY and value >= 2 else ""
        return NumaError("the kernel rejected %s = %d%s: choose a value this kernel supports" % (key, value, hint))
    return NumaError("cannot write %s (%s)" % (path, exc.strerror or exc))


def write_runtime(root: str, key: str, value: int) -> None:
    path = knob_path(root, key)
    try:
        write_under(root, knob_file(key), b"%d\n" % value)
    except OSError as exc:
        raise _knob_write_error(path, key, value, exc) from None
    now = read_runtime(root, key)
    if now != value:
        raise NumaError("wrote %d to %s but the kernel reports %s: something rewrites it, see the tuned and "
                        "conflicts results" % (value, path, now))


def apply_runtime(plan: BalancingPlan) -> None:
    """Make the running kernel match the plan; the drop-in is ``write_dropin``'s."""
    for key, value in plan.runtime_changes:
        write_runtime(plan.root, key, value)


# ---------------------------------------------------------------- the drop-in


def _flaw(info: os.stat_result) -> Optional[str]:
    """Why a regular file at the drop-in's path must be rewritten even with the right text, or None: not
    trusted (root_files.dropin_distrust), or trusted but not with the mode this module writes."""
    mode = stat.S_IMODE(info.st_mode)
    return dropin_distrust(info) or (None if mode == DROPIN_MODE else "mode %04o, not %04o" % (mode, DROPIN_MODE))


def _inspect_entry(root: str, directory: int) -> Dropin:
    try:
        info = os.stat(DROPIN_NAME, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return Dropin(None, None, False)
    if stat.S_ISLNK(info.st_mode):
        if resolve(root, DROPIN_PATH) == MASK_TARGET:
            return Dropin(None, "a mask: a symlink to " + MASK_TARGET, True)
        # Not read through: what it points to is not ours to show in a diff.
        return Dropin(None, "a symlink to %r" % os.readlink(DROPIN_NAME, dir_fd=directory), False)
    if not stat.S_ISREG(info.st_mode):
        raise Refused(host_path(root, DROPIN_PATH), "not a regular file", "move it away; the drop-in goes there")
    handle = open_in(directory, DROPIN_NAME, os.O_RDONLY, host_path(root, DROPIN_PATH))
    try:
        content = read_handle(handle, MAX_TEXT_BYTES, host_path(root, DROPIN_PATH))
        return Dropin(content, _flaw(os.fstat(handle)), False)
    finally:
        os.close(handle)


def inspect_dropin(root: str) -> Dropin:
    """What sits at the drop-in's path; its directories must be real ones that only root may write."""
    path = host_path(root, DROPIN_PATH)
    directory = None
    try:
        directory = open_dir(root, DROPIN_DIR, root_only=True)
        return _inspect_entry(root, directory)
    except FileNotFoundError:
        return Dropin(None, None, False)
    except Refused as exc:
        raise refusal(exc, "use " + path) from None
    except OSError as exc:
        fix = ": " + BECOME_FIX if exc.errno in (errno.EACCES, errno.EPERM) else ""
        raise NumaError("cannot read %s (%s)%s" % (path, exc.strerror or exc, fix)) from None
    finally:
        if directory is not None:
            os.close(directory)


def create_temporary(directory: int, data: bytes) -> str:
    """A new file in ``directory`` holding ``data`` on disk, mode 0644, under a random hidden name
    that is not *.conf (safe_fs.create_temporary); returns its name."""
    return safe_fs.create_temporary(directory, data, DROPIN_MODE, TEMPORARY_PREFIX)


def _replace_dropin(directory: int, text: str) -> None:
    safe_fs.rename_into_place(directory, create_temporary(directory, text.encode("utf-8")), DROPIN_NAME)


def _remove_dropin(directory: int) -> None:
    try:
        remove(directory, DROPIN_NAME)
    except FileNotFoundError:
        pass


def write_dropin(plan: BalancingPlan) -> None:
    """Replace or remove the drop-in atomically; a half-written sysctl file would apply at boot."""
    path = plan.dropin_file
    try:
        directory = open_dir(plan.root, DROPIN_DIR, create=plan.dropin_after is not None, root_only=True)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        if plan.dropin_after is None:
            _remove_dropin(directory)
        else:
            _replace_dropin(directory, plan.dropin_after)
        os.fsync(directory)  # the rename itself must survive a crash, or boot finds the old file
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        os.close(directory)


# ---------------------------------------------------------------- /proc/vmstat


def balancing_counters(root: str) -> Dict[str, Optional[int]]:
    """VMSTAT_COUNTERS from /proc/vmstat; None for a counter the kernel lacks (or an unreadable file)."""
    counters = read_vmstat(root)
    return {name: counters.get(name) for name in VMSTAT_COUNTERS}


def sample_vmstat(root: str, seconds: float,
                  sleep: Callable[[float], None] = time.sleep) -> Dict[str, Optional[float]]:
    """Growth of the balancing counters over ``seconds``; None for a counter the kernel lacks.

    With balancing off the scanner stops, so both must stay flat.
    """
    first = balancing_counters(root)
    sleep(seconds)
    second = balancing_counters(root)
    delta = {"seconds": seconds}  # type: Dict[str, Optional[float]]
    for name in VMSTAT_COUNTERS:
        start, end = first[name], second[name]
        delta[name] = None if start is None or end is None else end - start
    return delta


def verify(plan: BalancingPlan, seconds: float, check_mode: bool,
           sleep: Callable[[float], None] = time.sleep) -> Tuple[Dict[str, Optional[float]], Optional[str]]:
    """Sample the counters after acting; a warning when they move although balancing is off."""
    if seconds <= 0:
        raise NumaError("verify_seconds must be > 0 (got %s): drop it to skip the check" % seconds)
    delta = sample_vmstat(plan.root, seconds, sleep)
    # In check mode nothing was written, so only an already-disabled knob must be flat.
    now = plan.before[BALANCING_KEY] if check_mode else plan.after[BALANCING_KEY]
    return delta, vmstat_warning(delta) if now == 0 else None


def vmstat_warning(delta: Dict[str, Optional[float]]) -> Optional[str]:
    moving = ["%s +%d" % (name, delta[name]) for name in VMSTAT_COUNTERS if delta[name]]
    missing = [name for name in VMSTAT_COUNTERS if delta[name] is None]
    if moving:
        return ("NUMA balancing is still scanning after it was disabled (%s in %ss): something re-enabled it; "
                "see conflicts and tuned" % (", ".join(moving), delta["seconds"]))
    if missing:
        return "/proc/vmstat has no %s: the balancing counters could not be checked" % ", ".join(missing)
    return None


# ---------------------------------------------------------------- plan


def _unsupported(root: str, desired: Dict[str, int], state: str) -> BalancingPlan:
    if not is_dir(root, "/proc/sys/kernel"):
        why = "%s does not exist (is procfs mounted under root?)" % host_path(root, "/proc/sys/kernel")
    else:
        why = ("this kernel has no %s (built without CONFIG_NUMA_BALANCING, or a non-NUMA VM kernel)"
               % knob_path(root, BALANCING_KEY))
    note = "NUMA balancing is not supported: %s; nothing to disable, nothing written" % why
    return BalancingPlan(root, False, desired, {}, None, None, None, False, [], None, [note], [], None, state)


def _read_before(root: str, desired: Dict[str, int]) -> Dict[str, int]:
    before = {}  # type: Dict[str, int]
    for key in (BALANCING_KEY, ZONE_RECLAIM_KEY):
        value = read_runtime(root, key)
        if value is not None:
            before[key] = value
        elif key in desired:
            raise NumaError("zone_reclaim_mode was requested but %s does not exist on this kernel: "
                            "drop the option" % knob_path(root, key))
    return before


def _boot_review(root: str, request: BalancingRequest, desired: Dict[str, int], at_boot: Optional[str],
                 unpersisted: Optional[str], notes: List[str],
                 warnings: List[str]) -> Tuple[List[Dict[str, object]], Optional[str]]:
    """Conflicts with what boot applies under our name (``at_boot``; None: nothing there).

    ``unpersisted`` says why our value is not persisted; conflicts then only warn.
    """
    settings, position = boot_settings(root, list(desired), at_boot, warnings)
    conflicts = find_conflicts(root, settings, position, desired)
    ours = host_path(root, DROPIN_PATH)
    losing = [c for c in conflicts if c["wins_at_boot"]]
    notes.extend(_describe_harmless(c, ours) for c in conflicts if not c["wins_at_boot"])
    if unpersisted is not None:
        warnings.extend("%s: %s sets it at boot" % (unpersisted, _where(c)) for c in losing)
        return conflicts, None
    if request.on_conflict == "warn":
        warnings.extend(describe_conflict(c, ours, True) for c in losing)
        return conflicts, None
    error = " ".join(describe_conflict(c, ours, False) for c in losing) or None
    return conflicts, error


def _tuned_review(root: str, desired: Dict[str, int], persisted: bool,
                  warnings: List[str]) -> Optional[Dict[str, object]]:
    tuned = read_tuned(root, list(desired), warnings)
    if tuned is None:
        return None
    for setting in tuned["settings"]:  # type: ignore[attr-defined]
        if not same_value(setting["value"], desired[setting["key"]]):
            warnings.append(describe_tuned(tuned, setting, persisted))
    return tuned


def make_plan(root: str, request: BalancingRequest) -> BalancingPlan:
    """Read the host under ``root`` and decide what to change; writes nothing."""
    if request.on_conflict not in ("fail", "warn"):
        raise NumaError("on_conflict must be fail or warn, not %r" % request.on_conflict)
    if request.zone_reclaim_mode is not None and request.zone_reclaim_mode < 0:
        raise NumaError("zone_reclaim_mode must be >= 0 (a bit mask: 1 reclaim, 2 write dirty pages, 4 swap)")
    choice = choose_state(request.state, memory_tiers(root) if request.state in ("auto", "disabled") else [])
    desired = {BALANCING_KEY: desired_value(choice.state, request.value)}
    if request.zone_reclaim_mode is not None:
        desired[ZONE_RECLAIM_KEY] = request.zone_reclaim_mode
    if read_runtime(root, BALANCING_KEY) is None:
        return _unsupported(root, desired, choice.state)
    before = _read_before(root, desired)
    found = inspect_dropin(root)
    keep_mask = found.masked and not request.force
    dropin_after = render_dropin(desired, choice.state) if request.persist and not keep_mask else None
    notes = list(choice.notes)
    warnings = choice.warnings + ([describe_mask(host_path(root, DROPIN_PATH))] if keep_mask else [])
    unpersisted = "persist is false" if not request.persist else "the drop-in is masked" if keep_mask else None
    # A mask left in place still hides same-named files at boot, and sets nothing itself.
    at_boot = "" if keep_mask else dropin_after
    conflicts, error = _boot_review(root, request, desired, at_boot, unpersisted, notes, warnings)
    tuned = _tuned_review(root, desired, dropin_after is not None, warnings)
    return BalancingPlan(root, True, desired, before, found.content, dropin_after, None if keep_mask else found.flaw,
                         keep_mask, conflicts, tuned, notes, warnings, error, choice.state)


# ---------------------------------------------------------------- reporting


def summary(plan: BalancingPlan, check_mode: bool) -> str:
    if not plan.supported:
        return "; ".join(plan.notes)
    parts = ["%s %s %d -> %d" % ("would set" if check_mode else "set", key, plan.before[key], value)
             for key, value in plan.runtime_changes]
    if not plan.runtime_changes:
        parts.append("runtime already %s" % ", ".join("%s = %d" % item for item in plan.desired.items()))
    if plan.dropin_changed:
        parts.append(_dropin_action(plan, check_mode))
    elif plan.dropin_masked:
        parts.append("%s is masked, left alone" % plan.dropin_file)
    elif plan.dropin_after is not None:
        parts.append("%s up to date" % plan.dropin_file)
    return "; ".join(parts + plan.notes)


def _dropin_action(plan: BalancingPlan, check_mode: bool) -> str:
    if plan.dropin_after is None:
        verbs = ("would remove", "removed")
    elif plan.dropin_flaw is not None:
        verbs = ("would replace", "replaced")
    else:
        verbs = ("would write", "wrote")
    action = "%s %s" % (verbs[0] if check_mode else verbs[1], plan.dropin_file)
    if plan.dropin_flaw is None:
        return action
    return "%s (it %s %s)" % (action, "is" if check_mode else "was", plan.dropin_flaw)


def result(plan: BalancingPlan, check_mode: bool) -> Dict[str, object]:
    """The module's return values (without diff and vmstat_delta)."""
    return {
        "changed": plan.changed,
        "supported": plan.supported,
        "state": plan.state,
        "before": plan.before,
        "after": plan.after if plan.supported else {},
        "persisted_file": plan.dropin_file if plan.dropin_after is not None else None,
        "dropin_masked": plan.dropin_masked,
        "conflicts": plan.conflicts,
        "tuned": plan.tuned,
        "msg": summary(plan, check_mode),
    }


def diff(plan: BalancingPlan) -> List[Dict[str, str]]:
    """Ansible diff entries: the drop-in file, then the runtime knobs."""
    return [
        {"before_header": plan.dropin_file, "after_header": plan.dropin_file,
         "before": plan.dropin_before or "", "after": plan.dropin_after or ""},
        {"before_header": knob_path(plan.root, "") + " (runtime)",
         "after_header": knob_path(plan.root, "") + " (runtime)",
         "before": "".join("%s = %d\n" % (key, plan.before[key]) for key in plan.desired if key in plan.before),
         "after": "".join("%s = %d\n" % item for item in plan.desired.items())},
    ]
