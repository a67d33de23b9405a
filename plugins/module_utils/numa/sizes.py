"""Memory sizes: parse ``14G`` / ``1.5GiB``, print them back, measure a model on disk.

Every unit is binary (1024-based), with or without ``B`` / ``iB``: ``14G``,
``14GB``, ``14GiB`` all mean 14 * 2**30 bytes. Memory is sold and reported by
the kernel in binary units, and reading ``GB`` as the larger binary unit errs on
the safe side when checking whether a model fits a node.

``size_of_path`` is the one function here that touches the filesystem; the
planner only ever sees the resulting byte count.
"""
import math
import os
import re
from decimal import Decimal
from typing import List, Union

from .errors import NumaError

_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_SIZE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgtp])(?:ib|i|b)?|b)?$", re.IGNORECASE)
_SPLIT_GGUF = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")


def parse_size(text: Union[str, int]) -> int:
    """``"14G"`` -> 15032385536. Bytes, rounded up; see the module doc for units.

    Accepts a non-negative int as a byte count. Raises NumaError naming the value
    for anything else (negative, empty, unknown unit, not a number).
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise NumaError("size %r is not a number of bytes or a string like '14G'" % (text,))
    if isinstance(text, int):
        if text < 0:
            raise NumaError("size %d is negative: give a size of 0 or more bytes" % text)
        return text
    match = _SIZE.match(text.strip())
    if not match:
        raise NumaError("cannot read size %r: write a number with an optional binary unit, "
                        "like 1000000, 512M, 1.5GiB or 14G" % (text,))
    number = Decimal(match.group(1))
    power = _UNITS[(match.group(2) or "").lower()]
    return int(math.ceil(number * (1024 ** power)))


def format_size(num_bytes: int) -> str:
    """15032385536 -> ``"14 GiB"``; two decimals at most, for messages and reasons."""
    value = Decimal(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value = value / 1024
    text = ("%.2f" % value).rstrip("0").rstrip(".")
    return "%s %s" % (text, unit)


def size_of_path(path: str) -> int:
    """Bytes a model at ``path`` occupies: a file, all parts of a split GGUF, or a directory.

    A split GGUF (``name-00001-of-00003.gguf``) loads all its parts, so naming any
    part counts them all. A directory (a Hugging Face snapshot) counts every file
    below it, following symlinks to the blobs they point at.
    """
    if os.path.isdir(path):
        return sum(_file_size(name) for name in _files_below(path))
    match = _SPLIT_GGUF.match(path)
    if match:
        count = int(match.group("count"))
        return sum(_file_size("%s-%05d-of-%05d.gguf" % (match.group("stem"), part, count))
                   for part in range(1, count + 1))
    return _file_size(path)


def _files_below(top: str) -> List[str]:
    found = []
    for folder, dirs, files in os.walk(top, onerror=_raise_walk_error):
        dirs.sort()
        found.extend(os.path.join(folder, name) for name in sorted(files))
    return found


def _raise_walk_error(error: OSError) -> None:
    raise NumaError("cannot read model directory %s: %s; check the path and its permissions"
                    % (error.filename, error.strerror))


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError as error:
        raise NumaError("cannot size model %s: %s; give an existing file or directory, "
                        "or a size like '14G'" % (path, error.strerror))
