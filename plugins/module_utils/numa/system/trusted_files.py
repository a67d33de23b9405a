"""Root's own files by absolute path, with the one-line errors every caller reports: a directory opened under a
trust rule (safe_fs), a JSON record read only when root alone may have written it, a file written whole.

The plan records, the drift state, the textfile and numa_cost's recorded measurement are kept this way: safe_fs walks
and judges, this module words what it refused as a NumaError naming the path and the fix. Every reader of the plan
directory's records (decide/records names them) goes through ``open_plan_directory`` or ``read_plan_record``: one
trust rule for all of them.
"""
from __future__ import annotations

import json
import os
import stat

from . import safe_fs
from ..base.errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Tuple

# Far above any record the collection writes; a larger file is not one of them and is not parsed.
MAX_JSON_BYTES = 1 << 20


def open_checked_directory(path: str, what: str, rule: safe_fs.TrustRule, create: bool = False) -> int:
    """A readable descriptor of the ``what`` directory ``path``, walked by safe_fs under ``rule``; NumaError
    naming its trust problem, FileNotFoundError when it is missing (and not ``create``)."""
    if not os.path.isabs(path):
        raise NumaError("the %s %s is not an absolute path: give the directory's absolute path" % (what, path))
    try:
        names = safe_fs.names_of("/", path)
    except safe_fs.Refused:
        raise NumaError("the %s %s holds '..': give the directory's own path" % (what, path)) from None
    try:
        fd, problem, _owner = safe_fs.open_directory("/", names, rule, create)
    except FileNotFoundError as exc:
        if not create:
            raise
        raise NumaError("the %s %s was removed while it was being made: run again" % (what, exc.filename)) from None
    except safe_fs.CreateFailed as exc:
        raise NumaError("cannot create the %s %s: %s" % (what, exc.filename, exc.strerror)) from None
    except (safe_fs.Refused, NotADirectoryError) as exc:
        raise NumaError("refusing the %s %s: it is a symbolic link or not a directory; give a real directory "
                        "that only root may write" % (what, getattr(exc, "path", exc.filename))) from None
    except OSError as exc:
        raise NumaError("cannot open the %s %s: %s" % (what, exc.filename, exc.strerror)) from None
    if problem:
        raise NumaError(_directory_problem(problem, problem.path == os.path.join("/", *names), path, what))
    return fd


def _directory_problem(problem: safe_fs.Distrust, last: bool, path: str, what: str) -> str:
    """Why the directory on the way to the ``what`` ``path`` (or that one, ``last``) is not trusted: anyone
    but root (or this user) owns it, or its group or others may write it."""
    subject = "it" if last else "%s above it" % problem.path
    if problem.why == safe_fs.OWNER:
        return ("refusing the %s %s: %s is owned by uid %d, who could swap the files root keeps there; chown root "
                "%s, or give a directory that only root may write"
                % (what, path, subject, problem.info.st_uid, problem.path))
    return ("refusing the %s %s: %s (mode %04o) may be written by its group or others, who could swap the files "
            "root keeps there; chmod go-w %s, or give a directory that only root may write"
            % (what, path, subject, stat.S_IMODE(problem.info.st_mode), problem.path))


def read_trusted_json(dir_fd: int, name: str, path: str, fix: str) -> Tuple[Dict[str, Any], float]:
    """(a JSON object, its file's mtime) from the regular file ``name`` in the directory ``dir_fd`` (``path``
    in messages, which end with ``fix``), not through a link, that only root (or this process's user) may
    write; FileNotFoundError when there is none."""
    try:
        fd = os.open(name, safe_fs.READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise NumaError("cannot open %s (%s): it must be a regular file, not a symbolic link; %s"
                        % (path, exc.strerror, fix)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or safe_fs.TRUSTED_FILE.distrust(info, os.geteuid()):
            raise NumaError("ignoring %s (uid %d, mode %04o): only a regular file that root alone may write is "
                            "trusted; chown root and chmod go-w it, or %s"
                            % (path, info.st_uid, stat.S_IMODE(info.st_mode), fix))
        data = os.read(fd, MAX_JSON_BYTES + 1)
    finally:
        os.close(fd)
    try:
        value = json.loads(data.decode("utf-8")) if len(data) <= MAX_JSON_BYTES else None
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        value = None
    if not isinstance(value, dict):
        raise NumaError("ignoring %s: not a JSON object of at most %d bytes in UTF-8; %s" % (path, MAX_JSON_BYTES, fix))
    return value, info.st_mtime


def read_record(directory: str, name: str, what: str, rule: safe_fs.TrustRule, fix: str) -> Optional[Dict[str, Any]]:
    """The JSON object of the record ``name`` in the ``what`` ``directory`` (opened under ``rule``), or None when
    either is missing; NumaError, ending with ``fix``, for one root cannot trust."""
    try:
        fd = open_checked_directory(directory, what, rule)
    except FileNotFoundError:
        return None
    try:
        return read_trusted_json(fd, name, os.path.join(directory, name), fix)[0]
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


# --- the plan directory's records ------------------------------------------------------------------------
#
# One trust rule for every record of the plan directory (decide/records names them): they choose which unit root
# restarts, what a rollback restores and the plan an audit, which decides rollbacks, judges against. The directory
# is reached from / without following a link, every directory on the way owned by root (or this user) and writable
# by no one else, sticky ones too (safe_fs.RECORD_DIR); the record is a regular file opened in it without following
# a link, that root alone may write, of at most MAX_JSON_BYTES, one JSON object (read_trusted_json).
PLAN_DIRECTORY = "plan directory"


def open_plan_directory(path: str) -> Optional[int]:
    """A descriptor of the plan directory ``path`` under the plan records' rule, never made: None when it is
    missing (nothing is deployed). Read its records through it with read_trusted_json, so none is swapped in
    between the check and the use."""
    try:
        return open_checked_directory(path, PLAN_DIRECTORY, safe_fs.RECORD_DIR)
    except FileNotFoundError:
        return None


def read_plan_record(path: str, fix: str) -> Optional[Dict[str, Any]]:
    """The JSON object of the plan directory's record at ``path`` (a relative path is the working directory's), or
    None when it or its directory is missing; NumaError, ending with ``fix``, for one root cannot trust."""
    path = os.path.abspath(path)
    return read_record(os.path.dirname(path), os.path.basename(path), PLAN_DIRECTORY, safe_fs.RECORD_DIR, fix)


def open_private_directory(path: str, what: str) -> int:
    """A descriptor of directory ``path`` (made 0755 if missing), reached from ``/`` one directory at a
    time without following a link; refused when anyone but root (or this user) owns it or may write it.

    Each step opens a name relative to the descriptor of the directory before it, never through a
    link, and the last directory is checked through its own descriptor (safe_fs.PRIVATE_DIR); so
    whoever owns a directory above it cannot swap in another one, and only the last one's owner and
    mode matter."""
    return open_checked_directory(path, what, safe_fs.PRIVATE_DIR, create=True)


def write_atomically(directory: str, name: str, text: str, what: str, mode: int = 0o644) -> str:
    """Write ``directory/name`` whole or not at all (safe_fs.write_atomically): an unpredictable temporary
    name there (never ``*.prom``, which the collector would read), fsync, rename, fsync the directory. Its path."""
    fd = open_private_directory(directory, what)
    try:
        safe_fs.write_atomically(fd, name, text.encode("utf-8"), mode, ".%s." % name)
    except OSError as exc:
        raise NumaError("cannot write %s in the %s %s: %s; check the disk and that root may write there"
                        % (name, what, directory, exc.strerror)) from None
    finally:
        os.close(fd)
    return os.path.join(directory, name)
