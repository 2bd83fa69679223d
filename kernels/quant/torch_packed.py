"""CPU products with GGUF-quantized matrices, through the weight-only ops PyTorch ships.

Two layouts, chosen by block type (`INT4_TYPES` or not):

- ``Int4Packed`` (Q4_0, Q4_1, Q4_K, and Q8_0 as two halves). These write every weight as
  ``scale_g * (q - 8) + zero_g`` for a 4-bit q and one scale and zero per group of 32
  along K, which is the formula of ``aten._weight_int4pack_mm_for_cpu``:

      Q4_0: d * (q - 8)               scale = d,       zero = 0
      Q4_1: d * q + m                 scale = d,       zero = m + 8d
      Q4_K: d*sc_j * q - dmin*m_j     scale = d*sc_j,  zero = 8*d*sc_j - dmin*m_j
      Q8_0: d * q, q = 16*hi + lo     two 4-bit matrices side by side (see split_q8_0)

  so the nibbles move over unchanged; only the scales and zeros round, from the values the
  file's fp16 fields make to bf16 (2^-9 typical, 2^-8 at most, relative). The op's
  vectorized x86 kernel takes bf16 activations and returns bf16, so products carry bf16
  rounding on top of the file's own quantization (the LM head recomputes its top logits
  in float32, engine/layers/lm_head.py). 4 bits per weight plus 2 bf16 per 32 weights:
  5 bits, the same as Q4_1, 11% more than Q4_0 and Q4_K, and for Q8_0 10 bits against its
  8.5 (the starter's embedding). The layout depends on the CPU it was packed on: it is
  built at load, never saved. Rows are read back out of it for embedding lookups
  (`unpack_packed_rows`), so a tied table is held once.

- ``Int8Rows`` (Q5_0, Q5_1 and the other K-quants). No PyTorch op multiplies those blocks,
  so they are dequantized at load and requantized to int8 with one scale per row
  (``aten._weight_int8pack_mm``): the one lossy step Folio adds, a weight moving by at most
  half a step of its row's scale (row max / 127). int8pack is fast for a few rows and slow
  for many, so prefill-sized batches multiply a float copy dequantized for that call.
  Q8_0 went this way first; on the starter its embedding alone cost 0.002 nats of mean KL
  and 1.5 points of top-1 agreement, which the two-halves layout brings back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kernels.quant.formats import BY_NAME, QuantizedTensor

INT4_TYPES = frozenset(BY_NAME[name].type_id for name in ("Q4_0", "Q4_1", "Q4_K", "Q8_0"))
GROUP = 32
ROW_MULTIPLE = 64  # the op needs 16; whole 64-row tiles keep rows() simple
PACK_ROWS = 4096  # a multiple of ROW_MULTIPLE: slices pack into whole tiles
# From this many rows on, int4pack (whose time grows with every row) loses to dequantizing
# W slice by slice and one float product: prefill chunks take that path.
INT4_OP_MAX_ROWS = 256
# Above this many rows int8pack (whose time grows with every row) loses to dequantizing
# the matrix for the call and one float product (a Llama-8B ffn_down: even at 128 rows).
INT8_OP_MAX_ROWS = 128


@dataclass(slots=True)
class Int4Packed:
    packed: torch.Tensor  # uint8 [n, k' / 2] in the op's CPU-specific layout
    scales_zeros: torch.Tensor  # bf16 [k' / 32, n, 2]
    shape: tuple[int, int]  # [n, k]
    # Q8_0 as two 4-bit matrices side by side (k' = 2k): W = W[:, :k] + W[:, k:].
    halves: bool = False

    @classmethod
    def from_blocks(cls, tensor: QuantizedTensor) -> Int4Packed:
        # Packed a slice of rows at a time: the op wants int32 values, 8 times the nibbles'
        # bytes, which for a whole embedding table would be a load-time peak of its own.
        halves = tensor.format.name == "Q8_0"
        unpack = split_q8_0 if halves else unpack_int4
        packed, scales_zeros = [], []
        for start in range(0, tensor.shape[0], PACK_ROWS):
            rows = tensor.data[start:start + PACK_ROWS]
            q, scale, zero = unpack(QuantizedTensor(tensor.type_id,
                                                    (rows.shape[0], tensor.shape[1]), rows))
            # Whole tiles of rows (see unpack_packed_rows): pad with zero-scale rows, cut
            # after the product.
            pad = -q.shape[0] % ROW_MULTIPLE
            q, scale, zero = (np.pad(a, ((0, pad), (0, 0))) for a in (q, scale, zero))
            packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                torch.from_numpy(q.astype(np.int32)), 1))
            sz = torch.from_numpy(np.stack([scale.T, zero.T], axis=-1))
            scales_zeros.append(sz.to(torch.bfloat16))
        return cls(torch.cat(packed), torch.cat(scales_zeros, dim=1).contiguous(),
                   tensor.shape, halves)

    @property
    def nbytes(self) -> int:
        return _bytes(self.packed) + _bytes(self.scales_zeros)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [m, k] -> x @ W.T [m, n] in x's dtype."""
        if x.shape[0] >= INT4_OP_MAX_ROWS:
            return self._float_matmul(x)
        xb = x.to(torch.bfloat16, memory_format=torch.contiguous_format)
        if self.halves:
            xb = torch.cat([xb, xb], dim=1)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, GROUP,
                                                         self.scales_zeros)
        if out.shape[1] != self.shape[0]:
            out = out[:, :self.shape[0]]
        return out.to(x.dtype)

    def _float_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """Prefill-sized batches: PACK_ROWS rows of W at a time dequantized and multiplied
        in x's dtype, so the float copy never exceeds one slice."""
        n = self.shape[0]
        out = x.new_empty(x.shape[0], n)
        for start in range(0, n, PACK_ROWS):
            stop = min(start + PACK_ROWS, n)
            out[:, start:stop] = F.linear(x, self._slice(start, stop, x.dtype))
        return out

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of W (all rows for None) as `dtype`: the embedding lookup."""
        if ids is None:
            return self._slice(0, self.shape[0], dtype)
        ids = ids.to(torch.int64)
        q = unpack_packed_rows(self.packed, ids)  # [t, k'] in 0..15
        return self._weights(q, self.scales_zeros[:, ids], dtype)

    def _slice(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows start:stop of W; start is a multiple of the tile height (PACK_ROWS is)."""
        padded = -(-stop // ROW_MULTIPLE) * ROW_MULTIPLE
        q = unpack_all_rows(self.packed[start:padded])[:stop - start]
        return self._weights(q, self.scales_zeros[:, start:stop], dtype)

    def _weights(self, q: torch.Tensor, scales_zeros: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
        """q uint8 [t, k'] and their scales_zeros [k' / 32, t, 2] -> W rows [t, k]."""
        t, k2 = q.shape
        sz = scales_zeros.float()
        groups = q.view(t, k2 // GROUP, GROUP).float()
        w = ((groups - 8) * sz[..., 0].t()[..., None] + sz[..., 1].t()[..., None]).view(t, k2)
        if self.halves:
            k = self.shape[1]
            w = w[:, :k] + w[:, k:]
        return w.to(dtype)


@dataclass(slots=True)
class Int8Rows:
    q: torch.Tensor  # int8 [n, k]
    scale: torch.Tensor  # bf16 [n]: row i is q[i] * scale[i]

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Rows:
        """Requantize a float [n, k] matrix, one scale per row (round to nearest)."""
        weight = weight.float()
        scale = (weight.abs().amax(dim=1) / 127).to(torch.bfloat16)
        safe = torch.where(scale == 0, torch.ones_like(scale), scale).float()
        q = torch.round(weight / safe[:, None]).clamp_(-127, 127).to(torch.int8)
        return cls(q, scale)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def nbytes(self) -> int:
        return _bytes(self.q) + _bytes(self.scale)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [m, k] -> x @ W.T [m, n] in x's dtype."""
        if x.shape[0] <= INT8_OP_MAX_ROWS:
            xb = x.to(torch.bfloat16, memory_format=torch.contiguous_format)
            return torch._weight_int8pack_mm(xb, self.q, self.scale).to(x.dtype)
        return F.linear(x, self.rows(None, x.dtype))

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of W (all rows for None) as `dtype`: the embedding lookup."""
        q, scale = (self.q, self.scale) if ids is None else (self.q[ids], self.scale[ids])
        return q.to(dtype) * scale.to(dtype)[:, None]


def unpack_int4(tensor: QuantizedTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_0 / Q4_1 / Q4_K matrix as (q uint8 [n, k] in 0..15, scale and zero float32
    [n, k / 32]) with W = scale * (q - 8) + zero per group of 32 along k."""
    n, k = tensor.shape
    fmt = tensor.format
    blocks = tensor.data.cpu().numpy().reshape(n, k // fmt.block_size, fmt.block_bytes)
    d = _f16(blocks[..., 0:2])
    if fmt.name in ("Q4_0", "Q4_1"):
        nibbles = blocks[..., -16:]
        q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)  # [n, k/32, 32]
        zero = np.zeros_like(d) if fmt.name == "Q4_0" else _f16(blocks[..., 2:4]) + 8 * d
        return q.reshape(n, k), d, zero
    if fmt.name != "Q4_K":
        raise ValueError(f"type_id {tensor.type_id} ({fmt.name}) is not a 4-bit type")
    dmin = _f16(blocks[..., 2:4])
    sc, mins = k_scale_min(blocks[..., 4:16])  # [n, k/256, 8]
    # 128 bytes: four chunks of 32, each the low then high nibbles of two sub-blocks.
    chunks = blocks[..., 16:].reshape(n, k // 256, 4, 1, 32)
    q = (chunks >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F
    scale = d[..., None] * sc
    zero = 8 * scale - dmin[..., None] * mins
    return q.reshape(n, k), scale.reshape(n, -1), zero.reshape(n, -1)


def split_q8_0(tensor: QuantizedTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_0 (W = d * q, q int8) as two 4-bit halves side by side, [n, 2k]: q = 16 * hi + lo
    with hi = q >> 4 in -8..7 (stored as hi + 8, scale 16d, zero 0) and lo = q & 15 (scale
    d, zero 8d). Both exact, so the sum is Q8_0's weight up to d's rounding to bf16."""
    n, k = tensor.shape
    blocks = tensor.data.cpu().numpy().reshape(n, k // 32, 34)
    d = _f16(blocks[..., 0:2])
    q = blocks[..., 2:].view(np.int8).reshape(n, k)
    hi = (q >> 4).astype(np.int16) + 8
    lo = (q & 0x0F).astype(np.int16)
    scale = np.concatenate([16 * d, d], axis=1)
    zero = np.concatenate([np.zeros_like(d), 8 * d], axis=1)
    return np.concatenate([hi, lo], axis=1).astype(np.uint8), scale, zero


def unpack_packed_rows(packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of the 4-bit values inside int4pack's layout, uint8 [t, k] in 0..15.

    The layout (aten's weight_to_int4pack for CPU) packs rows in tiles of `rows` (64 with
    AVX-512, 32 without): a tile is k columns of rows/2 bytes, byte j of column c holding
    row j of the tile in its low nibble and row j + rows/2 in its high one. `tile_rows`
    finds the tile height on this CPU and checks the whole layout once."""
    return _unpack_with(packed, ids, tile_rows())


def _unpack_with(packed: torch.Tensor, ids: torch.Tensor, tile: int) -> torch.Tensor:
    half_k = packed.shape[1]
    k = half_k * 2
    flat = packed.reshape(-1)
    base = (ids // tile) * (tile * half_k) + (ids % (tile // 2))  # [t]
    index = base[:, None] + torch.arange(k)[None, :] * (tile // 2)  # [t, k]
    shift = ((ids % tile) // (tile // 2) * 4).to(torch.uint8)[:, None]
    return (flat[index] >> shift) & 0x0F


def unpack_all_rows(packed: torch.Tensor) -> torch.Tensor:
    """Every row of the 4-bit values, uint8 [n, k]: the tiles of unpack_packed_rows read
    whole, by reshaping instead of gathering."""
    tile = tile_rows()
    rows, half_k = packed.shape
    tiles = packed.view(rows // tile, half_k * 2, tile // 2)  # [tiles, k, tile/2]
    nibbles = torch.stack([tiles & 0x0F, tiles >> 4], dim=1)  # [tiles, 2, k, tile/2]
    return nibbles.transpose(2, 3).reshape(rows, half_k * 2)


@functools.cache
def tile_rows() -> int:
    """The tile height of int4pack's layout on this CPU, checked by unpacking a packed
    random matrix; ValueError when the layout is not the one `unpack_packed_rows` reads."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (128, 64), generator=gen, dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    for tile in (64, 32, 16):
        if torch.equal(_unpack_with(packed, torch.arange(128), tile), q.to(torch.uint8)):
            return tile
    raise ValueError("this PyTorch's int4pack layout is not one Folio can read rows from")


def k_scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> two float32 [..., 8]: the
    first four of each are the low 6 bits of bytes 0-3 and 4-7; the last four take their
    low 4 bits from bytes 8-11 and their top 2 from the spare bits of bytes 0-7."""
    low, high, extra = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([low & 0x3F, (extra & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([high & 0x3F, (extra >> 4) | ((high >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mins.astype(np.float32)


def _f16(two_bytes: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 little-endian fp16 -> float32 [...]."""
    return np.ascontiguousarray(two_bytes).view(np.float16)[..., 0].astype(np.float32)


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
