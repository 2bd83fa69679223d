"""Quantized KV pools in Triton: the write kernel that quantizes a step's keys and values
into an int8, fp8 or int4 pool, and the tile helpers through which the attention kernels
(decode, prefill, shared-prefix) read any pool, dequantizing in registers.

What a row holds is kernels/kv_format.py's to say (its `encode` / `decode` /
`decode_keys` are the oracle of every test here). The kernels see a quantized pool as
bytes (`as_bytes`) and its format as the constexpr KV_FORMAT (`format_code`): codes at row
offsets 0.., float16 scales as two little-endian bytes after them, read back as uint16 and
bitcast.

Reading: an 8-bit row's one scale factors out of a dot product, so a K tile's codes go
into the dot as they are and the scale multiplies the [rows, tokens] scores; a V tile's
scale multiplies the softmax weights before their dot. An int4 value row has a scale per
group of elements, so its tile is dequantized whole before the dot. Codes convert exactly
to float16 / bfloat16 (|int8| <= 127, e4m3 has 3 mantissa bits), so the dots run in the
query's dtype with fp32 accumulation, as on a float pool.

Keys encoded a block at a time read their block's part from the spare bytes of the
block's rows (for the KV head). A tile may start anywhere in a block (a window, a split, a
shared prefix's end) and span several blocks, so those are read per token; tokens of one
block read the same bytes, which the cache serves.

- int8 (kernels/kv_key_centers.py): a key is center + code * |scale|, the center m * unit
  with m the block's int8 code for the channel and unit = M / 127, M's 16 bits the sign
  bits of the scales of the block's rows 0..15 (so a row's scale is read without its
  sign). The center is a dot too: q . k = |scale| (q . codes) + unit (q . m), both dots
  over exact integers in the query's dtype, so a large center costs no precision (a
  decoded key rounded to bfloat16 would lose its low bits to the center's).
- int4 (kernels/kv_key_channels.py): per channel, low + code * step. The divisions are
  correctly rounded (div_rn, as torch's) and a half-width scale is a power of two times
  one of eight float32 constants, so each channel's low and step are the encoder's bits;
  the key itself may take a fused multiply-add on a GPU, below the query dtype's rounding
  that it goes through before the dot.

Writing (values, and fp8's keys: an int8 or int4 block's key rows are encoded together by
the key stage, kernels/key_stage.py and kernels/triton/key_blocks.py, never here) rounds as
torch does (half to even). An int8 value row is as long as a key row: zeros after its
scale. fp8 is rounded here to a representable e4m3 value before the conversion: Triton's
interpreter converts fp32 to e4m3 without carrying a rounding overflow into the exponent
(31.6 becomes 16), and a conversion of a value already representable is exact on every
path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import kv_format
from kernels import kv_key_centers as centers
from kernels import kv_key_channels as channels
from kernels.kv_format import format_of, int4_group

PLAIN, INT8, FP8, INT4 = 0, 1, 2, 3  # KV_FORMAT
_INT8 = tl.constexpr(INT8)
_FP8 = tl.constexpr(FP8)
_INT4 = tl.constexpr(INT4)
_CODES = {"int8": INT8, "fp8": FP8, "int4": INT4}

# The int8 key block's centers (kernels/kv_key_centers.py).
_CENTER_CODES = tl.constexpr(float(centers.CENTER_CODES))
_UNIT_BITS = tl.constexpr(centers.UNIT_BITS)

# The int4 key block's parameter fields (kernels/kv_key_channels.py).
_PARAM_BITS = tl.constexpr(8 * channels.PARAM_HEAD)  # the bit string starts after M and W
_MID_BITS = tl.constexpr(channels.MID_BITS)
_HALF_BITS = tl.constexpr(channels.HALF_BITS)
_MID_ONES = tl.constexpr(2**channels.MID_BITS - 1)
_HALF_ONES = tl.constexpr(2**channels.HALF_BITS - 1)
_MID_CODES = tl.constexpr(float(channels.MID_CODES))
_LEVELS = tl.constexpr(float(channels.LEVELS))
# HALF_SCALES[s] is HALF_SCALES[s % 8] (1.0 for 0) times 2 ** -(s // 8) exactly (a
# float32 times a power of two rounds the same): seven constants and an exponent stand
# for the table, without a table argument in every attention kernel.
_OCTAVE1, _OCTAVE2, _OCTAVE3, _OCTAVE4, _OCTAVE5, _OCTAVE6, _OCTAVE7 = (
    tl.constexpr(v) for v in channels.HALF_SCALES[1:8])


@triton.constexpr_function
def int4_row_len(head_size):
    """Bytes of an int4 pool's rows (key and value rows alike), as kv_format says."""
    # Triton's dependency walk refuses a kernel whose helpers name a plain function (it
    # would hash it); getattr's result it leaves alone, so kv_format stays the one place
    # that sizes a row.
    return getattr(kv_format, "INT4").row_len(head_size)  # noqa: B009


@triton.constexpr_function
def int4_key_spare(head_size):
    """Bytes after the codes in each key row: the block's parameter region is the
    concatenation of these over its rows (the row's whole tail, as the encoder lays it out,
    which may be longer than spare_bytes where the value row is the longer one)."""
    return getattr(kv_format, "INT4").row_len(head_size) - head_size // 2  # noqa: B009


@triton.constexpr_function
def int8_row_len(head_size):
    """Bytes of an int8 pool's rows (key and value rows alike), as kv_format says."""
    return getattr(kv_format, "INT8").row_len(head_size)  # noqa: B009


@triton.constexpr_function
def int8_spare(head_size):
    """Bytes after the scale in each int8 row: a key block's center codes are the
    concatenation of these over its rows (zeros in a value row and past the codes)."""
    return getattr(kv_format, "INT8").row_len(head_size) - head_size - 2  # noqa: B009


def format_code(pool: torch.Tensor) -> int:
    """The KV_FORMAT constexpr of a pool: PLAIN for a float one."""
    fmt = format_of(pool)
    return _CODES[fmt.name] if fmt.quantized else PLAIN


def as_bytes(pool: torch.Tensor) -> torch.Tensor:
    """The pool as the kernels address it: a quantized pool's bytes (the same strides, its
    element being one byte), a float pool as it is."""
    return pool.view(torch.uint8) if format_of(pool).quantized else pool


@triton.jit
def load_scale(ptrs, mask):
    """fp32 values of the float16 scales stored as two little-endian bytes at ptrs."""
    lo = tl.load(ptrs, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptrs + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _codes_8bit(raw, KV_FORMAT: tl.constexpr):
    """uint8 tile -> fp32 values of its int8 or e4m3 codes."""
    if KV_FORMAT == _FP8:
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return raw.to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _int4_values(rows, offs_d, mask, HEAD_SIZE: tl.constexpr, GROUP: tl.constexpr):
    """fp32 [BLOCK_N, HEAD_PAD] values of int4 rows: element d is byte d // 2's low
    (d even) or high nibble, minus 8, times its group's scale."""
    packed = tl.load(rows + offs_d[None, :] // 2, mask=mask, other=0)
    codes = ((packed >> ((offs_d[None, :] % 2) * 4).to(tl.uint8)) & 0xF).to(tl.float32) - 8.0
    scale = load_scale(rows + HEAD_SIZE // 2 + 2 * (offs_d[None, :] // GROUP), mask)
    return codes * scale


@triton.jit
def _region_offsets(j, stride_slot, HEAD_SIZE: tl.constexpr):
    """int64 offsets, from a block's row 0 of one KV head, of bytes j (int32) of the
    block's key parameter region: byte j is in row j // spare, at HEAD_SIZE / 2 + j % spare."""
    spare: tl.constexpr = int4_key_spare(HEAD_SIZE)
    return (j // spare).to(tl.int64) * stride_slot + (HEAD_SIZE // 2 + j % spare)


@triton.jit
def _param_field(block_rows, first_bit, mask, stride_slot, ONES: tl.constexpr,
                 HEAD_SIZE: tl.constexpr):
    """int32 fields at bits first_bit (int32) of the parameter region of the blocks at
    block_rows, ONES their width's all-ones mask (a field and its first bit's place in its
    byte within 16 bits): the two bytes from the one holding a field's first bit, little
    endian (the region keeps a byte past its last field for the second), shifted down."""
    j = first_bit >> 3
    lo = tl.load(block_rows + _region_offsets(j, stride_slot, HEAD_SIZE), mask=mask, other=0)
    hi = tl.load(block_rows + _region_offsets(j + 1, stride_slot, HEAD_SIZE), mask=mask,
                 other=0)
    both = lo.to(tl.int32) | (hi.to(tl.int32) << 8)
    return (both >> (first_bit & 7)) & ONES


@triton.jit
def _half_scale(s):
    """fp32 HALF_SCALES[s] for int32 codes s in [0, 31], exactly."""
    r = s & 7
    octave = tl.where(r == 1, _OCTAVE1, tl.where(r == 2, _OCTAVE2, tl.where(
        r == 3, _OCTAVE3, tl.where(r == 4, _OCTAVE4, tl.where(r == 5, _OCTAVE5, tl.where(
            r == 6, _OCTAVE6, tl.where(r == 7, _OCTAVE7, 1.0)))))))
    power = ((127 - (s >> 3)) << 23).to(tl.float32, bitcast=True)  # 2 ** -(s // 8)
    return octave * power


@triton.jit
def _int4_keys(k_head, tok, blk, stride_slot, offs_d, n_mask, mask, HEAD_SIZE: tl.constexpr):
    """fp32 [BLOCK_N, HEAD_PAD] keys of an int4 pool (kernels/kv_key_channels.py):
    channel d of a token is low + code * step, low and step its block's for d (0 where
    mask is off)."""
    block_rows = k_head + blk[:, None]  # [BLOCK_N, 1]: row 0 of each token's block
    # M and W: the region's first two float16s. [BLOCK_N, 1]
    head = tl.full([1, 1], 0, tl.int32)
    row_mask = n_mask[:, None]
    top = _param_field(block_rows, head, row_mask, stride_slot, 0xFFFF, HEAD_SIZE)
    top = top.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    widest = _param_field(block_rows, head + 16, row_mask, stride_slot, 0xFFFF, HEAD_SIZE)
    widest = widest.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    # Channel d's midpoint code at bit MID_BITS * d of the string, its half-width code
    # after all the midpoints. [BLOCK_N, HEAD_PAD]
    d = offs_d[None, :]
    m = _param_field(block_rows, d * _MID_BITS + _PARAM_BITS, mask, stride_slot, _MID_ONES,
                     HEAD_SIZE).to(tl.float32) - _MID_CODES
    s = _param_field(block_rows, d * _HALF_BITS + (_PARAM_BITS + _MID_BITS * HEAD_SIZE), mask,
                     stride_slot, _HALF_ONES, HEAD_SIZE)
    # The decoder's order (kv_key_channels.key_params), in float32.
    unit = tl.math.div_rn(top, _MID_CODES)
    center = m * unit
    half = widest * _half_scale(s)
    step = tl.math.div_rn(half + half, _LEVELS)
    low = center - half
    packed = tl.load(k_head + tok[:, None] + offs_d[None, :] // 2, mask=mask, other=0)
    codes = ((packed >> ((offs_d[None, :] % 2) * 4).to(tl.uint8)) & 0xF).to(tl.float32)
    return tl.where(mask, low + codes * step, 0.0)


@triton.jit
def center_offsets(c, stride_slot, HEAD_SIZE: tl.constexpr):
    """int64 offsets, from a block's row 0 of one KV head, of channel c's (int32) center
    code in an int8 key block: byte c of the centers is in row c // spare, at
    HEAD_SIZE + 2 + c % spare (after the row's codes and scale)."""
    spare: tl.constexpr = int8_spare(HEAD_SIZE)
    return (c // spare).to(tl.int64) * stride_slot + (HEAD_SIZE + 2 + c % spare)


@triton.jit
def _int8_centers(k_head, blk, stride_slot, offs_d, n_mask, mask, HEAD_SIZE: tl.constexpr):
    """An int8 pool's key centers (kernels/kv_key_centers.py) for each token of a tile:
    (m, fp32 [BLOCK_N, HEAD_PAD], the codes of its block's centers, 0 where mask is off;
    unit, fp32 [BLOCK_N], M / 127), so that channel d's center is m * unit."""
    block_rows = k_head + blk[:, None]  # [BLOCK_N, 1]: row 0 of each token's block
    # M: bit j is the sign bit of row j's scale (the high byte's bit 7). [BLOCK_N, 16]
    r = tl.arange(0, _UNIT_BITS)
    high = tl.load(block_rows + r[None, :].to(tl.int64) * stride_slot + (HEAD_SIZE + 1),
                   mask=n_mask[:, None], other=0)
    bits = tl.sum(((high >> 7) & 1).to(tl.int32) << r[None, :], 1)  # [BLOCK_N]
    top = bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    unit = tl.math.div_rn(top, _CENTER_CODES)  # the decoder's M / 127, correctly rounded
    raw = tl.load(block_rows + center_offsets(offs_d[None, :], stride_slot, HEAD_SIZE),
                  mask=mask, other=0)
    return raw.to(tl.int8, bitcast=True).to(tl.float32), unit


@triton.jit
def key_scale(ptrs, mask):
    """fp32 |scale| of an int8 key row's float16 scale at ptrs: its sign bit is one of its
    block's M bits, not the scale's."""
    return tl.abs(load_scale(ptrs, mask))


@triton.jit
def key_scores(
    q,  # [ROWS, HEAD_PAD] query tile (rotated, for a rotated pool)
    k_head,  # this KV head's K pool: elements (PLAIN) or bytes
    tok,  # int64 [BLOCK_N]: each token's row offset from k_head
    blk,  # int64 [BLOCK_N]: the offset of each token's block (its row 0) from k_head
    stride_slot,  # elements between a block's rows (int8, int4: those holding its keys' part)
    offs_d,  # int32 [HEAD_PAD]
    n_mask,  # bool [BLOCK_N]: tokens that exist
    d_mask,  # bool [HEAD_PAD]: real head dims
    qk_scale,
    KV_FORMAT: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """fp32 [ROWS, BLOCK_N] scores q . k times qk_scale (a missing token scores 0)."""
    rows = k_head + tok[:, None]
    mask = n_mask[:, None] & d_mask[None, :]
    if KV_FORMAT == _INT4:
        k = _int4_keys(k_head, tok, blk, stride_slot, offs_d, n_mask, mask,
                       HEAD_SIZE).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    elif KV_FORMAT == 0:
        k = tl.load(rows + offs_d[None, :], mask=mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    elif KV_FORMAT == _INT8:
        # q . (center + code * |scale|) = |scale| (q . codes) + unit (q . m).
        codes = _codes_8bit(tl.load(rows + offs_d[None, :], mask=mask, other=0),
                            KV_FORMAT).to(q.dtype)
        k_scale = key_scale(k_head + tok + HEAD_SIZE, n_mask) * qk_scale  # [BLOCK_N]
        m, unit = _int8_centers(k_head, blk, stride_slot, offs_d, n_mask, mask, HEAD_SIZE)
        s = tl.dot(q, tl.trans(codes), input_precision=DOT_PRECISION) * k_scale[None, :]
        s += (tl.dot(q, tl.trans(m.to(q.dtype)), input_precision=DOT_PRECISION)
              * (unit * qk_scale)[None, :])
    else:
        codes = _codes_8bit(tl.load(rows + offs_d[None, :], mask=mask, other=0),
                            KV_FORMAT).to(q.dtype)
        k_scale = load_scale(k_head + tok + HEAD_SIZE, n_mask) * qk_scale  # [BLOCK_N]
        s = tl.dot(q, tl.trans(codes), input_precision=DOT_PRECISION) * k_scale[None, :]
    return s


@triton.jit
def weighted_values(
    p,  # fp32 [ROWS, BLOCK_N] softmax weights (0 for a missing token)
    v_head,  # this KV head's V pool: elements (PLAIN) or bytes
    tok,  # int64 [BLOCK_N]
    offs_d,  # int32 [HEAD_PAD]
    n_mask,  # bool [BLOCK_N]
    d_mask,  # bool [HEAD_PAD]
    dot_dtype: tl.constexpr,  # the query's dtype
    KV_FORMAT: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """fp32 [ROWS, HEAD_PAD]: p times the tile's values (rotated, for a rotated pool)."""
    rows = v_head + tok[:, None]
    mask = n_mask[:, None] & d_mask[None, :]
    if KV_FORMAT == _INT4:
        v = _int4_values(rows, offs_d, mask, HEAD_SIZE, GROUP).to(dot_dtype)
        out = tl.dot(p.to(dot_dtype), v, input_precision=DOT_PRECISION)
    elif KV_FORMAT == 0:
        v = tl.load(rows + offs_d[None, :], mask=mask, other=0.0)
        out = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    else:
        codes = _codes_8bit(tl.load(rows + offs_d[None, :], mask=mask, other=0),
                            KV_FORMAT).to(dot_dtype)
        v_scale = load_scale(v_head + tok + HEAD_SIZE, n_mask)  # [BLOCK_N]
        out = tl.dot((p * v_scale[None, :]).to(dot_dtype), codes,
                     input_precision=DOT_PRECISION)
    return out


@triton.jit
def _round_half_even(y):
    """torch.round for |y| < 2**22: floor(y + 0.5), a tie that went to an odd number
    taken back down to the even one."""
    r = tl.floor(y + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(((r - y) == 0.5) & odd, r - 1.0, r)


@triton.jit
def _e4m3_round(y):
    """y (|y| <= 448) rounded half to even to the nearest e4m3 value, in fp32: the
    quantum is 2**(e - 3) for y's exponent e, at least 2**-9 (the subnormals')."""
    e = ((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    quantum = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((3 - e + 127) << 23).to(tl.float32, bitcast=True)
    return _round_half_even(y * inverse) * quantum


@triton.jit
def _store_scales(ptrs, scale, mask):
    """float16 scales [N] stored as two little-endian bytes each at ptrs [N]."""
    bits = scale.to(tl.uint16, bitcast=True)
    tl.store(ptrs, (bits & 0xFF).to(tl.uint8), mask=mask)
    tl.store(ptrs + 1, (bits >> 8).to(tl.uint8), mask=mask)


@triton.jit
def _quantize_row_8bit(x, row, offs_d, keep, KV_FORMAT: tl.constexpr,
                       HEAD_SIZE: tl.constexpr):
    """x fp32 [HEAD_PAD] (0 past HEAD_SIZE) into the byte row at `row`, unless not keep,
    and an int8 row's spare bytes (int8_spare, fewer than HEAD_PAD) zeroed: a value row
    (an int8 key row is its block's, kernels/triton/key_blocks.py). (Masks come from
    limits: the interpreter turns bool & scalar bool into int32.)"""
    if KV_FORMAT == _FP8:
        scale = (tl.max(tl.abs(x), 0) / 448.0).to(tl.float16)
    else:
        scale = (tl.max(tl.abs(x), 0) / 127.0).to(tl.float16)
    scale_f = scale.to(tl.float32)
    y = x * tl.where(scale_f > 0, 1.0 / tl.where(scale_f > 0, scale_f, 1.0), 0.0)
    if KV_FORMAT == _FP8:
        codes = _e4m3_round(tl.minimum(tl.maximum(y, -448.0), 448.0))
        raw = codes.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        codes = tl.minimum(tl.maximum(_round_half_even(y), -127.0), 127.0)
        raw = codes.to(tl.int8).to(tl.uint8, bitcast=True)
    tl.store(row + offs_d, raw, mask=offs_d < tl.where(keep, HEAD_SIZE, 0))
    bits = scale.to(tl.uint16, bitcast=True)
    two = tl.arange(0, 2)  # the scale's bytes, low first
    byte = tl.where(two == 0, bits & 0xFF, bits >> 8).to(tl.uint8)
    tl.store(row + HEAD_SIZE + two, byte, mask=two < tl.where(keep, 2, 0))
    if KV_FORMAT == _INT8:
        spare: tl.constexpr = int8_spare(HEAD_SIZE)
        tl.store(row + HEAD_SIZE + 2 + offs_d, tl.zeros_like(raw),
                 mask=offs_d < tl.where(keep, spare, 0))


@triton.jit
def _quantize_row_int4(src, row, keep, HEAD_SIZE: tl.constexpr, GROUP: tl.constexpr,
                       HALF_PAD: tl.constexpr, GROUPS_PAD: tl.constexpr):
    """The value row at src (HEAD_SIZE values, already rotated) into the int4 byte row at
    `row`, zeros after its scales (the row is as long as a key row): even and odd elements
    are loaded apart, so each byte's two nibbles meet without a reshape."""
    offs_i = tl.arange(0, HALF_PAD)  # byte i holds elements 2i (low) and 2i + 1 (high)
    i_mask = offs_i < HEAD_SIZE // 2
    even = tl.load(src + 2 * offs_i, mask=i_mask, other=0.0).to(tl.float32)
    odd = tl.load(src + 2 * offs_i + 1, mask=i_mask, other=0.0).to(tl.float32)
    offs_g = tl.arange(0, GROUPS_PAD)
    # [GROUPS_PAD, HALF_PAD]: byte i belongs to group 2i // GROUP (GROUP is even).
    member = (offs_g[:, None] == (2 * offs_i[None, :]) // GROUP) & i_mask[None, :]
    # q4_0's signed scale (kernels/kv_format.py): the largest-magnitude element, the
    # positive one on a tie, over -8.
    top = tl.max(tl.where(member, tl.maximum(even, odd)[None, :], float("-inf")), 1)
    bottom = tl.min(tl.where(member, tl.minimum(even, odd)[None, :], float("inf")), 1)
    signed_max = tl.where(top >= -bottom, top, bottom)
    signed_max = tl.where(offs_g < HEAD_SIZE // GROUP, signed_max, 0.0)  # padded groups
    scale = (signed_max / -8.0).to(tl.float16)  # [GROUPS_PAD]
    scale_f = scale.to(tl.float32)
    inverse = tl.where(scale_f != 0, 1.0 / tl.where(scale_f != 0, scale_f, 1.0), 0.0)
    inv_i = tl.sum(tl.where(member, inverse[:, None], 0.0), 0)  # [HALF_PAD]
    lo = tl.minimum(tl.maximum(_round_half_even(even * inv_i), -8.0), 7.0) + 8.0
    hi = tl.minimum(tl.maximum(_round_half_even(odd * inv_i), -8.0), 7.0) + 8.0
    packed = lo.to(tl.uint8) | (hi.to(tl.uint8) << 4)
    tl.store(row + offs_i, packed, mask=offs_i < tl.where(keep, HEAD_SIZE // 2, 0))
    _store_scales(row + HEAD_SIZE // 2 + 2 * offs_g, scale,
                  offs_g < tl.where(keep, HEAD_SIZE // GROUP, 0))
    # The padding is shorter than the codes (a few bytes), so HALF_PAD lanes cover it.
    tail: tl.constexpr = int4_row_len(HEAD_SIZE) - HEAD_SIZE // 2 - 2 * (HEAD_SIZE // GROUP)
    tl.store(row + HEAD_SIZE // 2 + 2 * (HEAD_SIZE // GROUP) + offs_i,
             tl.zeros([HALF_PAD], dtype=tl.uint8), mask=offs_i < tl.where(keep, tail, 0))


@triton.jit
def _write_kv_quant_kernel(
    key_ptr,  # [num_tokens, nkv, hd] float, rotated (fp8 only: the others' keys unread)
    value_ptr,  # [num_tokens, nkv, hd] float, rotated
    k_cache_ptr,  # uint8 [num_blocks, block_size, nkv, row bytes]
    v_cache_ptr,  # uint8, k_cache's strides
    slot_ptr,  # int64 [num_tokens]: block_id * block_size + offset, -1 = skip
    stride_kt, stride_kh,
    stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    KV_FORMAT: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    GROUP: tl.constexpr,  # int4: elements per scale
    HALF_PAD: tl.constexpr,  # int4: next_power_of_2(HEAD_SIZE // 2)
    GROUPS_PAD: tl.constexpr,  # int4: next_power_of_2(HEAD_SIZE // GROUP)
):
    """One program per (token, KV head) quantizes its V row, and its K row in an fp8
    pool (an int8 or int4 pool's key rows are a block's, written by the key stage)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    keep = slot >= 0
    slot = tl.where(keep, slot, 0)  # a skipped token's address stays inside the pool
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + head * stride_ch
    k_src = key_ptr + token * stride_kt + head * stride_kh
    v_src = value_ptr + token * stride_vt + head * stride_vh
    if KV_FORMAT == _INT4:
        _quantize_row_int4(v_src, v_cache_ptr + dst, keep, HEAD_SIZE, GROUP, HALF_PAD,
                           GROUPS_PAD)
    else:
        offs_d = tl.arange(0, HEAD_PAD)
        d_mask = offs_d < HEAD_SIZE
        if KV_FORMAT == _FP8:
            k = tl.load(k_src + offs_d, mask=d_mask, other=0.0).to(tl.float32)
            _quantize_row_8bit(k, k_cache_ptr + dst, offs_d, keep, KV_FORMAT, HEAD_SIZE)
        v = tl.load(v_src + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        _quantize_row_8bit(v, v_cache_ptr + dst, offs_d, keep, KV_FORMAT, HEAD_SIZE)


def write_kv_quantized(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k_cache / v_cache (a quantized pool's [num_blocks, block_size, nkv, row] views) at
    slot_mapping[t] = the format's encoding of key / value[t], as `KVFormat.encode`; an
    int8 or int4 pool's key rows are left as they are (a block's key rows are encoded
    together from the block's exact keys: `KVFormat.encode_keys`, by the key stage). Rows are
    rotated first, in torch (kv_format.rotate: the oracle's own transform; the write is a
    sliver of a step's time, so one more small matmul costs nothing worth a Hadamard
    product inside the kernel). Shapes are the caller's (cache.write_kv) to check."""
    fmt = format_of(k_cache)
    num_tokens, nkv, head_size = key.shape
    if fmt.keys_by_block:
        value = fmt.rotate(value.float())
    elif fmt.rotated:
        key, value = fmt.rotate(key.float()), fmt.rotate(value.float())
    group = int4_group(head_size)
    k_bytes, v_bytes = as_bytes(k_cache), as_bytes(v_cache)
    _write_kv_quant_kernel[(num_tokens, nkv)](
        key, value, k_bytes, v_bytes, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_bytes.stride(0), k_bytes.stride(1), k_bytes.stride(2),
        KV_FORMAT=format_code(k_cache), HEAD_SIZE=head_size, BLOCK_SIZE=k_cache.shape[1],
        HEAD_PAD=triton.next_power_of_2(head_size), GROUP=group,
        HALF_PAD=triton.next_power_of_2(max(head_size // 2, 1)),
        GROUPS_PAD=triton.next_power_of_2(max(head_size // group, 1)),
        num_warps=1 if head_size <= 128 else 2,
        # No fused multiply-add: x * inverse is rounded before its + 0.5, as in torch.
        enable_fp_fusion=False,
    )
