"""Size strings, their printing, and measuring a model on disk."""
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.numa.plugins.module_utils.numa.base.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.base.sizes import (
    MAX_BYTES, format_size, parse_size, shown, size_of_path)

GIB = 1024 ** 3


@pytest.mark.parametrize("text, expected", [
    ("1000000", 1000000),
    ("0", 0),
    ("512M", 512 * 1024 ** 2),
    ("14G", 14 * GIB),
    ("14GB", 14 * GIB),
    ("14GiB", 14 * GIB),
    ("14gib", 14 * GIB),
    ("14 G", 14 * GIB),
    ("1.5GiB", 1610612736),
    (".5K", 512),
    ("2T", 2 * 1024 ** 4),
    ("1KB", 1024),
    ("1Ki", 1024),
    ("100B", 100),
    ("1.0001K", 1025),  # rounded up to whole bytes
    (" 3G\n", 3 * GIB),
    (7, 7),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "-1G", "14X", "1,5G", "14 GBs", "nan", "1e9", "14 G B", "0x10"])
def test_parse_size_rejects_bad_input_naming_it(text):
    with pytest.raises(NumaError) as error:
        parse_size(text)
    assert repr(text) in str(error.value)


@pytest.mark.parametrize("value", [-1, True, 1.5, None])
def test_parse_size_rejects_non_sizes(value):
    with pytest.raises(NumaError):
        parse_size(value)


@pytest.mark.parametrize("num_bytes, expected", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536 * 1024 ** 2, "1.5 GiB"),
    (14 * GIB, "14 GiB"), (41 * GIB + GIB // 3, "41.33 GiB"), (3 * 1024 ** 5, "3072 TiB"),
])
def test_format_size(num_bytes, expected):
    assert format_size(num_bytes) == expected


def _write(path, size):
    with open(path, "wb") as handle:
        handle.write(b"\0" * size)


def test_size_of_file(tmp_path):
    model = tmp_path / "model.gguf"
    _write(model, 1234)
    assert size_of_path(str(model)) == 1234


def test_size_of_split_gguf_counts_every_part(tmp_path):
    for part, size in ((1, 100), (2, 200), (3, 300)):
        _write(tmp_path / ("llama-%05d-of-00003.gguf" % part), size)
    assert size_of_path(str(tmp_path / "llama-00002-of-00003.gguf")) == 600


def test_size_of_split_gguf_with_a_missing_part_fails(tmp_path):
    _write(tmp_path / "llama-00001-of-00002.gguf", 100)
    with pytest.raises(NumaError) as error:
        size_of_path(str(tmp_path / "llama-00001-of-00002.gguf"))
    assert "llama-00002-of-00002.gguf" in str(error.value)


def test_size_of_directory_follows_symlinks_to_blobs(tmp_path):
    blobs = tmp_path / "blobs"
    snapshot = tmp_path / "snapshot" / "sub"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    _write(blobs / "weights", 5000)
    _write(snapshot / "config.json", 10)
    os.symlink(str(blobs / "weights"), str(snapshot / "model.safetensors"))
    assert size_of_path(str(tmp_path / "snapshot")) == 5010


def test_size_of_missing_path_names_it(tmp_path):
    missing = str(tmp_path / "nope.gguf")
    with pytest.raises(NumaError) as error:
        size_of_path(missing)
    assert missing in str(error.value)


# --- bounds: 16 EiB, digits, and messages that stay short ---------------------------------

SIZE_PROPERTY = settings(max_examples=300, deadline=None, derandomize=True)


@pytest.mark.parametrize("value, message", [
    (1 << 64, "16 EiB or more"),
    ("16384P", "16 EiB or more"),
    ("18446744073709551616", "16 EiB or more"),
    ("9" * 5000, "has more than 40 digits"),
    ("0." + "0" * 5000 + "1G", "has more than 40 digits"),
    (10 ** 5000, "(a 16610-bit number) is 16 EiB or more"),
    (-(10 ** 5000), "(a 16610-bit number) is negative"),
    (float("nan"), "size nan is not a number of bytes"),
    (float("inf"), "size inf is not a number of bytes"),
], ids=["2**64", "16384P", "2**64 digits", "5000 digits", "5000 decimals", "10**5000", "-10**5000", "nan", "inf"])
def test_sizes_past_a_64_bit_machine_or_unreadably_long_are_refused(value, message):
    with pytest.raises(NumaError) as error:
        parse_size(value)
    assert message in str(error.value)
    assert "\n" not in str(error.value) and len(str(error.value)) < 200


def test_largest_sizes_below_16_eib_are_read_exactly():
    assert parse_size("16383P") == 16383 * 1024 ** 5
    assert parse_size((1 << 64) - 1) == (1 << 64) - 1
    assert parse_size("0" * 100 + "1G") == GIB  # leading zeros carry no magnitude


@SIZE_PROPERTY
@given(st.text(alphabet="0123456789.kmgtpibKMGTPIB -+eE%", max_size=60))
def test_any_size_text_is_bytes_below_16_eib_or_a_one_line_error(text):
    try:
        size = parse_size(text)
    except NumaError as error:
        assert "\n" not in str(error) and len(str(error)) < 250
        return
    assert 0 <= size < MAX_BYTES


@SIZE_PROPERTY
@given(st.integers())
def test_any_int_is_itself_or_refused_by_range(number):
    if 0 <= number < MAX_BYTES:
        assert parse_size(number) == number
    else:
        with pytest.raises(NumaError, match="negative|16 EiB"):
            parse_size(number)


def test_shown_cuts_long_values_and_names_huge_ints():
    assert shown("14G") == "'14G'"
    assert shown("x" * 1000) == "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...(1002 characters)"
    assert shown(1 << 100) == "(a 101-bit number)"
    assert shown(True) == "True"
