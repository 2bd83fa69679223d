"""Triton device helpers dequantizing the 32-weight GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, MXFP4), plus the byte/fp16 loads shared with the K-quant helpers (quant_kquants.py).

Every helper takes `blk`, a uint8 pointer tensor to the start of the block holding each
weight, `j`, the weight's index inside its block, and `mask`, all broadcastable to the
tile's shape, and returns the float32 weights in that shape. Each weight gathers its own
bytes: neighbours share them (two nibbles per byte, one scale per 16 or 32 weights), so on
the GPU the repeats are L1 hits and each block still comes from DRAM once per tile.

The arithmetic follows gguf.quants' order of float32 operations (the tests' oracle), so
dequantize_rows reproduces it exactly where the compiler does not fuse a multiply-add.
Byte layouts, from the block start (all fp16 fields sit at even offsets, and every block
size is even, so the fp16 loads are aligned):

- Q4_0 (18 B): d fp16, qs[16]; weight j is qs[j % 16] low nibble (j < 16) or high
  nibble; value d * (q - 8).
- Q4_1 (20 B): d, m fp16, qs[16]; value d * q + m.
- Q5_0 (22 B): d fp16, qh[4] (bit j of a little-endian uint32 is bit 4 of weight j),
  qs[16]; value d * (q - 16).
- Q5_1 (24 B): d, m fp16, qh[4], qs[16]; value d * q + m.
- Q8_0 (34 B): d fp16, int8 qs[32]; value q * d.
- MXFP4 (17 B): e E8M0 (one byte), qs[16] (E2M1 codes, nibbles as Q4_0); value
  2^(e - 128) * doubled E2M1 (ggml's kvalues_mxfp4 and e8m0_to_fp32_half, whose products
  are exact, so any order of operations gives gguf's result).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_u8(ptr, mask):
    """Bytes widened to int32 so that shifts by tensor amounts and the later subtractions
    cannot wrap around in uint8."""
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def load_i8(ptr, mask):
    """Signed bytes (Q8_0 quants, Q6_K scales) as float32."""
    return tl.load(ptr, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def load_f16(ptr, mask):
    """The fp16 at a uint8 pointer as float32: one 2-byte load instead of two byte loads;
    masked lanes read 0, which makes their weights 0 in every format."""
    return tl.load(ptr.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def nibble(qs_ptr, j, mask):
    """Weight j of 32 packed as two nibbles per byte: the low nibbles hold weights 0..15,
    the high nibbles 16..31 (llama.cpp's order, not byte-interleaved)."""
    return (load_u8(qs_ptr + j % 16, mask) >> (j // 16 * 4)) & 0xF


@triton.jit
def high_bit(qh_ptr, j, mask):
    """Bit j (0..31) of the 4-byte little-endian mask: byte j // 8, bit j % 8. Read per
    byte because the field is not 4-byte aligned inside a 22-byte Q5_0 block."""
    return (load_u8(qh_ptr + j // 8, mask) >> (j % 8)) & 1


@triton.jit
def dequant_q4_0(blk, j, mask):
    d = load_f16(blk, mask)
    q = nibble(blk + 2, j, mask)
    return d * (q - 8).to(tl.float32)


@triton.jit
def dequant_q4_1(blk, j, mask):
    d = load_f16(blk, mask)
    m = load_f16(blk + 2, mask)
    q = nibble(blk + 4, j, mask)
    return d * q.to(tl.float32) + m


@triton.jit
def dequant_q5_0(blk, j, mask):
    d = load_f16(blk, mask)
    q = nibble(blk + 6, j, mask) | (high_bit(blk + 2, j, mask) << 4)
    return d * (q - 16).to(tl.float32)


@triton.jit
def dequant_q5_1(blk, j, mask):
    d = load_f16(blk, mask)
    m = load_f16(blk + 2, mask)
    q = nibble(blk + 8, j, mask) | (high_bit(blk + 4, j, mask) << 4)
    return d * q.to(tl.float32) + m


@triton.jit
def dequant_q8_0(blk, j, mask):
    d = load_f16(blk, mask)
    return load_i8(blk + 2 + j, mask) * d


@triton.jit
def e8m0_half(e):
    """E8M0 byte (int32) -> 2^(e - 128) as float32, built from its bits: a normal float's
    exponent field for e >= 2, the subnormals 2^-128 and 2^-127 below."""
    bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def dequant_mxfp4(blk, j, mask):
    scale = e8m0_half(load_u8(blk, mask))
    code = nibble(blk + 1, j, mask)
    mag = code & 7
    # Doubled E2M1 magnitudes 0, 1, 2, 3, 4, 6, 8, 12: the codes themselves below 4, then
    # 2 or 3 (the mantissa bit) shifted by the exponent.
    value = tl.where(mag < 4, mag, (2 + (mag & 1)) << ((mag >> 1) - 1))
    value = tl.where(code >= 8, -value, value)
    return scale * value.to(tl.float32)
