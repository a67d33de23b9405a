#!/usr/bin/env python3
"""Write a random-weight llama GGUF of about N MiB that the real llama-server loads.

No model hub is reachable from the lab, and the NUMA work needs model files of a chosen size (page-cache
placement scales with file size, not with model quality). The output is deterministic for a given size
and recipe, and cached as ~/.cache/inferops-numa/models/llama-rand-<N>mb-<hash>.gguf.

    python lab/llama/make_model.py --size-mb 30 [--out PATH]   -> prints the path of the model

Needs the packages pinned in lab/llama/requirements.txt (gguf, numpy).
"""
import argparse
import hashlib
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Iterator, List, Tuple

import numpy as np
import gguf

MIB = 1 << 20
F32_BYTES = 4
HEAD_DIM = 64
# Sized so the smallest head count is 1 and every width divides into 64-wide heads.
EMBD_STEP = HEAD_DIM
FF_STEP = 32
CONTEXT_LENGTH = 2048
# Small weights keep activations finite through the random layers.
WEIGHT_STD = 0.02
MAX_LAYERS = 32

# SentencePiece-style vocabulary: <unk>, <s>, </s> then one token per byte, so any text tokenizes
# through byte fallback without a trained vocabulary.
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
N_VOCAB = len(SPECIAL_TOKENS) + 256


class ModelError(Exception):
    """A problem the user can fix; the message names the cause and the fix."""


@dataclass(frozen=True)
class Shape:
    n_layers: int
    n_embd: int
    n_ff: int

    @property
    def n_head(self) -> int:
        return self.n_embd // HEAD_DIM

    def tensors(self) -> List[Tuple[str, Tuple[int, ...]]]:
        """Tensor names and numpy shapes (rows = outputs), in file order."""
        e, f, v = self.n_embd, self.n_ff, N_VOCAB
        out = [("token_embd.weight", (v, e))]
        for i in range(self.n_layers):
            p = "blk.%d." % i
            out += [
                (p + "attn_norm.weight", (e,)),
                (p + "attn_q.weight", (e, e)),
                (p + "attn_k.weight", (e, e)),
                (p + "attn_v.weight", (e, e)),
                (p + "attn_output.weight", (e, e)),
                (p + "ffn_norm.weight", (e,)),
                (p + "ffn_gate.weight", (f, e)),
                (p + "ffn_up.weight", (f, e)),
                (p + "ffn_down.weight", (e, f)),
            ]
        out += [("output_norm.weight", (e,)), ("output.weight", (v, e))]
        return out

    def n_params(self) -> int:
        return sum(math.prod(s) for _, s in self.tensors())


def plan_shape(size_mib: int) -> Shape:
    """Pick layers and width so the F32 weights total about size_mib.

    Layers grow slowly with size (2 up to ~640 MiB, then one per 256 MiB, at most 32) and the width
    takes the rest, like real models; the FFN width absorbs the rounding of n_embd so the size lands
    within about 1%.
    """
    if size_mib < 1:
        raise ModelError("--size-mb must be at least 1 (got %d)" % size_mib)
    params = size_mib * MIB // F32_BYTES
    n_layers = max(2, min(MAX_LAYERS, round(size_mib / 256)))
    # A llama layer with n_ff = 4 * n_embd holds 16 * n_embd^2 weights.
    n_embd = max(EMBD_STEP, int(math.sqrt(params / (16 * n_layers))) // EMBD_STEP * EMBD_STEP)
    fixed = 2 * N_VOCAB * n_embd + n_embd + n_layers * (4 * n_embd * n_embd + 2 * n_embd)
    n_ff = round((params - fixed) / (3 * n_layers * n_embd) / FF_STEP) * FF_STEP
    return Shape(n_layers=n_layers, n_embd=n_embd, n_ff=max(FF_STEP, n_ff))


def recipe_hash(size_mib: int) -> str:
    """Changes whenever the bytes written could change: this script, the size, the library versions."""
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(("%d|gguf=%s|numpy=%s" % (size_mib, metadata.version("gguf"), np.__version__)).encode())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    root = os.environ.get("INFEROPS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "inferops-numa")
    return Path(root) / "models"


def tensor_values(shape: Shape, seed: int) -> Iterator[np.ndarray]:
    """Weights in file order from one seeded stream, so the file is byte-identical across runs."""
    rng = np.random.default_rng(seed)
    for name, dims in shape.tensors():
        if name.endswith("norm.weight"):
            yield np.ones(dims, dtype=np.float32)
            continue
        values = rng.standard_normal(dims, dtype=np.float32)
        values *= WEIGHT_STD
        yield values


def add_metadata(w: gguf.GGUFWriter, shape: Shape, size_mib: int) -> None:
    w.add_name("llama-rand-%dmb" % size_mib)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layers)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_tokenizer_model("llama")
    tokens = SPECIAL_TOKENS + ["<0x%02X>" % b for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * N_VOCAB)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)


def write_model(path: Path, shape: Shape, size_mib: int) -> None:
    """Streams tensor by tensor so memory stays at one tensor, whatever the model size."""
    w = gguf.GGUFWriter(path, "llama")
    add_metadata(w, shape, size_mib)
    for name, dims in shape.tensors():
        w.add_tensor_info(name, dims, np.dtype(np.float32), math.prod(dims) * F32_BYTES)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for values in tensor_values(shape, seed=size_mib):
        w.write_tensor_data(values)
    w.close()


def ensure_cached(size_mib: int) -> Tuple[Path, bool]:
    """Returns the cached model path and whether it was generated now."""
    shape = plan_shape(size_mib)
    target = cache_dir() / ("llama-rand-%dmb-%s.gguf" % (size_mib, recipe_hash(size_mib)))
    if target.is_file():
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed, so a crash never leaves a truncated model in the cache.
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".gguf", dir=str(target.parent))
    os.close(fd)
    try:
        write_model(Path(tmp), shape, size_mib)
        # mkstemp creates 0600; the lab's server may run as an unprivileged user.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target, True


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=int, required=True, help="approximate model size in MiB (>= 1)")
    p.add_argument("--out", type=Path, help="also copy the model here (default: just print the cached path)")
    return p.parse_args(argv)


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    try:
        cached, generated = ensure_cached(args.size_mb)
        result = cached
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cached, args.out)
            result = args.out
    except ModelError as e:
        print("make_model: %s" % e, file=sys.stderr)
        return 2
    except OSError as e:
        print("make_model: cannot write the model: %s; check free space and permissions, "
              "or set INFEROPS_CACHE to another directory" % e, file=sys.stderr)
        return 1
    shape = plan_shape(args.size_mb)
    print("make_model: %s n_layers=%d n_embd=%d n_ff=%d bytes=%d %s in %.1fs" % (
        cached.name, shape.n_layers, shape.n_embd, shape.n_ff, cached.stat().st_size,
        "generated" if generated else "cached", time.monotonic() - start), file=sys.stderr)
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
