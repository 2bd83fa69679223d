"""Key blocks encoded in Triton, one program per (block, KV head), writing a block's key
rows into an int8 or int4 pool: kernels/kv_key_centers.py's `encode_key_block` (int8) and
kernels/kv_key_channels.py's (int4).

int8: the program takes the block's keys ROWS rows at a time, twice: once for each
channel's low and high over the filled rows (whence the centers and M), once for each
row's residual from the centers, its scale (M's bits in the first 16 rows' sign bits) and
its codes. A tile of rows is never the whole block, so a long block costs no registers,
and the centers' bytes are stored channel by channel where they go (`center_offsets`).
Any head size.

int4: the program holds the block's keys as two [tokens, head / 8, 4] tiles, the even and
the odd channels of each run of eight: a run's eight 6-bit midpoint codes are six whole
bytes of the parameter bit string and its eight 5-bit half-width codes five, and its even
and odd channels' code nibbles pair into its four code bytes, so every byte is assembled
from values the program already holds (no gather across channels, no scratch memory). The
head size must be a multiple of 8.

Every value is computed as the reference computes it, in float32 and in its order:
correctly rounded divisions (div_rn), round half to even, float16 conversions rounding to
nearest (a row's scale, int4's M) and up (int8's M, int4's W), and no fused multiply-add
(the launch turns fusion off), so the bytes are the reference's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import kv_key_centers as centers
from kernels import kv_key_channels as channels
from kernels.kv_format import format_of
from kernels.triton.kv_quant import (
    _half_scale,
    _round_half_even,
    as_bytes,
    center_offsets,
    int4_key_spare,
    int8_spare,
)

_MID_BITS = tl.constexpr(channels.MID_BITS)
_HALF_BITS = tl.constexpr(channels.HALF_BITS)
_MID_CODES = tl.constexpr(float(channels.MID_CODES))
_LEVELS = tl.constexpr(float(channels.LEVELS))
_PARAM_HEAD = tl.constexpr(channels.PARAM_HEAD)
_SCALES = tl.constexpr(channels.HALF_CODES + 1)
_CENTER_CODES = tl.constexpr(float(centers.CENTER_CODES))
_ROW_CODES = tl.constexpr(float(centers.ROW_CODES))
_UNIT_BITS = tl.constexpr(centers.UNIT_BITS)
_INT8_TILE = 4096  # int8: keys per tile of rows (ROWS * HEAD_PAD)


@triton.jit
def _float16_up(x):
    """x >= 0 (fp32) rounded up to a float16, as fp32 (kv_key_channels.float16_up)."""
    h = x.to(tl.float16)
    bumped = (h.to(tl.int16, bitcast=True) + 1).to(tl.float16, bitcast=True)
    return tl.where(h.to(tl.float32) < x, bumped, h).to(tl.float32)


@triton.jit
def _channel_stats(x, valid, g_mask):
    """x fp32 [BS_PAD, G_PAD, 4] -> each channel's (mid, half_raw) over the valid rows,
    [G_PAD, 4], 0 for padded channels."""
    # A padded channel has no valid row: 0 rather than inf - inf.
    low_x = tl.where(g_mask, tl.min(tl.where(valid, x, float("inf")), 0), 0.0)
    high_x = tl.where(g_mask, tl.max(tl.where(valid, x, float("-inf")), 0), 0.0)
    return (low_x + high_x) * 0.5, (high_x - low_x) * 0.5


@triton.jit
def _midpoint(mid, unit):
    """Midpoint codes m in [-31, 31] (fp32) of mid [G_PAD, 4] in steps of unit."""
    safe = tl.where(unit > 0, unit, 1.0)
    m = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(mid, safe)), -_MID_CODES),
                   _MID_CODES)
    return tl.where(unit > 0, m, 0.0)


@triton.jit
def _half_code(need, widest, g_mask):
    """Half-width codes s [G_PAD, 4] (int32): how many of HALF_SCALES[1:] times widest
    still cover need, as the reference counts them."""
    k = tl.arange(0, _SCALES)  # [32]
    covers = (widest * _half_scale(k))[None, None, :] >= need[:, :, None]
    covers = covers & (k >= 1)[None, None, :]
    return tl.where(g_mask, tl.sum(covers.to(tl.int32), 2), 0)


@triton.jit
def _codes(x, valid, center, half):
    """uint8 [BS_PAD, G_PAD, 4] codes 0..15 of x over [center - half, center + half]
    (0 for rows past filled), and the step and low of each channel."""
    step = tl.math.div_rn(half + half, _LEVELS)
    low = center - half
    safe = tl.where(step > 0, step, 1.0)
    # A row past filled gets code 0 here, before the division: its x (0) over a narrow
    # channel's step would overflow.
    diff = tl.where(valid, x - low[None, :, :], 0.0)
    q = _round_half_even(tl.math.div_rn(diff, safe[None, :, :]))
    q = tl.minimum(tl.maximum(q, 0.0), _LEVELS)
    q = tl.where((step > 0)[None, :, :], q, 0.0)
    return q.to(tl.uint8)


@triton.jit
def _store_region(rows, j, value, mask, stride_slot, HEAD_SIZE: tl.constexpr):
    """Bytes value (int) at bytes j (int32) of the parameter region of the block whose row
    0 is `rows`: byte j is in row j // spare, at HEAD_SIZE / 2 + j % spare."""
    spare: tl.constexpr = int4_key_spare(HEAD_SIZE)
    off = (j // spare).to(tl.int64) * stride_slot + (HEAD_SIZE // 2 + j % spare)
    tl.store(rows + off, (value & 0xFF).to(tl.uint8), mask=mask)


@triton.jit
def _encode_key_block_kernel(
    key_ptr,  # [n, bs, nkv, hd] float, rotated
    filled_ptr,  # int [n]: rows 0..filled - 1 of each block are keys
    block_ptr,  # int64 [n]: each block's id in the pool
    cache_ptr,  # uint8 [num_blocks, bs, nkv, row]: an int4 pool's K view
    stride_kb, stride_kt, stride_kh,
    stride_cb, stride_cs, stride_ch,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BS_PAD: tl.constexpr,  # next_power_of_2(BLOCK_SIZE)
    G_PAD: tl.constexpr,  # next_power_of_2(HEAD_SIZE // 8)
    SPARE_PAD: tl.constexpr,  # next_power_of_2(the spare bytes of a row)
):
    i = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    filled = tl.load(filled_ptr + i)
    rows = cache_ptr + tl.load(block_ptr + i).to(tl.int64) * stride_cb + head * stride_ch
    offs_r = tl.arange(0, BS_PAD)
    offs_g = tl.arange(0, G_PAD)
    offs_p = tl.arange(0, 4)
    r3 = offs_r[:, None, None]
    g_mask = (offs_g < HEAD_SIZE // 8)[:, None]  # [G_PAD, 1]
    valid = (r3 < filled) & g_mask[None, :, :]  # [BS_PAD, G_PAD, 1]
    # Channel 8g + 2p (even) and 8g + 2p + 1 (odd). [BS_PAD, G_PAD, 4]
    channel = 8 * offs_g[None, :, None] + 2 * offs_p[None, None, :]
    src = key_ptr + i * stride_kb + head * stride_kh + r3.to(tl.int64) * stride_kt + channel
    # Rows past filled read as 0: the caller's rows there are whatever its buffer held
    # (an inf there made the interpreter warn of inf - inf, masked out after).
    x_even = tl.load(src, mask=valid, other=0.0).to(tl.float32)
    x_odd = tl.load(src + 1, mask=valid, other=0.0).to(tl.float32)

    mid_e, half_raw_e = _channel_stats(x_even, valid, g_mask)  # [G_PAD, 4]
    mid_o, half_raw_o = _channel_stats(x_odd, valid, g_mask)
    top = tl.maximum(tl.max(tl.max(tl.abs(mid_e), 1), 0), tl.max(tl.max(tl.abs(mid_o), 1), 0))
    top16 = top.to(tl.float16)  # M, rounded to nearest
    unit = tl.math.div_rn(top16.to(tl.float32), _MID_CODES)
    m_e = _midpoint(mid_e, unit)
    m_o = _midpoint(mid_o, unit)
    center_e = m_e * unit
    center_o = m_o * unit
    need_e = tl.where(g_mask, half_raw_e + tl.abs(mid_e - center_e), 0.0)
    need_o = tl.where(g_mask, half_raw_o + tl.abs(mid_o - center_o), 0.0)
    widest = _float16_up(tl.maximum(tl.max(tl.max(need_e, 1), 0), tl.max(tl.max(need_o, 1), 0)))
    s_e = _half_code(need_e, widest, g_mask)
    s_o = _half_code(need_o, widest, g_mask)
    codes_e = _codes(x_even, valid, center_e, widest * _half_scale(s_e))
    codes_o = _codes(x_odd, valid, center_o, widest * _half_scale(s_o))

    # Code bytes: byte 4g + p of a row holds channels 8g + 2p (low) and 8g + 2p + 1.
    code_mask = (r3 < BLOCK_SIZE) & g_mask[None, :, :]
    tl.store(rows + r3.to(tl.int64) * stride_cs + 4 * offs_g[None, :, None]
             + offs_p[None, None, :], codes_e | (codes_o << 4), mask=code_mask)

    # M and W, little-endian float16s: region bytes 0..3.
    offs_h = tl.arange(0, 4)
    m_bits = top16.to(tl.uint16, bitcast=True).to(tl.int32)
    w_bits = widest.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.int32)
    head_bytes = tl.where(offs_h < 2, m_bits, w_bits) >> (8 * (offs_h % 2))
    _store_region(rows, offs_h, head_bytes, offs_h < 4, stride_cs, HEAD_SIZE)
    # A run of eight channels: 48 bits of midpoint codes (m + 31), six bytes from region
    # byte 4 + 6g, and 40 bits of half-width codes, five bytes after all the midpoints.
    shift = 2 * offs_p[None, :]  # [1, 4]: channel 2p's place among the run's eight
    mids = (tl.sum((m_e + _MID_CODES).to(tl.int64) << (shift * _MID_BITS).to(tl.int64), 1)
            + tl.sum((m_o + _MID_CODES).to(tl.int64) << ((shift + 1) * _MID_BITS).to(tl.int64),
                     1))  # [G_PAD]
    halves = (tl.sum(s_e.to(tl.int64) << (shift * _HALF_BITS).to(tl.int64), 1)
              + tl.sum(s_o.to(tl.int64) << ((shift + 1) * _HALF_BITS).to(tl.int64), 1))
    offs_u = tl.arange(0, 8)[None, :]  # byte u of a run's bits
    run = offs_g[:, None] < HEAD_SIZE // 8
    _store_region(rows, 6 * offs_g[:, None] + offs_u + _PARAM_HEAD,
                  mids[:, None] >> (8 * offs_u).to(tl.int64), run & (offs_u < 6), stride_cs,
                  HEAD_SIZE)
    _store_region(rows, 5 * offs_g[:, None] + offs_u + (_PARAM_HEAD + 6 * (HEAD_SIZE // 8)),
                  halves[:, None] >> (8 * offs_u).to(tl.int64), run & (offs_u < 5), stride_cs,
                  HEAD_SIZE)
    # Zeros after the bit string, to the end of the block's last row.
    spare: tl.constexpr = int4_key_spare(HEAD_SIZE)
    offs_c = tl.arange(0, SPARE_PAD)
    j = offs_r[:, None] * spare + offs_c[None, :]  # [BS_PAD, SPARE_PAD]
    end = _PARAM_HEAD + 11 * (HEAD_SIZE // 8)
    tail = (offs_r[:, None] < BLOCK_SIZE) & (offs_c[None, :] < spare) & (j >= end)
    tl.store(rows + offs_r[:, None].to(tl.int64) * stride_cs + HEAD_SIZE // 2 + offs_c[None, :],
             tl.zeros([BS_PAD, SPARE_PAD], dtype=tl.uint8), mask=tail)


@triton.jit
def _encode_int8_key_block_kernel(
    key_ptr,  # [n, bs, nkv, hd] float, rotated
    filled_ptr,  # int [n]: rows 0..filled - 1 of each block are keys
    block_ptr,  # int64 [n]: each block's id in the pool
    cache_ptr,  # uint8 [num_blocks, bs, nkv, row]: an int8 pool's K view, as bytes
    stride_kb, stride_kt, stride_kh,
    stride_cb, stride_cs, stride_ch,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,  # next_power_of_2(HEAD_SIZE)
    ROWS: tl.constexpr,  # rows per tile (a power of two)
    SPARE_PAD: tl.constexpr,  # next_power_of_2(int8_spare(HEAD_SIZE))
):
    i = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    filled = tl.load(filled_ptr + i)
    rows = cache_ptr + tl.load(block_ptr + i).to(tl.int64) * stride_cb + head * stride_ch
    src = key_ptr + i * stride_kb + head * stride_kh
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD_SIZE
    offs_r = tl.arange(0, ROWS)

    # Each channel's low and high over the filled rows.
    low = tl.full([HEAD_PAD], float("inf"), tl.float32)
    high = tl.full([HEAD_PAD], float("-inf"), tl.float32)
    for r0 in range(0, filled, ROWS):
        r = r0 + offs_r
        valid = (r < filled)[:, None] & d_mask[None, :]
        x = tl.load(src + r[:, None].to(tl.int64) * stride_kt + offs_d[None, :], mask=valid,
                    other=0.0).to(tl.float32)
        low = tl.minimum(low, tl.min(tl.where(valid, x, float("inf")), 0))
        high = tl.maximum(high, tl.max(tl.where(valid, x, float("-inf")), 0))
    # The centers: codes m in steps of unit = M / 127, M the largest |midpoint| rounded
    # up to a float16. (A padded channel has no row: 0 rather than inf - inf.)
    mid = (tl.where(d_mask, low, 0.0) + tl.where(d_mask, high, 0.0)) * 0.5
    top = _float16_up(tl.max(tl.abs(mid), 0))
    unit = tl.math.div_rn(top, _CENTER_CODES)
    safe = tl.where(unit > 0, unit, 1.0)
    m = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(mid, safe)), -_CENTER_CODES),
                   _CENTER_CODES)
    m = tl.where(unit > 0, m, 0.0)
    center = m * unit
    spare: tl.constexpr = int8_spare(HEAD_SIZE)
    tl.store(rows + center_offsets(offs_d, stride_cs, HEAD_SIZE),
             m.to(tl.int8).to(tl.uint8, bitcast=True), mask=d_mask)
    top_bits = top.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.int32)

    # Every row of the block: codes and scale around the centers (0 past filled), M's bit
    # in the first 16 rows' scale signs, zeros in the spare bytes past the centers.
    offs_c = tl.arange(0, SPARE_PAD)
    for r0 in range(0, BLOCK_SIZE, ROWS):
        r = r0 + offs_r
        in_block = r < BLOCK_SIZE
        valid = (r < filled)[:, None] & d_mask[None, :]
        x = tl.load(src + r[:, None].to(tl.int64) * stride_kt + offs_d[None, :], mask=valid,
                    other=0.0).to(tl.float32)
        rest = tl.where(valid, x - center[None, :], 0.0)
        scale = tl.math.div_rn(tl.max(tl.abs(rest), 1), _ROW_CODES).to(tl.float16)  # [ROWS]
        scale_f = scale.to(tl.float32)
        inverse = tl.where(scale_f > 0,
                           tl.math.div_rn(1.0, tl.where(scale_f > 0, scale_f, 1.0)), 0.0)
        codes = tl.minimum(tl.maximum(_round_half_even(rest * inverse[:, None]), -_ROW_CODES),
                           _ROW_CODES)
        row = rows + r.to(tl.int64) * stride_cs  # [ROWS]
        tl.store(row[:, None] + offs_d[None, :], codes.to(tl.int8).to(tl.uint8, bitcast=True),
                 mask=in_block[:, None] & d_mask[None, :])
        sign = tl.where(r < _UNIT_BITS, (top_bits >> tl.minimum(r, _UNIT_BITS - 1)) & 1, 0)
        bits = (scale.to(tl.uint16, bitcast=True).to(tl.int32) & 0x7FFF) | (sign << 15)
        tl.store(row + HEAD_SIZE, (bits & 0xFF).to(tl.uint8), mask=in_block)
        tl.store(row + HEAD_SIZE + 1, (bits >> 8).to(tl.uint8), mask=in_block)
        j = r[:, None] * spare + offs_c[None, :]  # [ROWS, SPARE_PAD]: bytes of the centers
        tl.store(row[:, None] + HEAD_SIZE + 2 + offs_c[None, :],
                 tl.zeros([ROWS, SPARE_PAD], dtype=tl.uint8),
                 mask=in_block[:, None] & (offs_c < spare)[None, :] & (j >= HEAD_SIZE))


def encode_key_blocks(keys: torch.Tensor, filled: torch.Tensor, k_cache: torch.Tensor,
                      block_ids: torch.Tensor) -> None:
    """k_cache[block_ids[i]] = the key rows of keys[i] by the pool's codec (`KVFormat.
    encode_key_block`: rows 0..filled[i] - 1 coded from their exact keys, later rows'
    codes zero, the block's part in every row's spare bytes).

    keys [n, bs, nkv, hd] float32 / float16 / bfloat16, rotated (kv_format.rotate);
    filled int [n] (1..bs); k_cache an int8 or int4 pool's [num_blocks, bs, nkv, row] K
    view; block_ids int [n], distinct. int4 takes head sizes divisible by 8, int8 any."""
    fmt = format_of(k_cache)
    if not fmt.keys_by_block:
        raise ValueError(f"encode_key_blocks writes the key blocks of int8 and int4 pools, "
                         f"got a {fmt.name} pool")
    n, bs, nkv, hd = keys.shape
    int4 = fmt.bits == 4
    if int4 and hd % 8:
        raise ValueError(f"encode_key_blocks needs a head size divisible by 8 for int4, "
                         f"got {hd}")
    if bs < fmt.min_block_size:
        raise ValueError(f"{fmt.name} keys need blocks of at least {fmt.min_block_size} "
                         f"tokens, got {bs}")
    if k_cache.shape[1:] != (bs, nkv, fmt.row_len(hd)) or k_cache.stride(3) != 1:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} does not hold blocks of keys "
                         f"{tuple(keys.shape[1:])} in {fmt.name} rows")
    if filled.shape != (n,) or block_ids.shape != (n,):
        raise ValueError("filled and block_ids need one entry per block")
    if keys.stride(3) != 1:
        raise ValueError("keys must be contiguous in the head dimension")
    if n == 0:
        return
    cache = as_bytes(k_cache)
    strides = (keys.stride(0), keys.stride(1), keys.stride(2),
               cache.stride(0), cache.stride(1), cache.stride(2))
    if not int4:
        head_pad = triton.next_power_of_2(hd)
        rows = min(triton.next_power_of_2(bs), max(1, _INT8_TILE // head_pad))
        _encode_int8_key_block_kernel[(n, nkv)](
            keys, filled, block_ids.to(torch.int64), cache, *strides,
            HEAD_SIZE=hd, BLOCK_SIZE=bs, HEAD_PAD=head_pad, ROWS=rows,
            SPARE_PAD=triton.next_power_of_2(int8_spare(hd)),
            num_warps=4,
            # No fused multiply-add: every product is rounded before its sum, as in torch.
            enable_fp_fusion=False,
        )
        return
    _encode_key_block_kernel[(n, nkv)](
        keys, filled, block_ids.to(torch.int64), cache, *strides,
        HEAD_SIZE=hd, BLOCK_SIZE=bs, BS_PAD=triton.next_power_of_2(bs),
        G_PAD=triton.next_power_of_2(hd // 8),
        SPARE_PAD=triton.next_power_of_2(fmt.row_len(hd) - hd // 2),
        num_warps=4,
        # No fused multiply-add: every product is rounded before its sum, as in torch.
        enable_fp_fusion=False,
    )
