"""int8 keys around their block's centers: how an int8 pool's key rows hold a block.

An int8 pool keeps its values as rows (kernels/kv_format.py: a token's head as int8 codes
and a float16 scale), and its keys as rows too, but each around its block's center: a
channel's midpoint over the block's tokens is taken away before a row's scale is chosen,
and kept once for the block. Keys carry per-channel offsets that the rotary step turns
slowly, so within a block they are nearly constant; a row's one scale spent its levels on
them. On the starter that took int8's teacher-forced KL against float16 from 0.00015 to
about 0.00008 nats and held the greedy reply float16 had kept by 0.064 nats
(docs/BENCHMARKS.md), for one byte more per row.

A block's key rows, head size hd, ``row_len`` bytes each (the value rows' length too, so
the pool keeps one row length): bytes [0, hd) are the token's int8 codes, [hd, hd + 2) its
float16 scale, the rest of every row, ``spare = row_len - hd - 2`` bytes (`spare_bytes`),
strung together over the block's rows in order (byte j in row j // spare), hold the
block's center codes for that head: byte c is channel c's int8 code m (|m| <= 127). The
centers' unit comes from M, the largest |center| rounded up to a float16, whose 16 bits
are the sign bits of rows 0..15's scales (bit j in row j: a scale is never negative, so
its sign bit is free; rows not yet written carry theirs too). Channel c of row t decodes as

    unit = M / 127;  center = m * unit;  key = center + code * |scale|

(float32, in that order). A block needs `MIN_BLOCK_SIZE` rows so that its spare bytes hold
a code per channel and its first 16 rows M.

Choosing the centers takes the block's tokens, so a block filled a token at a time is
encoded again at each write from its rows' exact keys, as int4's per-channel keys are
(kernels/key_stage.py keeps them for open blocks); `encode_key_block` encodes rows
0..filled - 1 of a block from its exact keys. Keys are Hadamard-rotated first, as every
quantized row is (kv_format.rotate).
"""

from __future__ import annotations

import torch

from kernels.kv_key_channels import channel_ranges, float16_up

__all__ = [
    "MIN_BLOCK_SIZE",
    "center_codes",
    "decode_key_block",
    "encode_key_block",
    "key_centers",
    "spare_bytes",
]

MIN_BLOCK_SIZE = 64
KEY_LAYOUT = "around-centers"  # KVFormat.key_layout, in the disk tier's fingerprint
CENTER_CODES = 127  # m in [-127, 127]
ROW_CODES = 127.0  # a row's codes in [-127, 127], as the int8 rows
SCALE_BYTES = 2
UNIT_BITS = 16  # M's float16 bits, one in each of the first 16 rows' scale signs


def spare_bytes(head_size: int) -> int:
    """Bytes each row keeps after its scale so that `MIN_BLOCK_SIZE` rows hold a center
    code per channel."""
    return -(-head_size // MIN_BLOCK_SIZE)


def encode_key_block(keys: torch.Tensor, filled: torch.Tensor, row_len: int) -> torch.Tensor:
    """keys [B, bs, nkv, hd] (rotated; float32 or float16; rows at and after ``filled``
    ignored), filled int [B] (1..bs) -> key rows [B, bs, nkv, row_len] uint8: rows before
    ``filled`` coded, the centers in every row's spare bytes, later rows' codes and
    scales zero (their scales' sign bits still carry M)."""
    blocks, bs, nkv, hd = keys.shape
    if bs < MIN_BLOCK_SIZE:
        raise ValueError(f"int8 keys need blocks of at least {MIN_BLOCK_SIZE} tokens, "
                         f"got {bs}")
    spare = row_len - hd - SCALE_BYTES
    if spare < spare_bytes(hd):
        raise ValueError(f"int8 key rows of head size {hd} need at least "
                         f"{hd + SCALE_BYTES + spare_bytes(hd)} bytes, got {row_len}")
    x = keys.float()
    valid, low, high = channel_ranges(x, filled)  # [B, bs, 1, 1], [B, nkv, hd] twice
    mid = (low + high) * 0.5
    top = float16_up(mid.abs().amax(-1, keepdim=True))  # M [B, nkv, 1]
    unit = top / CENTER_CODES
    safe = torch.where(unit > 0, unit, torch.ones_like(unit))
    m = torch.where(unit > 0, torch.round(mid / safe).clamp(-CENTER_CODES, CENTER_CODES),
                    torch.zeros_like(mid))
    center = m * unit  # [B, nkv, hd]
    rest = torch.where(valid, x - center[:, None], torch.zeros_like(x))
    scale = (rest.abs().amax(-1, keepdim=True) / ROW_CODES).to(torch.float16)
    inv = torch.where(scale > 0, 1.0 / scale.float(), torch.zeros_like(scale, dtype=x.dtype))
    codes = torch.round(rest * inv).clamp_(-ROW_CODES, ROW_CODES).to(torch.int8)
    scale_bits = scale.view(torch.int16).to(torch.int32) & 0x7FFF  # [B, bs, nkv, 1]
    top_bits = top.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF  # [B, nkv, 1]
    rows = torch.arange(bs, device=x.device)
    sign = ((top_bits[:, None] >> rows.clamp(max=UNIT_BITS - 1)[None, :, None, None]) & 1
            ) * (rows < UNIT_BITS)[None, :, None, None]
    scale_bits = scale_bits | (sign << 15)
    scale_bytes = torch.stack([scale_bits & 0xFF, scale_bits >> 8], -1).flatten(-2)
    region = torch.zeros(blocks, nkv, bs * spare, dtype=torch.uint8, device=x.device)
    region[..., :hd] = m.to(torch.int8).view(torch.uint8)
    spare_rows = region.view(blocks, nkv, bs, spare).transpose(1, 2)
    return torch.cat([codes.view(torch.uint8), scale_bytes.to(torch.uint8), spare_rows], -1)


def center_codes(rows: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key rows [B, bs, nkv, row_len] uint8 -> (m int64 [B, nkv, hd], M float32
    [B, nkv, 1])."""
    blocks, bs, nkv, row_len = rows.shape
    spare = rows[..., head_size + SCALE_BYTES:]  # [B, bs, nkv, spare]
    region = spare.transpose(1, 2).reshape(blocks, nkv, -1)[..., :head_size]
    m = region.contiguous().view(torch.int8).to(torch.int64)
    high = rows[:, :UNIT_BITS, :, head_size + 1].to(torch.int64)  # [B, 16, nkv]
    bits = ((high >> 7) << torch.arange(UNIT_BITS, device=rows.device)[None, :, None]).sum(1)
    top = bits.to(torch.int16).view(torch.float16).float()[..., None]  # [B, nkv, 1]
    return m, top


def key_centers(rows: torch.Tensor, head_size: int) -> torch.Tensor:
    """Key rows [B, bs, nkv, row_len] uint8 -> each channel's center, float32 [B, nkv, hd]."""
    m, top = center_codes(rows, head_size)
    return m.float() * (top / CENTER_CODES)


def decode_key_block(rows: torch.Tensor, head_size: int) -> torch.Tensor:
    """Key rows [B, bs, nkv, row_len] uint8 -> keys [B, bs, nkv, hd] float32 (rotated)."""
    codes = rows[..., :head_size].contiguous().view(torch.int8).float()
    scale_bits = rows[..., head_size:head_size + SCALE_BYTES].contiguous().view(torch.int16)
    scale = (scale_bits & 0x7FFF).view(torch.float16).float()  # [B, bs, nkv, 1]
    return key_centers(rows, head_size)[:, None] + codes * scale
