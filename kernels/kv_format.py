"""How a KV pool's rows hold their values: one `KVFormat` per `kv_cache_dtype`.

A pool is always indexed [num_layers, 2, num_blocks, block_size, nkv, row] (see
`kernels.interface.allocate_kv_cache`); `row` is one token's one KV head. A plain pool
(float32, bfloat16, float16) keeps ``head_size`` values there. A quantized pool keeps
bytes: the head's quantized values, then its float16 scales, little-endian:

- **int8** (storage torch.int8): hd int8 values, then one float16 scale (2 bytes),
  absmax / 127 per token and head, then `kv_key_centers.spare_bytes(hd)` bytes (one at
  head size 64) that a key row's block uses: keys are rows too, but around each channel's
  center over the block's tokens, the block's centers in those bytes
  (kernels/kv_key_centers.py), so key rows are written and read a block at a time
  (`encode_keys`, `decode_keys`) and a block holds at least 64 tokens.
- **fp8** (storage torch.float8_e4m3fn): hd e4m3 values, then one float16 scale,
  absmax / 448 per token and head.
- **int4** (storage torch.uint8): a value row is hd / 2 bytes (element 2i in the low
  nibble, 2i + 1 in the high one, each stored as q + 8, q in [-8, 7]), then one float16
  scale per group of `int4_group(hd)` elements. As llama.cpp's q4_0, the scale is the
  group's largest-magnitude element over -8 (the positive one where +a and -a tie), so
  that element takes the code -8 exactly and all 16 levels are used: a signed scale, where
  absmax / 7 would leave one level idle. On the starter that cut int4's KL by a fifth
  (docs/BENCHMARKS.md). Keys are not rows: each channel is quantized over its block's
  tokens, the block's parameters in the key rows' spare bytes
  (kernels/kv_key_channels.py), so key rows are written and read a block at a time
  (`encode_keys`, `decode_keys`) and a block holds at least 32 tokens. Both rows have
  the longer of the two lengths.

A value decodes as ``q * scale`` with the scale read back as float16 (encoding divides
by that rounded scale, so the two agree). Every quantized row is rotated before it is
quantized: a fixed, normalized Walsh-Hadamard transform over each run of
`rotation_block(hd)` elements spreads an outlier over the whole run, so the row's absmax,
and with it the quantization step, shrinks (QuaRot; llama.cpp #21038). On the starter it
cuts the teacher-forced KL against float16 about fourfold for int8 and int4 alike (the
measurements are in docs/BENCHMARKS.md). The transform is symmetric and orthogonal, so it
is its own inverse and ``rotate(q) . rotate(k) == q . k``: a backend reading a quantized
pool rotates the query, attends in the rotated space and rotates its output back (values
are rotated too). `decode` returns the stored, rotated values.

The storage dtype is the format's tag: `format_of(pool)` reads it, so the pool tensors
the engine hands the backends carry their format with them, and the block moves (copy,
swap, the disk tier) move rows as they are. This module is the one place that says what
a row holds; every kernel is tested against `encode` / `decode`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kernels import kv_key_centers as centers
from kernels import kv_key_channels as channels

__all__ = [
    "KV_FORMAT_NAMES",
    "KVFormat",
    "format_named",
    "format_of",
    "format_stored_as",
    "int4_group",
    "rotation_block",
]

SCALE_BYTES = 2  # one float16


@dataclass(frozen=True, slots=True)
class KVFormat:
    name: str  # as kv_cache_dtype names it
    storage: torch.dtype  # the pool tensor's dtype; the format's tag
    bits: int  # per value, for people and for sizing
    max_code: float  # the largest magnitude a quantized value takes (0: not quantized)
    rotated: bool = False

    @property
    def quantized(self) -> bool:
        return self.max_code > 0

    @property
    def key_codec(self):
        """The module that encodes this format's key rows a block at a time, each from the
        block's tokens (int4: per channel, kernels/kv_key_channels.py; int8: around the
        block's centers, kernels/kv_key_centers.py), or None where a key row is a token's
        own."""
        if self.bits == 4:
            return channels
        return centers if self.storage == torch.int8 else None

    @property
    def keys_by_block(self) -> bool:
        return self.key_codec is not None

    @property
    def key_layout(self) -> str:
        """How key rows hold a token: "rows" (each its own), or the key codec's
        KEY_LAYOUT; the disk tier's fingerprint names it."""
        return "rows" if self.key_codec is None else self.key_codec.KEY_LAYOUT

    @property
    def min_block_size(self) -> int:
        """The fewest tokens a block of this format holds (1: any)."""
        return 1 if self.key_codec is None else self.key_codec.MIN_BLOCK_SIZE

    def row_len(self, head_size: int) -> int:
        """Elements (bytes, for a quantized format) of one token's one KV head."""
        if not self.quantized:
            return head_size
        if self.bits == 4:
            _check_int4(head_size)
            value_row = head_size // 2 + SCALE_BYTES * (head_size // int4_group(head_size))
            return max(value_row, head_size // 2 + channels.spare_bytes(head_size))
        if self.storage == torch.int8:
            return head_size + SCALE_BYTES + centers.spare_bytes(head_size)
        return head_size + SCALE_BYTES

    def row_bytes(self, head_size: int) -> int:
        return self.row_len(head_size) * self.storage.itemsize

    def head_size(self, row_len: int) -> int:
        """The head size whose rows are ``row_len`` long (the inverse of `row_len`)."""
        if not self.quantized:
            return row_len
        if self.storage == torch.float8_e4m3fn:
            return row_len - SCALE_BYTES
        return _searched_head_size(self, row_len)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., hd] rotated over its last dim (a rotated format), else x itself."""
        if not self.rotated:
            return x
        return rotate(x)

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [..., hd] (any float dtype) -> [..., row_len(hd)] in the storage dtype:
        values, and keys of a format that keeps them as rows. A rotated format rotates the
        rows first."""
        if not self.quantized:
            return rows.to(self.storage)
        x = self.rotate(rows.float())
        if self.bits == 4:
            return _encode_int4(x, self.row_len(x.shape[-1]))
        absmax = x.abs().amax(dim=-1, keepdim=True)
        scale = (absmax / self.max_code).to(torch.float16)
        inv = torch.where(scale > 0, 1.0 / scale.float(), torch.zeros_like(absmax))
        if self.storage == torch.int8:
            codes = torch.round(x * inv).clamp_(-127, 127).to(torch.int8).view(torch.uint8)
        else:
            codes = (x * inv).clamp_(-448.0, 448.0).to(self.storage).view(torch.uint8)
        hd = x.shape[-1]
        pad = torch.zeros(*codes.shape[:-1], self.row_len(hd) - hd - SCALE_BYTES,
                          dtype=torch.uint8, device=x.device)
        return torch.cat([codes, scale.view(torch.uint8), pad], dim=-1).view(self.storage)

    def encode_keys(self, keys: torch.Tensor, filled: torch.Tensor | None = None
                    ) -> torch.Tensor:
        """keys [B, bs, nkv, hd] -> blocks of key rows [B, bs, nkv, row_len(hd)]: rows
        0..filled - 1 of each block (all when None) encoded from its exact keys."""
        if not self.keys_by_block:
            return self.encode(keys)
        if filled is None:
            filled = torch.full((keys.shape[0],), keys.shape[1], dtype=torch.int64)
        # Rounded to float16 as the key stage keeps an open block's rows
        # (kernels/key_stage.py): a block's bytes are the same however it was written.
        exact = self.rotate(keys.float()).half().float()
        return self.encode_key_block(exact, filled).view(self.storage)

    def encode_key_block(self, exact: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
        """Exact rotated keys [B, bs, nkv, hd] (rows at and after ``filled`` ignored) ->
        key rows [B, bs, nkv, row_len] as bytes (uint8), by the format's block codec."""
        return self.key_codec.encode_key_block(exact, filled, self.row_len(exact.shape[-1]))

    def decode_keys(self, blocks: torch.Tensor, dtype: torch.dtype = torch.float32
                    ) -> torch.Tensor:
        """Blocks of key rows [B, bs, nkv, row_len] -> [B, bs, nkv, hd] keys (rotated,
        for a rotated format)."""
        if not self.keys_by_block:
            return self.decode(blocks, dtype)
        hd = self.head_size(blocks.shape[-1])
        raw = blocks.contiguous().view(torch.uint8)
        return self.key_codec.decode_key_block(raw, hd).to(dtype)

    def decode(self, stored: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """stored [..., row_len] -> [..., hd] values, and keys of a format that keeps them as
        rows (rotated, for a rotated format)."""
        if not self.quantized:
            return stored.to(dtype)
        raw = stored.contiguous().view(torch.uint8)
        if self.bits == 4:
            return _decode_int4(raw).to(dtype)
        hd = self.head_size(raw.shape[-1])
        scale = raw[..., hd:hd + SCALE_BYTES].contiguous().view(torch.float16).float()
        codes = raw[..., :hd].contiguous().view(self.storage).float()
        return (codes * scale).to(dtype)


@functools.cache
def _searched_head_size(fmt: KVFormat, row_len: int) -> int:
    """int8's and int4's inverse of `KVFormat.row_len`, which grows with the head size in
    steps: found once per row length (decode asks on every read)."""
    step = 2 if fmt.bits == 4 else 1  # int4 head sizes are even
    for hd in range(step, 2 * row_len + 1, step):
        if fmt.row_len(hd) == row_len:
            return hd
    raise ValueError(f"no head size has {fmt.name} rows of {row_len} bytes")


def int4_group(head_size: int) -> int:
    """Elements per int4 scale: 64, or the whole head where 64 does not divide it."""
    return 64 if head_size % 64 == 0 else head_size


def rotation_block(head_size: int) -> int:
    """The Hadamard transform's size: the largest power of two dividing ``head_size``
    (head sizes are even; 64, 128 and 256 rotate as one block)."""
    return head_size & -head_size


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., hd] times the block-diagonal normalized Hadamard matrix (its own inverse)."""
    hd = x.shape[-1]
    h = _hadamard(rotation_block(hd), x.dtype, str(x.device))
    blocks = x.reshape(*x.shape[:-1], hd // h.shape[0], h.shape[0])
    return (blocks @ h).reshape(x.shape)


@functools.cache
def _hadamard(n: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix over sqrt(n) (n a power of two)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n ** 0.5).to(dtype=dtype, device=device)


def _check_int4(head_size: int) -> None:
    if head_size % 2:
        raise ValueError(f"int4 KV needs an even head size, got {head_size}")


def _encode_int4(x: torch.Tensor, row_len: int) -> torch.Tensor:
    hd = x.shape[-1]
    group = int4_group(hd)
    groups = x.reshape(*x.shape[:-1], hd // group, group)
    top = groups.amax(dim=-1, keepdim=True)
    bottom = groups.amin(dim=-1, keepdim=True)
    signed_max = torch.where(top >= -bottom, top, bottom)
    scale = (signed_max / -8.0).to(torch.float16)
    inv = torch.where(scale != 0, 1.0 / scale.float(), torch.zeros_like(scale, dtype=x.dtype))
    codes = (torch.round(groups * inv).clamp_(-8, 7) + 8).to(torch.uint8).reshape(x.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = scale.squeeze(-1).contiguous().view(torch.uint8)
    spare = row_len - hd // 2 - scales.shape[-1]
    pad = torch.zeros(*scales.shape[:-1], spare, dtype=torch.uint8, device=x.device)
    return torch.cat([packed, scales, pad], dim=-1)


def _decode_int4(raw: torch.Tensor) -> torch.Tensor:
    hd = INT4.head_size(raw.shape[-1])
    group = int4_group(hd)
    packed = raw[..., : hd // 2]
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*raw.shape[:-1], hd)
    scale_bytes = raw[..., hd // 2: hd // 2 + SCALE_BYTES * (hd // group)]
    scale = scale_bytes.contiguous().view(torch.float16).float()  # [..., groups]
    values = (codes.float() - 8.0).reshape(*raw.shape[:-1], hd // group, group)
    return (values * scale.unsqueeze(-1)).reshape(*raw.shape[:-1], hd)


FLOAT32 = KVFormat("float32", torch.float32, 32, 0.0)
BFLOAT16 = KVFormat("bfloat16", torch.bfloat16, 16, 0.0)
FLOAT16 = KVFormat("float16", torch.float16, 16, 0.0)
INT8 = KVFormat("int8", torch.int8, 8, 127.0, rotated=True)
FP8 = KVFormat("fp8", torch.float8_e4m3fn, 8, 448.0, rotated=True)
INT4 = KVFormat("int4", torch.uint8, 4, 8.0, rotated=True)

_FORMATS = (FLOAT32, BFLOAT16, FLOAT16, INT8, FP8, INT4)
KV_FORMAT_NAMES = tuple(f.name for f in _FORMATS)
_BY_NAME = {f.name: f for f in _FORMATS}
_BY_STORAGE = {f.storage: f for f in _FORMATS}


def format_named(name: str) -> KVFormat:
    """The format a kv_cache_dtype names (ValueError naming the field otherwise)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"kv_cache_dtype must be one of {KV_FORMAT_NAMES}, "
                         f"got {name!r}") from None


def format_of(pool: torch.Tensor) -> KVFormat:
    """The format of a pool (or a view of it), told by its storage dtype."""
    return format_stored_as(pool.dtype)


def format_stored_as(dtype: torch.dtype) -> KVFormat:
    try:
        return _BY_STORAGE[dtype]
    except KeyError:
        raise ValueError(f"no KV format keeps its rows as {dtype}") from None
