"""int4 keys per channel over a block's tokens: how an int4 pool's key rows hold a block.

An int4 pool keeps its values as rows (kernels/kv_format.py: a token's head, a signed
float16 scale per group), but its keys per channel: each channel of a KV head takes 16
levels over the block's tokens, from that channel's own low end with its own step (KIVI's
layout for keys). Keys carry per-channel offsets (the rotary step turns them, so no fixed
shift removes them) and a few wide channels; a row's one scale spends its levels on
both, a channel's range does not. On the starter that took int4's teacher-forced KL
against float16 from 0.042 to about 0.016 nats at 0.273 of float16's bytes
(docs/BENCHMARKS.md).

A block's key rows, head size hd, ``row_len`` bytes each (the same as the value rows' so
the pool keeps one row length): bytes [0, hd / 2) are the token's codes (element 2i in the
low nibble, 2i + 1 in the high one, each 0..15); the rest of every row, ``spare = row_len -
hd / 2`` bytes (at least `spare_bytes`), strung together over the block's rows in order
(byte j in row j // spare), hold the block's parameters for that head (`param_bytes`):
the float16 M (the largest |midpoint|
of a channel) and W (the widest half-width, rounded up), then a little-endian bit string
(bit b is bit b % 8 of byte b // 8) of each channel's 6-bit midpoint code m + 31 and then
each channel's 5-bit half-width code s. Channel c decodes as

    unit = M / 31;  center = m * unit;  half = W * HALF_SCALES[s]
    step = (half + half) / 15;  low = center - half;  key = low + code * step

(float32, in that order: every reader and writer computes the same bits). A block needs
`MIN_BLOCK_SIZE` rows to hold its parameters.

Choosing the parameters takes the block's tokens, so a block filled a token at a time is
encoded again at each write from its rows' exact keys (kernels/key_stage.py keeps them for
open blocks); `encode_key_block` encodes rows 0..filled - 1 of a block from its exact keys.
Keys are Hadamard-rotated first, as every quantized row is (kv_format.rotate).
"""

from __future__ import annotations

import functools

import torch

__all__ = [
    "HALF_SCALES",
    "MIN_BLOCK_SIZE",
    "decode_key_block",
    "encode_key_block",
    "key_params",
    "param_bytes",
    "spare_bytes",
]

MID_BITS, HALF_BITS = 6, 5
MID_CODES = 2 ** (MID_BITS - 1) - 1  # m in [-31, 31]
HALF_CODES = 2 ** HALF_BITS - 1  # s in [0, 31]
LEVELS = 15  # codes 0..15: 15 steps across a channel's range
MIN_BLOCK_SIZE = 32
KEY_LAYOUT = "per-channel"  # KVFormat.key_layout, in the disk tier's fingerprint
PARAM_HEAD = 4  # M and W, float16 each
# A channel's half-width is W times one of these: 8 steps an octave below the widest.
HALF_SCALES = tuple(float(torch.tensor(2.0 ** (-s / 8), dtype=torch.float32))
                    for s in range(HALF_CODES + 1))


def param_bytes(head_size: int) -> int:
    """Bytes of a block's parameters for one KV head."""
    return PARAM_HEAD + -(-(MID_BITS + HALF_BITS) * head_size // 8)


def spare_bytes(head_size: int) -> int:
    """Bytes each key row needs beside its codes so that `MIN_BLOCK_SIZE` rows hold the
    parameters, and one byte more (a reader takes a field's bits from two bytes)."""
    return -(-(param_bytes(head_size) + 1) // MIN_BLOCK_SIZE)


@functools.cache
def _half_scales(device: str) -> torch.Tensor:
    return torch.tensor(HALF_SCALES, dtype=torch.float32, device=device)


def float16_up(x: torch.Tensor) -> torch.Tensor:
    """x >= 0 (float32) rounded up to a float16, as float32."""
    h = x.to(torch.float16)
    below = h.float() < x
    bumped = (h.view(torch.int16) + 1).view(torch.float16)
    return torch.where(below, bumped, h).float()


def channel_ranges(x: torch.Tensor, filled: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B, bs, nkv, hd] float32, filled int [B] -> (valid bool [B, bs, 1, 1]: the rows
    before ``filled``; each channel's lowest and highest value over them, [B, nkv, hd]):
    what a block codec (this one's, kv_key_centers') chooses its parameters from."""
    bs = x.shape[1]
    valid = (torch.arange(bs, device=x.device)[None, :]
             < filled.to(x.device)[:, None])[:, :, None, None]
    inf = torch.tensor(float("inf"), device=x.device)
    return valid, torch.where(valid, x, inf).amin(1), torch.where(valid, x, -inf).amax(1)


def encode_key_block(keys: torch.Tensor, filled: torch.Tensor, row_len: int) -> torch.Tensor:
    """keys [B, bs, nkv, hd] (rotated; float32 or float16; rows at and after ``filled``
    ignored), filled int [B] (1..bs) -> key rows [B, bs, nkv, row_len] uint8: rows before
    ``filled`` coded, the parameters in every row's spare bytes, later rows' codes zero."""
    blocks, bs, nkv, hd = keys.shape
    if bs < MIN_BLOCK_SIZE:
        raise ValueError(f"int4 keys need blocks of at least {MIN_BLOCK_SIZE} tokens, got {bs}")
    x = keys.float()
    valid, low_x, high_x = channel_ranges(x, filled)
    mid = (low_x + high_x) * 0.5
    half_raw = (high_x - low_x) * 0.5
    top = mid.abs().amax(-1, keepdim=True).to(torch.float16).float()  # M
    unit = top / MID_CODES
    safe = torch.where(unit > 0, unit, torch.ones_like(unit))
    m = torch.where(unit > 0, torch.round(mid / safe).clamp(-MID_CODES, MID_CODES),
                    torch.zeros_like(mid))
    center = m * unit
    need = half_raw + (mid - center).abs()
    widest = float16_up(need.amax(-1, keepdim=True))  # W
    table = _half_scales(str(x.device))
    s = (widest[..., None] * table[1:] >= need[..., None]).sum(-1)  # [B, nkv, hd]
    half = widest * table[s]
    step = (half + half) / LEVELS
    low = center - half
    safe_step = torch.where(step > 0, step, torch.ones_like(step))
    codes = torch.where(step[:, None] > 0,
                        torch.round((x - low[:, None]) / safe_step[:, None]).clamp(0, LEVELS),
                        torch.zeros_like(x))
    codes = torch.where(valid, codes, torch.zeros_like(codes)).to(torch.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)  # [B, bs, nkv, hd / 2]
    params = _pack_params(top, widest, (m + MID_CODES).to(torch.int64), s, bs * (row_len - hd // 2))
    spare = params.view(blocks, nkv, bs, row_len - hd // 2).transpose(1, 2)
    return torch.cat([packed, spare], -1)


def key_params(rows: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key rows [B, bs, nkv, row_len] -> each channel's (low, step), float32 [B, nkv, hd]."""
    blocks, bs, nkv, row_len = rows.shape
    spare = rows.view(torch.uint8)[..., head_size // 2:]  # [B, bs, nkv, spare]
    region = spare.transpose(1, 2).reshape(blocks, nkv, -1).to(torch.int64)
    top = _float16_at(region, 0)
    widest = _float16_at(region, 2)
    bits = _bits(region[..., PARAM_HEAD:])
    m = _fields(bits, 0, MID_BITS, head_size).float() - MID_CODES
    s = _fields(bits, MID_BITS * head_size, HALF_BITS, head_size)
    unit = top / MID_CODES
    center = m * unit
    half = widest * _half_scales(str(rows.device))[s]
    step = (half + half) / LEVELS
    return center - half, step


def decode_key_block(rows: torch.Tensor, head_size: int) -> torch.Tensor:
    """Key rows [B, bs, nkv, row_len] -> keys [B, bs, nkv, hd] float32 (rotated)."""
    low, step = key_params(rows, head_size)
    packed = rows.view(torch.uint8)[..., : head_size // 2]
    codes = torch.stack([packed & 0x0F, packed >> 4], -1).flatten(-2).float()
    return low[:, None] + codes * step[:, None]


def _pack_params(top: torch.Tensor, widest: torch.Tensor, mids: torch.Tensor,
                 halves: torch.Tensor, size: int) -> torch.Tensor:
    """[B, nkv, size] uint8: M and W as float16, then the bit string of the codes, zeros
    after it."""
    head = torch.cat([top.to(torch.float16), widest.to(torch.float16)], -1)
    head = head.contiguous().view(torch.uint8)  # [B, nkv, 4]
    bits = torch.cat([_to_bits(mids, MID_BITS), _to_bits(halves, HALF_BITS)], -1)
    pad = (-bits.shape[-1]) % 8
    bits = torch.nn.functional.pad(bits, (0, pad))
    weights = 2 ** torch.arange(8, device=bits.device)
    body = (bits.view(*bits.shape[:-1], -1, 8) * weights).sum(-1).to(torch.uint8)
    out = torch.zeros(*head.shape[:-1], size, dtype=torch.uint8, device=head.device)
    out[..., :PARAM_HEAD] = head
    out[..., PARAM_HEAD:PARAM_HEAD + body.shape[-1]] = body
    return out


def _to_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """[..., n] -> [..., n * width], each value's bits from the lowest."""
    shifts = torch.arange(width, device=values.device)
    return ((values[..., None] >> shifts) & 1).flatten(-2)


def _bits(region: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(8, device=region.device)
    return ((region[..., None] >> shifts) & 1).flatten(-2)


def _fields(bits: torch.Tensor, start: int, width: int, count: int) -> torch.Tensor:
    chunk = bits[..., start:start + width * count].view(*bits.shape[:-1], count, width)
    return (chunk << torch.arange(width, device=bits.device)).sum(-1)


def _float16_at(region: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 at bytes offset, offset + 1 of region [B, nkv, n] int64, as float32
    [B, nkv, 1]."""
    bits = region[..., offset] | (region[..., offset + 1] << 8)
    return bits.to(torch.int16).view(torch.float16).float()[..., None]
