"""Synthetic Llama-shaped Q4_K_M GGUF files for ``folio bench 8b`` and ``folio bench sizes``:
a real model's shapes (``SIZES``: Llama-3.2-1B, Llama-3.2-3B, Llama-3-8B) with random
weights, so the bench can load and time a model of that size without downloading one.

A file has the starter's vocabulary and its tokenizer keys (``tokenizer.*``), so both
Folio and llama.cpp tokenize with the starter's tokenizer, an untied ``output.weight``, and
llama.cpp's Q4_K_M mix: Q4_K for most matrices, Q6_K for ``output.weight`` and for
``attn_v`` / ``ffn_down`` of about half the layers, F32 norms. Block bytes are random except
the fp16 super-block scales, set to small finite values: random scales would hold NaNs and
infinities, and large ones would overflow the activations somewhere in 32 layers.

It is written once into ``cache_root() / "bench"`` tensor by tensor (GGUFWriter's
header-then-``write_tensor_data`` mode), so at most one tensor is in memory, to a temporary
name renamed into place at the end; later runs reuse it. The file name carries the shape
(``Shape.label``), so each shape has its own file. A mixture of experts' shape
(synthetic_moe.py's ``MoEShape``) is this shape plus its expert fields: its own
architecture, feed-forward tensors and keys, the same plan, writer and cache.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

# Where the fp16 scales sit in a block (ggml's block_q4_K: d, dmin, scales[12], qs[128];
# block_q6_K: ql[128], qh[64], scales[16], d), as (first byte, count of fp16 values).
_SCALE_FIELDS = {"Q4_K": (0, 2), "Q6_K": (208, 1)}
# Ranges of the super-block scale d per type, chosen so a random weight's spread is a few
# hundredths (a trained model's 1/sqrt(hidden)) and 32 layers of residual sums stay far from
# float16's limits. Q4_K's dmin is 7.5 d, near the mean of d * scale * q, so its weights
# centre on zero instead of all leaning one way.
SCALE_RANGE = {"Q4_K": (1e-4, 3e-4), "Q6_K": (3e-5, 1e-4)}


# One tensor of a plan: GGUF name, shape outermost first, type name.
Planned = tuple[str, tuple[int, ...], str]


@dataclass(frozen=True, slots=True)
class Shape:
    """A dense Llama's shape; ``intermediate`` is the feed-forward width."""

    arch: ClassVar[str] = "llama"
    qk_norm: ClassVar[bool] = False  # per-layer q/k norm weights (OLMoE's)
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    context: int = 8192
    rope_base: float = 500000.0

    @property
    def label(self) -> str:
        return (f"llama-{self.layers}l-{self.hidden}h-{self.heads}q{self.kv_heads}kv-"
                f"{self.intermediate}ff")

    def gguf_keys(self) -> dict[str, int | float]:
        """The file's ``{arch}.*`` keys (without the prefix)."""
        return {"block_count": self.layers, "context_length": self.context,
                "embedding_length": self.hidden, "feed_forward_length": self.intermediate,
                "attention.head_count": self.heads, "attention.head_count_kv": self.kv_heads,
                "rope.dimension_count": self.head_dim, "rope.freq_base": self.rope_base,
                "attention.layer_norm_rms_epsilon": 1e-5}

    def ffn_plan(self, layer: int, more: str) -> list[Planned]:
        """Layer ``layer``'s feed-forward tensors; ``more``: the type of its more-bits
        matrices (use_more_bits)."""
        h, f = self.hidden, self.intermediate
        return [(f"blk.{layer}.ffn_gate.weight", (f, h), "Q4_K"),
                (f"blk.{layer}.ffn_up.weight", (f, h), "Q4_K"),
                (f"blk.{layer}.ffn_down.weight", (h, f), more)]


# The sizes ``folio bench sizes`` knows, by name (``--sizes 1b,3b,8b``). The vocabulary is
# the starter's, whatever the size (the writer copies its tokenizer).
SIZES: dict[str, Shape] = {
    "1b": Shape(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64,
                intermediate=8192),  # Llama-3.2-1B
    "3b": Shape(layers=28, hidden=3072, heads=24, kv_heads=8, head_dim=128,
                intermediate=8192),  # Llama-3.2-3B
    "8b": Shape(),  # Llama-3-8B
}
LLAMA3_8B = SIZES["8b"]


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's rule for the layers whose attn_v and ffn_down Q4_K_M stores as Q6_K:
    the first and last eighth, and every third layer in between."""
    return (layer < layers // 8 or layer >= 7 * layers // 8
            or (layer - layers // 8) % 3 == 2)


def tensor_plan(shape: Shape, vocab: int) -> list[Planned]:
    """Every tensor of ``shape``'s file, in file order."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    plan = [("token_embd.weight", (vocab, h), "Q4_K")]
    for i in range(shape.layers):
        more = "Q6_K" if use_more_bits(i, shape.layers) else "Q4_K"
        plan += [
            (f"blk.{i}.attn_norm.weight", (h,), "F32"),
            (f"blk.{i}.attn_q.weight", (q, h), "Q4_K"),
            (f"blk.{i}.attn_k.weight", (kv, h), "Q4_K"),
            (f"blk.{i}.attn_v.weight", (kv, h), more),
        ]
        if shape.qk_norm:
            plan += [(f"blk.{i}.attn_q_norm.weight", (q,), "F32"),
                     (f"blk.{i}.attn_k_norm.weight", (kv,), "F32")]
        plan += [(f"blk.{i}.attn_output.weight", (h, q), "Q4_K"),
                 (f"blk.{i}.ffn_norm.weight", (h,), "F32"), *shape.ffn_plan(i, more)]
    return plan + [("output_norm.weight", (h,), "F32"), ("output.weight", (vocab, h), "Q6_K")]


def tensor_nbytes(dims: tuple[int, ...], type_name: str) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[_ggml_type(type_name)]]
    count = int(np.prod(dims))
    if count % block:
        raise ValueError(f"{dims} does not split into {type_name} blocks of {block}")
    return count // block * block_bytes


def _ggml_type(kind: str) -> str:
    """The GGUF type of a plan's kind (F32_RANDOM is stored as F32)."""
    return "F32" if kind == "F32_RANDOM" else kind


def synthetic_path(shape: Shape = LLAMA3_8B, root: Path | None = None) -> Path:
    """Where a shape's file lives: named by its ``label``."""
    if root is None:
        from engine.loaders.gguf.loader import cache_root

        root = cache_root() / "bench"
    return root / f"synthetic-{shape.label}-Q4_K_M.gguf"


def ensure_synthetic_gguf(tokenizer_gguf: Path, shape: Shape = LLAMA3_8B,
                          root: Path | None = None, rebuild: bool = False,
                          seed: int = 0) -> tuple[Path, bool]:
    """The synthetic file's path and whether this call wrote it (False: reused)."""
    path = synthetic_path(shape, root)
    if path.exists() and not rebuild:
        return path, False
    write_synthetic_gguf(path, tokenizer_gguf, shape, seed)
    return path, True


def write_synthetic_gguf(path: Path, tokenizer_gguf: Path, shape: Shape = LLAMA3_8B,
                         seed: int = 0) -> None:
    write_random_gguf(path, tokenizer_gguf, shape.arch, shape.label, shape.gguf_keys(),
                      lambda vocab: tensor_plan(shape, vocab), seed)


def write_random_gguf(path: Path, tokenizer_gguf: Path, arch: str, label: str,
                      keys: dict[str, int | float],
                      plan_of: Callable[[int], list[Planned]],
                      seed: int = 0) -> None:
    """A GGUF of `arch` with `keys` (``{arch}.`` names without the prefix: ints as uint32,
    floats as float32), the tokenizer of `tokenizer_gguf`, and the tensors `plan_of(vocab)`
    lists, random (``random_tensor``), written one at a time."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

    reader = GGUFReader(tokenizer_gguf)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    plan = plan_of(vocab)
    total = sum(tensor_nbytes(dims, kind) for _, dims, kind in plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < total + (1 << 30):
        raise OSError(f"writing {path} needs {total / 2**30:.1f} GiB and 1 GiB to spare; "
                      f"{free / 2**30:.1f} GiB are free there")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = GGUFWriter(tmp, arch)
    try:
        writer.add_name(f"synthetic {label} (random Q4_K_M weights, folio bench)")
        writer.add_file_type(15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        writer.add_quantization_version(2)
        for key, value in {**keys, "vocab_size": vocab}.items():
            add = writer.add_float32 if isinstance(value, float) else writer.add_uint32
            add(f"{arch}.{key}", value)
        copy_tokenizer_keys(reader, writer)
        for name, dims, kind in plan:
            raw = None if _ggml_type(kind) == "F32" else GGMLQuantizationType[kind]
            writer.add_tensor_info(name, dims, np.dtype(np.float32), tensor_nbytes(dims, kind),
                                   raw_dtype=raw)
        del reader  # its memory maps of the starter are no longer needed
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        rng = np.random.default_rng(seed)
        for _, dims, kind in plan:
            writer.write_tensor_data(random_tensor(rng, dims, kind))
        writer.close()
        os.replace(tmp, path)
        drop_cached_pages(path)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)


def drop_cached_pages(path: Path) -> None:
    """Write `path` out and drop its pages from the page cache (Linux; elsewhere nothing).

    The writer leaves the file cached in folios the size of its writes, which no reader can
    map with 2 MiB pages; read back from disk through a huge-page map (Folio's loader) it is
    cached in 2 MiB folios, as a model file is after a restart. Without this the bench's
    first runs would time decode on 4 KiB pages and later ones, after the cache turned
    over, on 2 MiB pages (docs/CPU_PERFORMANCE.md, "Decode prefetch and huge pages")."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def copy_tokenizer_keys(reader, writer) -> None:
    """Every ``tokenizer.*`` key of a GGUFReader into a GGUFWriter, types kept: what
    Folio's GGUF tokenizer and llama.cpp read."""
    from gguf import GGUFValueType

    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            kind = field.types[0]
            sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), kind, sub_type=sub)


def random_tensor(rng: np.random.Generator, dims: tuple[int, ...], kind: str) -> np.ndarray:
    """F32: ones (norm weights). F32_RANDOM: small normal values (a router, whose rows must
    differ for tokens to spread over the experts). Quantized: the tensor's bytes, random
    but for the scales."""
    if kind == "F32":
        return np.ones(dims, np.float32)
    if kind == "F32_RANDOM":
        return rng.normal(0.0, 0.02, dims).astype(np.float32)
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1]
    data = rng.integers(0, 256, tensor_nbytes(dims, kind), dtype=np.uint8)
    blocks = data.reshape(-1, block_bytes)
    first, count = _SCALE_FIELDS[kind]
    d = rng.uniform(*SCALE_RANGE[kind], size=(len(blocks), 1))
    scales = np.concatenate([d, 7.5 * d], axis=1)[:, :count].astype(np.float16)
    blocks[:, first:first + 2 * count] = scales.view(np.uint8)
    return data
