"""Size strings, their printing, and measuring a model on disk."""
import os

import pytest

from ansible_collections.inferops.numa.plugins.module_utils.numa.errors import NumaError
from ansible_collections.inferops.numa.plugins.module_utils.numa.sizes import format_size, parse_size, size_of_path

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
