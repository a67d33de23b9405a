"""Tests for make_model.py: run with `pytest lab/llama` in a venv holding lab/llama/requirements.txt."""
import hashlib
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

import make_model

SCRIPT = Path(__file__).with_name("make_model.py")


@pytest.mark.parametrize("size_mib", [1, 5, 30, 100, 300, 1000, 4000, 16000])
def test_plan_lands_within_one_percent_of_the_requested_size(size_mib):
    shape = make_model.plan_shape(size_mib)
    actual_mib = shape.n_params() * make_model.F32_BYTES / make_model.MIB
    assert abs(actual_mib - size_mib) / size_mib < 0.01


@pytest.mark.parametrize("size_mib", [1, 30, 300, 1000, 16000])
def test_plan_uses_whole_heads_and_at_least_two_layers(size_mib):
    shape = make_model.plan_shape(size_mib)
    assert shape.n_embd % make_model.HEAD_DIM == 0
    assert shape.n_head >= 1
    assert 2 <= shape.n_layers <= make_model.MAX_LAYERS
    assert shape.n_ff % make_model.FF_STEP == 0


def test_plan_rejects_a_size_below_one_mib():
    with pytest.raises(make_model.ModelError, match="at least 1"):
        make_model.plan_shape(0)


def run(tmp_path, *args):
    env = {"INFEROPS_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(SCRIPT)] + list(args), env=env,
                          capture_output=True, text=True, check=False)


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_output_is_a_llama_gguf_with_the_planned_shape_and_byte_vocab(tmp_path):
    result = run(tmp_path, "--size-mb", "2")
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path.name.startswith("llama-rand-2mb-") and path.suffix == ".gguf"
    reader = gguf.GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    shape = make_model.plan_shape(2)
    assert fields["general.architecture"] == "llama"
    assert fields["llama.embedding_length"] == shape.n_embd
    assert fields["llama.block_count"] == shape.n_layers
    assert fields["llama.feed_forward_length"] == shape.n_ff
    assert fields["tokenizer.ggml.model"] == "llama"
    tokens = fields["tokenizer.ggml.tokens"]
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and tokens[3] == "<0x00>" and tokens[-1] == "<0xFF>"
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    assert len(reader.tensors) == len(shape.tensors())


def test_same_size_gives_identical_bytes_and_is_served_from_cache(tmp_path):
    first = run(tmp_path, "--size-mb", "2")
    out = tmp_path / "copy" / "model.gguf"
    second = run(tmp_path, "--size-mb", "2", "--out", str(out))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "generated" in first.stderr and "cached" in second.stderr
    assert second.stdout.strip() == str(out)
    assert sha256(out) == sha256(first.stdout.strip())
    assert len(list((tmp_path / "cache" / "models").iterdir())) == 1


def test_different_sizes_get_different_weights(tmp_path):
    a = run(tmp_path, "--size-mb", "1").stdout.strip()
    b = run(tmp_path, "--size-mb", "2").stdout.strip()
    assert a != b and sha256(a) != sha256(b)


def test_invalid_size_is_reported_without_a_traceback(tmp_path):
    result = run(tmp_path, "--size-mb", "0")
    assert result.returncode == 2
    assert "--size-mb must be at least 1" in result.stderr
    assert "Traceback" not in result.stderr
