"""Triton device helpers dequantizing the 256-weight GGUF super-blocks (Q2_K .. Q6_K).

Same contract as quant_blocks.py: `blk` points at each weight's super-block, `j` is the
weight's index in it (0..255). Quants are packed in 32-byte runs: a run of 32 bytes holds
32 consecutive-in-run weights per bit plane, so weight j's byte is chosen by j % 32 (plus
the run) and its bits by which group of 32 weights it is in. Layouts, from the block start:

- Q2_K (84 B): scales[16] (low nibble: scale, high nibble: min, per 16 weights), qs[64]
  (2 bits; run j // 128, shift 2 * ((j % 128) // 32)), d, dmin fp16;
  value d * sc * q - dmin * m.
- Q3_K (110 B): hmask[32] (bit j // 32 of byte j % 32; a clear bit subtracts 4), qs[64]
  (2 bits, as Q2_K), scales[12] (16 signed 6-bit scales: 4 low bits from bytes 0..7, 2
  high bits from bytes 8..11, minus 32), d fp16; value d * scale * q.
- Q4_K (144 B): d, dmin fp16, scales[12] (8 pairs of 6-bit scale and min, see
  scale_min), qs[128] (nibbles; run j // 64, high nibble for odd j // 32);
  value d * sc * q - dmin * m.
- Q5_K (176 B): as Q4_K with qh[32] (bit j // 32 of byte j % 32 is bit 4) before qs.
- Q6_K (210 B): ql[128] (nibbles; run of 64 bytes j // 128, high nibble for odd j // 64),
  qh[64] (2 bits, as Q2_K), int8 scales[16] (per 16 weights), d fp16;
  value d * scale * (q - 32).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton.quant_blocks import load_f16, load_i8, load_u8


@triton.jit
def two_bits(qs_ptr, j, mask):
    """Weight j's 2 bits in the Q2_K / Q3_K / Q6_K-high layout: 128 weights per 32 bytes,
    four 2-bit planes per byte."""
    return (load_u8(qs_ptr + j // 128 * 32 + j % 32, mask) >> ((j % 128) // 32 * 2)) & 3


@triton.jit
def scale_min(sc_ptr, s, mask):
    """The 6-bit (scale, min) of sub-block s (0..7) from Q4_K/Q5_K's 12 scale bytes:
    bytes 0..3 hold scales 0..3 and bytes 4..7 mins 0..3 in their low 6 bits; sub-blocks
    4..7 take their low 4 bits from the nibbles of bytes 8..11 and their top 2 bits from
    the spare top bits of bytes 0..7."""
    a = load_u8(sc_ptr + s, mask)
    b = load_u8(sc_ptr + s + 4, mask)
    c = load_u8(sc_ptr + s % 4, mask)
    low = s < 4
    sc = tl.where(low, a & 63, (b & 0xF) | ((c >> 6) << 4))
    mn = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def dequant_q2_k(blk, j, mask):
    sc = load_u8(blk + j // 16, mask)
    q = two_bits(blk + 16, j, mask)
    d = load_f16(blk + 80, mask)
    dmin = load_f16(blk + 82, mask)
    dl = d * (sc & 0xF).to(tl.float32)
    ml = dmin * (sc >> 4).to(tl.float32)
    return dl * q.to(tl.float32) - ml


@triton.jit
def dequant_q3_k(blk, j, mask):
    i = j // 16
    lo = (load_u8(blk + 96 + i % 8, mask) >> (i // 8 * 4)) & 0xF
    hi = (load_u8(blk + 104 + i % 4, mask) >> (i // 4 * 2)) & 3
    scale = ((lo | (hi << 4)) - 32).to(tl.float32)
    hbit = (load_u8(blk + j % 32, mask) >> (j // 32)) & 1
    q = two_bits(blk + 32, j, mask) - 4 + 4 * hbit
    d = load_f16(blk + 108, mask)
    return (d * scale) * q.to(tl.float32)


@triton.jit
def dequant_q4_k(blk, j, mask):
    s = j // 32
    sc, mn = scale_min(blk + 4, s, mask)
    q = (load_u8(blk + 16 + j // 64 * 32 + j % 32, mask) >> (s % 2 * 4)) & 0xF
    d = load_f16(blk, mask)
    dmin = load_f16(blk + 2, mask)
    return (d * sc) * q.to(tl.float32) - dmin * mn


@triton.jit
def dequant_q5_k(blk, j, mask):
    s = j // 32
    sc, mn = scale_min(blk + 4, s, mask)
    lo = (load_u8(blk + 48 + j // 64 * 32 + j % 32, mask) >> (s % 2 * 4)) & 0xF
    hbit = (load_u8(blk + 16 + j % 32, mask) >> s) & 1
    d = load_f16(blk, mask)
    dmin = load_f16(blk + 2, mask)
    return (d * sc) * (lo | (hbit << 4)).to(tl.float32) - dmin * mn


@triton.jit
def dequant_q6_k(blk, j, mask):
    lo = (load_u8(blk + j // 128 * 64 + j % 64, mask) >> ((j // 64) % 2 * 4)) & 0xF
    hi = two_bits(blk + 128, j, mask)
    scale = load_i8(blk + 192 + j // 16, mask)
    d = load_f16(blk + 208, mask)
    return (d * scale) * ((lo | (hi << 4)) - 32).to(tl.float32)
