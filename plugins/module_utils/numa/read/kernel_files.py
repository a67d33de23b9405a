"""The one reader of each kernel file that several modules read, under a root prefix.

Every reader takes ``root``, the folder holding ``proc/`` and ``sys/`` (``/`` for this
host, a captured or fake tree in tests), like hwloc's ``HWLOC_FSROOT``:

- ``/proc/<pid>/status`` and a thread's ``/proc/<pid>/task/<tid>/status``
  (topology: this process's cpuset; audit: a service's threads and RSS);
- ``/proc/<pid>/maps`` (audit: which mappings are program images; pagecache: who
  maps a model);
- ``/proc/vmstat`` and ``<node>/numastat``, both ``name value`` lines (numastat:
  allocation counters; balancing: the scanner's counters);
- the ``node<N>`` entries of a sysfs directory (topology, numastat).

A root other than ``/`` is someone else's tree, read by root: :class:`Root` resolves
every path inside it as a chroot would (hwloc opens relative to a root fd the same
way), opens nothing before knowing it is a regular file (or a directory to list), never
blocks on a FIFO and reads a bounded amount. The kernel does the resolving in one call
where it can (openat2's RESOLVE_IN_ROOT, Linux 5.6); elsewhere Root walks the path from
the root fd a name at a time, its links followed by system/root_files.follow_links (the
package's one in-root resolver, which balancing's sysctl.d and tuned lookups use too).

A warning that quotes what a file holds quotes :func:`excerpt` of it: a few characters,
printable ASCII, and nothing of a file that not every user may read.

kernel.py makes the syscalls, openat2 among them; this module only reads. numa-pin
exec imports it at every server start (through topology and pagecache), so ``typing``
is imported for type checkers only.
"""
from __future__ import annotations

import errno
import os
import stat

from ..base.cpulist import is_kernel_number, parse_integer
from ..base.errors import NumaError
from ..system.kernel import has_open_in_root, open_in_root
from ..system.root_files import follow_links

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple, Union

    # (start address, permissions, device "major:minor" in hex, inode, path or "")
    MapsEntry = Tuple[int, str, str, str, str]

NODE_DIR = "sys/devices/system/node"
VMSTAT = "proc/vmstat"

# A sysfs attribute is at most a page and procfs text files a few KiB; /proc/mounts of a
# busy container host runs to hundreds of KiB. Past this a file is no kernel file.
MAX_FILE_BYTES = 1 << 20
# /proc/<pid>/maps: vm.max_map_count (65530 by default) lines of up to ~100 bytes, and more
# where the count is raised for databases.
MAX_MAPS_BYTES = 64 << 20
# Directory fds kept open while reading a tree: reads cluster by directory, and a
# process may have no more than 1024 fds in all.
_OPEN_DIRS = 64


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_CLOEXEC
# This process's fds as procfs shows them: opening /proc/self/fd/N opens exactly the object fd N
# refers to (an O_PATH fd's too), with no lookup by name that a rename could redirect.
_OWN_FDS = "/proc/self/fd"

# How much of a file's content a warning quotes: enough to recognise a value by, too little
# to carry a file's worth of whatever a planted link points at.
EXCERPT_CHARS = 32


class Root:
    """The tree under ``path``, read as if it were ``/``.

    Under any root but ``/`` a symbolic link resolves from the root (an absolute one) or
    from its directory, and ``..`` stops at the root, so no link or ``..`` in the tree
    reaches outside it: the kernel resolves so with openat2, and without it each name is
    looked up from a directory fd without following it. This host's ``/`` is opened by
    plain paths: its sysfs and procfs are the kernel's, and numa-pin exec reads them at
    every service start.
    Failures are OSError, as the ``open`` they replace raises.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.prefix = path.rstrip("/") + "/"
        self._root_fd = None if os.path.realpath(path) == "/" else os.open(path, _DIR_FLAGS & ~os.O_NOFOLLOW)
        # The kernel's lookup yields an O_PATH fd, reopened through procfs once its type is known:
        # without procfs mounted here, the walk (which opens by name after a type check) stands in.
        # /proc/self/fd is opened once, so each reopen resolves one name rather than three.
        kernel_can = self._root_fd is not None and has_open_in_root(self._root_fd)
        self._own_fds = _open_own_fds() if kernel_can else None  # type: Optional[int]
        self._kernel_resolves = self._own_fds is not None
        self._dirs = {}  # type: Dict[str, int]

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()
        for fd in (self._root_fd, self._own_fds):
            if fd is not None:
                os.close(fd)
        self._root_fd = self._own_fds = None

    def read(self, rel: str, limit: int = MAX_FILE_BYTES) -> bytes:
        """The bytes of the regular file ``rel``; OSError when it is anything else or over ``limit``."""
        return self.read_with_mode(rel, limit)[0]

    def read_with_mode(self, rel: str, limit: int = MAX_FILE_BYTES) -> Tuple[bytes, int]:
        """(the bytes of the regular file ``rel``, its st_mode), for a reader that quotes what it read
        only from a file every user may read (see excerpt)."""
        fd, mode = self._open_file(rel)
        try:
            return _read_regular(fd, limit, mode)
        finally:
            os.close(fd)

    def listdir(self, rel: str) -> List[str]:
        """The names in directory ``rel``, unsorted."""
        if self._root_fd is None:
            return os.listdir(self.prefix + rel)
        if self._kernel_resolves:
            # O_DIRECTORY: the kernel refuses anything but a directory before opening it.
            fd = open_in_root(self._root_fd, rel, _DIR_FLAGS & ~os.O_NOFOLLOW)  # type: ignore[arg-type]
            try:
                return os.listdir(fd)
            finally:
                os.close(fd)
        return os.listdir(self._lookup(rel, want_directory=True))  # listdir dups the fd it is given

    def link_text(self, rel: str) -> str:
        """What the symbolic link ``rel`` holds, as text: never followed (a sysfs device link names the device's
        place in the bus, which is all a caller wants of it). OSError when ``rel`` is no link."""
        parent, name = rel.rpartition("/")[::2]
        if self._root_fd is None:
            return os.readlink(self.prefix + rel)
        if self._kernel_resolves:
            fd = open_in_root(self._root_fd, parent, _DIR_FLAGS & ~os.O_NOFOLLOW)  # type: ignore[arg-type]
            try:
                return os.readlink(name, dir_fd=fd)
            finally:
                os.close(fd)
        return os.readlink(name, dir_fd=self._lookup(parent, want_directory=True))

    def exists(self, rel: str) -> bool:
        if self._root_fd is None:
            return os.path.exists(self.prefix + rel)
        try:
            if self._kernel_resolves:
                os.close(open_in_root(self._root_fd, rel, _PATH_FLAGS))  # type: ignore[arg-type]
            else:
                self._lookup(rel, want_directory=None)
        except OSError:
            return False
        return True

    def _open_file(self, rel: str) -> Tuple[int, Optional[int]]:
        """(an fd of ``rel`` open for reading, its st_mode where it is known already)."""
        if self._root_fd is None:
            return os.open(self.prefix + rel, _READ_FLAGS), None
        if not self._kernel_resolves:
            return self._lookup(rel, want_directory=False), None
        # An O_PATH fd opens nothing (a device's driver is not called, a FIFO's writer not woken): only
        # once it is known to be a regular file is that same object opened for reading, through procfs,
        # so a file renamed over it meanwhile is never the one opened.
        path_fd = open_in_root(self._root_fd, rel, _PATH_FLAGS)  # type: ignore[arg-type]
        try:
            mode = os.fstat(path_fd).st_mode
            _check_regular(mode)
            return os.open(str(path_fd), _READ_FLAGS, dir_fd=self._own_fds), mode
        finally:
            os.close(path_fd)

    def _lookup(self, rel: str, want_directory: Optional[bool]) -> int:
        """An fd for ``rel`` resolved inside the root (root_files.follow_links): a cached directory's
        (``want_directory``), a newly opened regular file's (not ``want_directory``), either (None, for exists)."""
        last = []  # type: List[Tuple[int, str, int]]  # (parent fd, name, st_mode) of the last name that is no link

        def link_target(parents: List[str], name: str) -> Optional[str]:
            here = "/".join(parents)  # the path from the root of the directory reached so far, free of links
            path = here + "/" + name if here else name
            if path in self._dirs:
                return None
            if last and not stat.S_ISDIR(last[0][2]):
                raise OSError(errno.ENOTDIR, "%s is not a directory" % here)
            parent = self._dir_fd(here)
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                return os.readlink(name, dir_fd=parent)
            if stat.S_ISDIR(mode):
                self._remember(path, os.open(name, _DIR_FLAGS, dir_fd=parent))
            last[:] = [(parent, name, mode)]
            return None

        path = "/".join(follow_links(rel, link_target))
        if not path or path in self._dirs:
            if want_directory is False:
                raise OSError(errno.EISDIR, "a directory, not a file")
            return self._dir_fd(path)
        if want_directory:
            raise OSError(errno.ENOTDIR, "%s is not a directory" % path)
        parent, name, mode = last[0]
        _check_regular(mode)
        return os.open(name, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=parent)

    def _dir_fd(self, here: str) -> int:
        return self._dirs[here] if here else self._root_fd  # type: ignore[return-value]

    def _remember(self, path: str, fd: int) -> None:
        if len(self._dirs) >= _OPEN_DIRS:
            os.close(self._dirs.pop(next(iter(self._dirs))))  # the oldest: reads move on by directory
        self._dirs[path] = fd


def _open_own_fds() -> Optional[int]:
    """A directory fd of /proc/self/fd, or None where procfs is not mounted."""
    try:
        return os.open(_OWN_FDS, _DIR_FLAGS)
    except OSError:
        return None


def _check_regular(mode: int) -> None:
    # A FIFO would block and a device would be driven by opening it; sysfs and procfs
    # attributes are all regular files.
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file (file type %o)" % stat.S_IFMT(mode))


def _read_regular(fd: int, limit: int, mode: Optional[int]) -> Tuple[bytes, int]:
    """(what the file holds, its st_mode); ``mode`` when the type of the very object was checked already."""
    if mode is None:
        mode = os.fstat(fd).st_mode
        _check_regular(mode)
    chunks = []
    size = 0
    chunk = os.read(fd, 65536)
    while chunk:  # a short read is not the end of a procfs file
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise OSError(errno.EFBIG, "larger than %d bytes, which no kernel file is" % limit)
        chunk = os.read(fd, 65536)
    return b"".join(chunks), mode


def excerpt(text: str, world_readable: bool = True) -> str:
    """File content as a warning quotes it: at most EXCERPT_CHARS characters, quoted, each one outside
    printable ASCII escaped (a newline, a terminal escape, a look-alike letter), so one short line.
    Nothing of a file that is not ``world_readable``: root reading a planted hard link to a root-only
    file would otherwise publish its first bytes with the facts."""
    if not world_readable:
        return "(content not shown: the file is not world-readable)"
    quoted = ascii(text[:EXCERPT_CHARS])
    return quoted if len(text) <= EXCERPT_CHARS else "%s... (%d characters)" % (quoted, len(text))


def printable(text: str) -> str:
    """``text`` with every character outside printable ASCII escaped as in excerpt: a warning naming a
    path of the tree (a directory name may hold a newline) stays one line of plain text."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(char if " " <= char <= "~" else ascii(char)[1:-1] for char in text)


def proc_text(root: str, pid: Union[int, str], name: str, tid: Optional[int] = None) -> Optional[str]:
    """``/proc/<pid>/<name>`` (a thread's with ``tid``); None once the process is gone.

    ``pid`` may be ``"self"``.
    """
    parts = [str(pid)] + (["task", str(tid)] if tid is not None else []) + [name]
    rel = "/".join(["proc"] + parts)
    path = os.path.join(root, rel)
    try:
        with Root(root) as tree:
            return tree.read(rel, MAX_MAPS_BYTES if name == "maps" else MAX_FILE_BYTES).decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        raise NumaError("cannot read %s: permission denied; run as root (become: true) or as the "
                        "process's user" % path) from None
    except OSError as exc:
        raise NumaError("cannot read %s (%s): check that procfs is mounted under %s"
                        % (path, exc.strerror or exc, root)) from None


def parse_status(text: str) -> Dict[str, str]:
    """``/proc/<pid>/status`` -> {"Name": "llama-server", "Cpus_allowed_list": "0-3", "VmRSS": "812 kB", ...}."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def read_status(root: str, pid: Union[int, str], tid: Optional[int] = None) -> Optional[Dict[str, str]]:
    """The fields of a process's (or thread's) status file; None once it is gone."""
    text = proc_text(root, pid, "status", tid)
    return None if text is None else parse_status(text)


def parse_maps(text: str) -> List[MapsEntry]:
    """``/proc/<pid>/maps`` -> one (start, perms, device, inode, path) per mapping; path "" when anonymous.

    The path is the sixth column to the end of the line; it may hold spaces.
    """
    entries = []  # type: List[MapsEntry]
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5:
            continue
        try:
            start = int(fields[0].partition("-")[0], 16)
        except ValueError:
            continue
        entries.append((start, fields[1], fields[3], fields[4], fields[5].strip() if len(fields) == 6 else ""))
    return entries


def read_counter_file(root: str, rel: str) -> Dict[str, int]:
    """The ``name value`` lines of a counter file (``proc/vmstat``, a node's ``numastat``); {} when unreadable."""
    try:
        with Root(root) as tree:
            lines = tree.read(rel).decode("ascii", "replace").splitlines()
    except OSError:
        return {}
    counts = {}
    for line in lines:
        parts = line.split()
        count = parse_integer(parts[1]) if len(parts) == 2 else None
        if count is not None and count >= 0:
            counts[parts[0]] = count
    return counts


def read_vmstat(root: str) -> Dict[str, int]:
    """Every counter of ``/proc/vmstat``; {} when unreadable."""
    return read_counter_file(root, VMSTAT)


def node_ids(root: str, rel: str = NODE_DIR) -> List[int]:
    """The N of every ``node<N>`` entry of a sysfs directory, ascending; [] when it cannot be listed."""
    try:
        with Root(root) as tree:
            names = tree.listdir(rel)
    except OSError:
        return []
    return numbered(names, "node")


def numbered(names: Iterable[str], prefix: str) -> List[int]:
    """The N of every name that is ``prefix`` and a number as the kernel prints it (see
    is_kernel_number), ascending: ``cpu12`` of a cpu directory, ``node3`` of a node one."""
    start = len(prefix)
    return sorted(int(name[start:]) for name in names if name.startswith(prefix) and is_kernel_number(name[start:]))
