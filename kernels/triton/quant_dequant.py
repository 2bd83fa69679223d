"""Dequantizing GGUF-quantized weights inside Triton kernels, and for gathered rows.

A quantized [N, K] matrix is a uint8 tensor [N, K / block_size * block_bytes] of raw
llama.cpp blocks, row by row (kernels.quant.formats). `dequant_tile` turns any tile of it
into float32 registers: the caller gives each element's row (as a byte offset) and column,
broadcastable to the tile's shape, so the same helper yields a [BLOCK_N, BLOCK_K] tile for
the GEMV and a transposed [BLOCK_K, BLOCK_N] one for the tl.dot GEMM (quant_matmul.py).
The per-type helpers are in quant_blocks.py (32-weight blocks, MXFP4 among them) and
quant_kquants.py (256-weight super-blocks).

`dequantize_rows` materializes a few whole rows (embedding lookups gather the token rows
first, so only those are ever dequantized).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant.formats import QuantFormat, quant_format
from kernels.triton.quant_blocks import (
    dequant_mxfp4,
    dequant_q4_0,
    dequant_q4_1,
    dequant_q5_0,
    dequant_q5_1,
    dequant_q8_0,
)
from kernels.triton.quant_kquants import (
    dequant_q2_k,
    dequant_q3_k,
    dequant_q4_k,
    dequant_q5_k,
    dequant_q6_k,
)

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def dequant_tile(
    w_ptr,  # uint8 [N, row_bytes]: the quantized matrix
    row_off,  # int64, broadcastable to the tile: byte offset of each element's row
    kk,  # int32, broadcastable to the tile: each element's column (weight index in row)
    mask,  # bool, broadcastable to the tile: elements that exist (others come back 0)
    TYPE_ID: tl.constexpr,  # GGMLQuantizationType
    QBLOCK: tl.constexpr,  # weights per block
    QBYTES: tl.constexpr,  # bytes per block
):
    """float32 weights of the tile; the type is constexpr, so each kernel compiles only
    its own format's unpacking."""
    # Column offsets stay int32: they are below row_bytes, itself far below 2**31.
    blk = w_ptr + row_off + (kk // QBLOCK) * QBYTES  # uint8 ptr [tile]: block starts
    j = kk % QBLOCK
    if TYPE_ID == 2:
        w = dequant_q4_0(blk, j, mask)
    elif TYPE_ID == 3:
        w = dequant_q4_1(blk, j, mask)
    elif TYPE_ID == 6:
        w = dequant_q5_0(blk, j, mask)
    elif TYPE_ID == 7:
        w = dequant_q5_1(blk, j, mask)
    elif TYPE_ID == 8:
        w = dequant_q8_0(blk, j, mask)
    elif TYPE_ID == 10:
        w = dequant_q2_k(blk, j, mask)
    elif TYPE_ID == 11:
        w = dequant_q3_k(blk, j, mask)
    elif TYPE_ID == 12:
        w = dequant_q4_k(blk, j, mask)
    elif TYPE_ID == 13:
        w = dequant_q5_k(blk, j, mask)
    elif TYPE_ID == 39:
        w = dequant_mxfp4(blk, j, mask)
    else:
        tl.static_assert(TYPE_ID == 14, "unsupported GGUF block type")
        w = dequant_q6_k(blk, j, mask)
    return w


@triton.jit
def tile_product(
    acc,  # fp32 [BLOCK_M, BLOCK_N]
    a,  # [BLOCK_M, BLOCK_K] activations (masked lanes 0), in their dtype
    w_ptr,  # uint8 [N, row_bytes]
    row_off,  # int64 [BLOCK_N]: each output column's row of W, as a byte offset
    kk,  # int32 [BLOCK_K]
    n_mask,
    k_mask,
    DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    TYPE_ID: tl.constexpr,
    QBLOCK: tl.constexpr,
    QBYTES: tl.constexpr,
):
    """acc + a @ W[rows, kk].T with the W tile dequantized in registers: tl.dot on the
    tile built transposed ([BLOCK_K, BLOCK_N], cast to a's dtype: tensor-core inputs for
    16-bit a) when DOT, else the [BLOCK_M, BLOCK_N, BLOCK_K] broadcast product in float32
    reduced over K on the CUDA cores (the GEMVs, below tl.dot's 16 rows)."""
    if DOT:
        w = dequant_tile(w_ptr, row_off[None, :], kk[:, None],
                         k_mask[:, None] & n_mask[None, :],
                         TYPE_ID, QBLOCK, QBYTES)  # fp32 [BLOCK_K, BLOCK_N]
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=DOT_PRECISION)
    else:
        w = dequant_tile(w_ptr, row_off[:, None], kk[None, :],
                         n_mask[:, None] & k_mask[None, :],
                         TYPE_ID, QBLOCK, QBYTES)  # fp32 [BLOCK_N, BLOCK_K]
        acc += tl.sum(w[None, :, :] * a.to(tl.float32)[:, None, :], axis=2)
    return acc


def check_quantized(qweight: torch.Tensor, type_id: int, n: int | None,
                    k: int) -> tuple[QuantFormat, torch.Tensor]:
    """The format, and qweight as the kernels read it (contiguous rows, 2-byte aligned for
    the fp16 loads); ValueError naming the bad argument."""
    fmt = quant_format(type_id)
    if fmt is None:
        raise ValueError(f"type_id {type_id} is not a supported GGUF block type")
    if k <= 0 or k % fmt.block_size:
        raise ValueError(f"k ({k}) must be a positive multiple of the {fmt.name} block "
                         f"size {fmt.block_size}")
    row_bytes = fmt.row_bytes(k)
    if (qweight.dtype != torch.uint8 or qweight.dim() != 2 or qweight.shape[1] != row_bytes
            or (n is not None and qweight.shape[0] != n)):
        rows = "R" if n is None else str(n)
        raise ValueError(f"qweight must be uint8 [{rows}, {row_bytes}] ({fmt.name}, "
                         f"k={k}), got {qweight.dtype} {list(qweight.shape)}")
    if qweight.stride(1) != 1 or (qweight.shape[0] > 1 and qweight.stride(0) != row_bytes):
        qweight = qweight.contiguous()
    if qweight.data_ptr() % 2:
        qweight = qweight.clone()  # a view at an odd byte would misalign every fp16
    return fmt, qweight


@triton.jit
def _dequant_rows_kernel(
    w_ptr,  # uint8 [R, row_bytes]
    out_ptr,  # [R, K] in the output dtype
    K,
    row_bytes,
    TYPE_ID: tl.constexpr,
    QBLOCK: tl.constexpr,
    QBYTES: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)  # int32 [BLOCK_K]
    k_mask = kk < K
    w = dequant_tile(w_ptr, row * row_bytes, kk, k_mask, TYPE_ID, QBLOCK, QBYTES)
    tl.store(out_ptr + row * K + kk, w.to(out_ptr.dtype.element_ty), mask=k_mask)


def dequantize_rows(qweight: torch.Tensor, type_id: int, k: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[R, k] weights of the R quantized rows qweight (uint8 [R, row_bytes]), in dtype.
    float32 equals gguf.quants.dequantize; a 16-bit dtype is that rounded once."""
    fmt, qweight = check_quantized(qweight, type_id, None, k)
    if dtype not in OUT_DTYPES:
        raise ValueError(f"dtype must be one of {OUT_DTYPES}, got {dtype}")
    rows = qweight.shape[0]
    out = torch.empty((rows, k), dtype=dtype, device=qweight.device)
    if rows == 0:
        return out
    block_k = min(1024, triton.next_power_of_2(k))
    grid = (rows, triton.cdiv(k, block_k))
    _dequant_rows_kernel[grid](qweight, out, k, fmt.row_bytes(k), TYPE_ID=type_id,
                               QBLOCK=fmt.block_size, QBYTES=fmt.block_bytes,
                               BLOCK_K=block_k)
    return out
