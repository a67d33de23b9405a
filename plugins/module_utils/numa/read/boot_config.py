"""What the host applies at boot to a sysctl: the sysctl.d files in systemd-sysctl's order, the active tuned
profile.

It only reads. Boot order follows systemd-sysctl (sysctl.d(5)): ``*.conf`` files from /etc/sysctl.d,
/run/sysctl.d, /usr/local/lib/sysctl.d, /usr/lib/sysctl.d and /lib/sysctl.d; a name
found in an earlier directory hides the same name in later ones (a symlink to
/dev/null disables it); the survivors are applied sorted by file name whatever their
directory, and a later assignment wins. /etc/sysctl.conf is treated as applied after
every sysctl.d file: Debian reaches it through the 99-sysctl.conf symlink, and
``sysctl --system`` (procps, also used by tuned) reads it last.

Every file is reached through system/root_files: symlinks are followed inside root only, and no
warning quotes a file's content. A knob's own drop-in (``ours``, a root-relative path) is left out of
what is read from disk: its caller passes the text it wants there instead.
"""

import configparser
import os
import posixpath
import re
from typing import Dict, List, NamedTuple, Optional, Tuple

from ..system.root_files import host_path, is_dir, is_file, open_dir, read_config, read_under, resolve

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

_GLOB_CHARS = re.compile(r"[*?\[]")
_TRUE_WORDS = frozenset(("1", "true", "yes", "on", "y"))
_FALSE_WORDS = frozenset(("0", "false", "no", "off", "n"))


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
    key: str  # dotted name, as the caller asked for it
    value: str
    line: int
    position: int  # index of its file in the boot sequence


# ---------------------------------------------------------------- keys


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


def boot_sequence(root: str, ours: str, with_ours: bool) -> List[ConfFile]:
    """sysctl files in the order they are applied at boot; /etc/sysctl.conf last.

    The drop-in ``ours`` on disk is left out: ``with_ours`` puts it where its name sorts (its
    wanted content is applied by the caller). Without it, a same-named file in /run or
    /usr/lib that ours would have hidden takes its place.
    """
    ours_name = posixpath.basename(ours)
    by_name = {}  # type: Dict[str, ConfFile]
    for directory in SYSCTL_DIRS:
        for name in _listing(root, directory):
            path = directory + "/" + name
            if name not in by_name and path != ours:
                by_name[name] = ConfFile(path, resolve(root, path))
    if with_ours:
        by_name[ours_name] = ConfFile(ours, ours)
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


def boot_settings(root: str, keys: List[str], ours: str, dropin: Optional[str],
                  warnings: List[str]) -> Tuple[List[Setting], int]:
    """Assignments of ``keys`` in boot order, ``dropin`` the text at ``ours``, and the position of ``ours``
    (-1: none)."""
    sequence = boot_sequence(root, ours, dropin is not None)
    wanted = by_path(keys)
    settings = []  # type: List[Setting]
    position_of_ours = -1
    for position, conf in enumerate(sequence):
        if conf.path == ours:
            position_of_ours = position
            text = dropin or ""
        else:
            text = _read_text(root, conf, warnings)
        settings.extend(Setting(conf.path, wanted[a.key], a.value, a.line, position)
                        for a in parse_sysctl(text) if a.key in wanted)
    return settings, position_of_ours


def find_conflicts(root: str, settings: List[Setting], ours: int,
                   desired: Dict[str, int]) -> List[Dict[str, object]]:
    """Other files' settings that differ from ``desired``, each with whether it wins at boot; ``ours`` is the
    position of the caller's drop-in in the boot sequence (-1: none)."""
    winners = {}  # type: Dict[str, Setting]
    for setting in settings:
        winners[setting.key] = setting
    conflicts = []  # type: List[Dict[str, object]]
    for setting in settings:
        if setting.position == ours or same_value(setting.value, desired[setting.key]):
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
