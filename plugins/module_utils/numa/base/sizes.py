"""Memory sizes: parse ``14G`` / ``1.5GiB``, print them back, measure a model on disk.

Every unit is binary (1024-based), with or without ``B`` / ``iB``: ``14G``,
``14GB``, ``14GiB`` all mean 14 * 2**30 bytes. Memory is sold and reported by
the kernel in binary units, and reading ``GB`` as the larger binary unit errs on
the safe side when checking whether a model fits a node.

``size_of_path`` is the one function here that touches the filesystem; the
planner only ever sees the resulting byte count.

numa-pin parses the default headroom ("1G") at every service start: sizes are read
with string methods and exact integer arithmetic, not ``re`` and ``decimal`` (several
ms to import), and ``typing`` is for type checkers only.
"""
from __future__ import annotations

import os

from .errors import NumaError, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Tuple, Union

_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
# 16 EiB: what a 64-bit address space holds, so no model or headroom on any machine is larger.
MAX_BYTES = 1 << 64
# A byte count below MAX_BYTES has 20 digits; as many decimals again cannot change it by a byte,
# and int() refuses (ValueError) strings past ~4300 digits.
_MAX_DIGITS = 40
# What may follow a unit letter: 14G, 14GB, 14Gi, 14GiB.
_UNIT_TAILS = ("", "ib", "i", "b")
# A split GGUF's part name ends "-00001-of-00003.gguf".
_SPLIT_TAIL = len("-00001-of-00003.gguf")


def parse_size(text: Union[str, int]) -> int:
    """``"14G"`` -> 15032385536. Bytes, rounded up; see the module doc for units.

    Accepts a non-negative int as a byte count. Raises NumaError naming the value
    for anything else (negative, empty, unknown unit, not a number).
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise NumaError("size %s is not a number of bytes or a string like '14G'" % shown(text))
    if isinstance(text, int):
        if text < 0:
            raise NumaError("size %s is negative: give a size of 0 or more bytes" % shown(text))
        return _at_most_max_bytes(text, text)
    parsed = _number_and_power(text.strip())
    if parsed is None:
        raise NumaError("cannot read size %s: write a number with an optional binary unit, "
                        "like 1000000, 512M, 1.5GiB or 14G" % shown(text))
    (value, decimals), power = parsed
    # Exact: the number times 1024**power, rounded up to whole bytes.
    return _at_most_max_bytes(-(-value * 1024 ** power // 10 ** decimals), text)


def _at_most_max_bytes(num_bytes: int, given: Union[str, int]) -> int:
    if num_bytes >= MAX_BYTES:
        raise NumaError("size %s is 16 EiB or more, beyond what a 64-bit machine addresses: give the "
                        "real size, like 14G" % shown(given))
    return num_bytes


def decimal_digits(text: str) -> Optional[Tuple[int, int]]:
    """``"1.5"`` -> (15, 1): the number's digits as an integer, and how many of them follow the point.

    None unless ``text`` is a plain decimal number: ``14``, ``1.5``, ``1.`` or ``.5`` (no sign,
    no exponent, no spaces). More digits than any byte count needs raise NumaError.
    """
    whole, _point, fraction = text.partition(".")
    if not (whole or fraction) or not _digits(whole) or not _digits(fraction):
        return None
    if len(whole.lstrip("0")) + len(fraction) > _MAX_DIGITS:
        raise NumaError("number %s has more than %d digits: no size needs that many; write it like 14G"
                        % (shown(text), _MAX_DIGITS))
    return int(whole + fraction), len(fraction)


def _digits(text: str) -> bool:
    """Empty or decimal digits only: what a regex's \\d* matches, and int() reads."""
    return not text or text.isdecimal()


def _number_and_power(text: str) -> Optional[Tuple[Tuple[int, int], int]]:
    """``"1.5 GiB"`` -> ((15, 1), 3): the number (see decimal_digits) and the unit's power of 1024.

    None unless the text is a number, optional spaces and an optional unit: k, m, g, t or p
    with an optional ``b``, ``i`` or ``ib``, or a lone ``b``; in any case.
    """
    end = 0
    while end < len(text) and (text[end].isdecimal() or text[end] == "."):
        end += 1
    number = decimal_digits(text[:end])
    unit = text[end:].lstrip().lower()
    if number is None:
        return None
    if unit in ("", "b"):
        return number, 0
    if unit[0] in _UNITS and unit[1:] in _UNIT_TAILS:
        return number, _UNITS[unit[0]]
    return None


def format_size(num_bytes: int) -> str:
    """15032385536 -> ``"14 GiB"``; two decimals at most, for messages and reasons."""
    # A float: what "%.2f" formats anyway; n / 1024**k is exact below 2**53 bytes.
    value = float(num_bytes)
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
    split = _split_gguf(path)
    if split:
        stem, count = split
        return sum(_file_size("%s-%05d-of-%05d.gguf" % (stem, part, count)) for part in range(1, count + 1))
    return _file_size(path)


def _split_gguf(path: str) -> Optional[Tuple[str, int]]:
    """(stem, part count) of ``stem-00002-of-00003.gguf``, else None."""
    tail = path[-_SPLIT_TAIL:]
    part, count = tail[1:6], tail[10:15]
    if not (tail[:1] == "-" and tail[6:10] == "-of-" and tail[15:] == ".gguf" and part.isdecimal()
            and count.isdecimal()):
        return None
    return path[:-_SPLIT_TAIL], int(count)


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


def finite_number(value: object) -> bool:
    """An int or float that a bound can be checked against: not NaN, not infinite, not a bool."""
    # An int is finite however large (math.isfinite() would overflow converting it to float); a float's
    # difference with itself is 0 unless it is NaN or infinite.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or value - value == 0
