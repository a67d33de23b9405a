"""The files of a deployment's change on a host: read as they are, written whole, and put back by a rollback
from the record of a change nobody has judged yet.

Before a deployment writes anything it records, in the plan directory, every file it is about to write with the
text that file held before (none: there was no file), and which instances it may touch and whether each ran.
That record (``rollout.pending.json``) is removed only once the host is on a judged placement: the change
passed every gate, or was taken back completely. A run that stops in between, a crash, a lost connection or a
rollback step that failed, leaves it, and the next run first takes that change back (decided in act/rollout.py)
before it deploys again: a host never stays, unmeasured, on a placement nobody judged.

Every file is reached through safe_fs under the DEPLOYED rule (no link followed, every directory from / owned by
root and writable by no one else) and written with an unpredictable temporary name, then renamed over.
A change the A/B gate rolled back is kept as ``<service>.rejected.json`` (the digests of what it wrote), and the
gates' verdicts in ``ab-gates.json``, merged with those of services this run did not measure.
"""

from __future__ import annotations

import json
import os
import stat
import time

from ..base.errors import NumaError, shown
from ..decide.records import AB_GATES, PENDING, UNDRAIN, rejected_record_name
from ..decide.rollout import Found
from ..system import root_files, safe_fs, trusted_files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set

FILE_MODE = 0o644
# The pending record holds the previous text of every file a change writes: root's alone to read.
PENDING_MODE = 0o600
MAX_TEXT_BYTES = trusted_files.MAX_JSON_BYTES
FIX_PENDING = ("look at it, put the host's files and services as you want them, then remove it; the next run "
               "deploys from there")


def read_found(paths: Iterable[str]) -> Dict[str, Found]:
    """What each of ``paths`` holds now; a path in a missing directory holds nothing. NumaError when a directory
    on the way is not root's alone (whoever may write it could swap what root reads and writes there)."""
    found = {}  # type: Dict[str, Found]
    for directory, names in _by_directory(paths).items():
        try:
            fd = trusted_files.open_checked_directory(directory, "directory", safe_fs.DEPLOYED)
        except FileNotFoundError:
            found.update((os.path.join(directory, name), Found(None)) for name in names)
            continue
        try:
            found.update((os.path.join(directory, name), _read(fd, name)) for name in names)
        finally:
            os.close(fd)
    return found


def _read(directory: int, name: str) -> Found:
    try:
        fd = os.open(name, safe_fs.READ_FLAGS, dir_fd=directory)
    except FileNotFoundError:
        return Found(None)
    except OSError:  # a link (ELOOP) or what cannot be opened: not a file a deployment left
        return Found(None, as_left=False)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Found(None, as_left=False)
        data = os.read(fd, MAX_TEXT_BYTES + 1)
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8") if len(data) <= MAX_TEXT_BYTES else None
    except UnicodeDecodeError:
        text = None
    as_left = (text is not None and info.st_uid == 0 and stat.S_IMODE(info.st_mode) == FILE_MODE)
    return Found(text, as_left)


def write_files(texts: Mapping[str, Optional[str]]) -> List[str]:
    """Write each path's text (None: remove the file), every one tried; a line for each that failed."""
    problems = []
    for directory, names in _by_directory(texts).items():
        try:
            fd = trusted_files.open_checked_directory(directory, "directory", safe_fs.DEPLOYED,
                                                      create=any(texts[os.path.join(directory, name)] is not None
                                                                 for name in names))
        except FileNotFoundError:
            continue  # only removals there, and nothing to remove
        except NumaError as exc:
            problems.append(str(exc))
            continue
        try:
            for name in names:
                problem = _write(fd, name, texts[os.path.join(directory, name)])
                if problem:
                    problems.append("%s: %s" % (os.path.join(directory, name), problem))
        finally:
            os.close(fd)
    return problems


def _write(directory: int, name: str, text: Optional[str], mode: int = FILE_MODE) -> Optional[str]:
    try:
        if text is None:
            root_files.remove(directory, name)
        else:
            safe_fs.write_atomically(directory, name, text.encode("utf-8"), mode, ".%s." % name)
    except FileNotFoundError:
        return None if text is None else "its directory was removed meanwhile"
    except IsADirectoryError:
        if text is None:
            return None  # no file of ours there: a directory, which no write of ours could have replaced
        return "not written (a directory is there)"
    except OSError as exc:
        return "not %s (%s)" % ("removed" if text is None else "written", exc.strerror or exc)
    return None


def _by_directory(paths: Iterable[str]) -> Dict[str, List[str]]:
    grouped = {}  # type: Dict[str, List[str]]
    for path in paths:
        if not os.path.isabs(path) or path.endswith("/"):
            raise NumaError("%s is not the absolute path of a file: give each file's absolute path" % shown(path))
        directory, name = os.path.split(path)
        grouped.setdefault(directory, []).append(name)
    return grouped


def missing_directories(texts: Mapping[str, Optional[str]]) -> List[str]:
    """The directories writing ``texts`` makes (a file's directory and those above it not there yet), deepest
    first: a rollback removes them again, so a first deployment taken back leaves no empty drop-in directory."""
    missing = set()  # type: Set[str]
    for path, text in texts.items():
        directory = os.path.dirname(path)
        while text is not None and directory != "/" and root_files.lstat_under("/", directory) is None:
            missing.add(directory)
            directory = os.path.dirname(directory)
    return sorted(missing, key=lambda directory: (-directory.count("/"), directory))


def remove_made_directories(directories: Sequence[str]) -> None:
    """Each of ``directories`` removed while empty, deepest first, its parent reached without following a link; one
    that holds anything (someone else's file) or is gone already is left as it is."""
    for directory in directories:
        try:
            root_files.remove_directory_under("/", directory)
        except OSError:
            pass


class Pending:
    """The record of a change not judged yet: the files' previous texts, the instances it may touch (unit ->
    whether it ran before), those it touched so far, the first deployments among them, and the directories the
    change made."""

    def __init__(self, files: Mapping[str, Optional[str]], units: Mapping[str, bool],
                 touched: Sequence[str] = (), first: Sequence[str] = (), made: Sequence[str] = ()) -> None:
        self.files = dict(files)
        self.units = dict(units)
        self.touched = list(touched)
        self.first = list(first)
        self.made = list(made)

    def to_json(self) -> str:
        return json.dumps({"written_at": int(time.time()), "files": self.files, "units": self.units,
                           "touched": self.touched, "first": self.first, "made": self.made},
                          indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, value: Mapping[str, Any], path: str) -> "Pending":
        files, units = value.get("files"), value.get("units")
        touched, first = value.get("touched"), value.get("first")
        made = value.get("made", [])  # a record of an earlier version has none
        if not (isinstance(files, dict) and all(isinstance(key, str) and os.path.isabs(key) and
                                                (text is None or isinstance(text, str)) for key, text in files.items())
                and isinstance(units, dict) and all(isinstance(key, str) and isinstance(ran, bool)
                                                    for key, ran in units.items())
                and isinstance(touched, list) and all(unit in units for unit in touched)
                and isinstance(first, list) and all(unit in units for unit in first)
                and isinstance(made, list) and all(isinstance(directory, str) and os.path.isabs(directory)
                                                   and ".." not in directory.split("/") for directory in made)):
            raise NumaError("refusing %s: it is not the record of a change this collection writes; %s"
                            % (path, FIX_PENDING))
        return cls(files, units, touched, first, made)


def read_pending(record_dir: str) -> Optional[Pending]:
    """The record of an earlier change nobody judged, or None. NumaError for one root cannot trust."""
    value = read_record(record_dir, PENDING, FIX_PENDING)
    return None if value is None else Pending.from_json(value, os.path.join(record_dir, PENDING))


def write_pending(record_dir: str, pending: Pending) -> None:
    write_record(record_dir, PENDING, pending.to_json(), PENDING_MODE)


def remove_pending(record_dir: str) -> None:
    write_record(record_dir, PENDING, None)


def read_undrain(record_dir: str) -> List[str]:
    """The units an earlier run left running without traffic (their undrain failed), in order; empty when none.
    NumaError for a record root cannot trust, or one of another shape."""
    fix = "look at it, undrain the units it names by hand, then remove it"
    value = read_record(record_dir, UNDRAIN, fix)
    units = (value or {}).get("units", [])
    if not (isinstance(units, list) and all(isinstance(unit, str) for unit in units)):
        raise NumaError("refusing %s: it is not a list of units to undrain; %s" % (os.path.join(record_dir, UNDRAIN),
                                                                                   fix))
    return units


def write_undrain(record_dir: str, units: Sequence[str]) -> None:
    """The units left without traffic recorded for the next run; none: the record removed."""
    write_record(record_dir, UNDRAIN, json.dumps({"units": list(units)}, indent=1) + "\n" if units else None)


def read_rejected(record_dir: str, service: str, warnings: List[str]) -> Dict[str, Optional[str]]:
    """path -> digest of the change ``service``'s A/B gate rolled back last; empty when none (or one that cannot
    be trusted, said in ``warnings``: the change is then measured again rather than held)."""
    value = read_record(record_dir, rejected_record_name(service), "the change is measured again", warnings)
    files = value.get("files") if value else None
    if value and not (isinstance(files, dict) and all(isinstance(key, str) and (digest is None or isinstance(
            digest, str)) for key, digest in files.items())):
        warnings.append("ignoring %s: not a record of rejected files; the change is measured again"
                        % os.path.join(record_dir, rejected_record_name(service)))
        return {}
    return dict(files or {})


def write_rejected(record_dir: str, service: str, files: Mapping[str, Optional[str]],
                   verdicts: Mapping[str, Any]) -> None:
    text = json.dumps({"files": files, "verdicts": verdicts}, indent=1, sort_keys=True) + "\n"
    write_record(record_dir, rejected_record_name(service), text)


def merge_verdicts(record_dir: str, verdicts: Mapping[str, Any], warnings: List[str]) -> None:
    """ab-gates.json with this run's verdicts over the earlier ones (other services' verdicts are kept)."""
    if not verdicts:
        return
    earlier = read_record(record_dir, AB_GATES, "it is written anew", warnings) or {}
    merged = dict(earlier, **verdicts)
    write_record(record_dir, AB_GATES, json.dumps(merged, indent=4, sort_keys=True) + "\n")


def read_record(record_dir: str, name: str, fix: str,
                warnings: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    """The JSON object of record ``name`` in the plan directory, or None when there is none. One root cannot
    trust (trusted_files.read_plan_record) is a NumaError ending with ``fix``; with ``warnings``, it is said there
    instead and taken as none."""
    try:
        return trusted_files.read_plan_record(os.path.join(record_dir, name), fix)
    except NumaError as exc:
        if warnings is None:
            raise
        warnings.append(str(exc))
        return None


def write_record(record_dir: str, name: str, text: Optional[str], mode: int = FILE_MODE) -> None:
    try:
        fd = trusted_files.open_checked_directory(record_dir, trusted_files.PLAN_DIRECTORY, safe_fs.DEPLOYED,
                                                  create=text is not None)
    except FileNotFoundError:
        return  # a removal where there is no directory: nothing there to remove
    try:
        problem = _write(fd, name, text, mode)
    finally:
        os.close(fd)
    if problem:
        raise NumaError("%s: %s; check the disk and that root may write there"
                        % (os.path.join(record_dir, name), problem))
