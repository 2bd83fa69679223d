"""y = x @ W.T with W kept GGUF-quantized: weights are dequantized in registers, tile by
tile, and never written out.

W is uint8 [N, row_bytes] of raw llama.cpp blocks (kernels.quant.formats); x is [M, K] in
float32, bfloat16 or float16; y is [M, N] in x's dtype, accumulated in float32.

Two kernels, chosen by M:

- M <= GEMV_MAX_M (8, decode batches): a fused dequantize + GEMV. A program owns a
  BLOCK_N slice of W's rows and a range of K, dequantizes each [BLOCK_N, BLOCK_K] tile
  once and multiplies it into all M rows of x at once (a [M, BLOCK_N, BLOCK_K] broadcast
  product reduced over K on the CUDA cores), so every weight block is read exactly once
  whatever M is. Decode is bound by reading W, and with N / BLOCK_N programs too few to
  fill the GPU (N = 1024 k/v projections) K is split: each split writes float32 partial
  sums to [splits, M, N] and a plain sum reduces them.
  Up to 8 rows the broadcast product costs less than padding a tl.dot to its 16-row
  minimum; past that tensor cores win, and the tile per row shrinks too far.
- larger M (prefill): a tiled GEMM. Each program dequantizes a [BLOCK_K, BLOCK_N] tile of
  W^T in registers, casts it to x's dtype when x is 16-bit (tensor-core inputs) and
  tl.dots it with the [BLOCK_M, BLOCK_K] x tile into float32 accumulators.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.triton.quant_dequant import check_quantized, tile_product

GEMV_MAX_M = 8
MAX_SPLITS = 16
MIN_K_PER_SPLIT = 512  # shorter splits would cost more in partial sums than they add
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K] activations
    w_ptr,  # uint8 [N, row_bytes] quantized weights
    part_ptr,  # fp32 [splits, M, N] partial sums (or the [M, N] output with one split)
    M,
    N,
    K,
    row_bytes,
    stride_xm,
    k_per_split,  # a multiple of BLOCK_K
    TYPE_ID: tl.constexpr,
    QBLOCK: tl.constexpr,
    QBYTES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # int32 [BLOCK_N]
    n_mask = offs_n < N
    # N * row_bytes reaches 4e8 for an 8B model's LM head and more for bigger ones.
    row_off = offs_n.to(tl.int64) * row_bytes  # int64 [BLOCK_N]
    offs_m = tl.arange(0, BLOCK_M)  # int32 [BLOCK_M]
    m_mask = offs_m < M
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # ptr [BLOCK_M, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_lo = split * k_per_split
    for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)  # int32 [BLOCK_K]
        k_mask = kk < K
        xt = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :],
                     other=0.0)  # [BLOCK_M, BLOCK_K], x's dtype
        acc = tile_product(acc, xt, w_ptr, row_off, kk, n_mask, k_mask, False, "ieee",
                           TYPE_ID, QBLOCK, QBYTES)
    out = part_ptr + split.to(tl.int64) * M * N  # fp32 ptr: this split's [M, N] slice
    out_ptrs = out + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]  # [BLOCK_M, BLOCK_N]
    tl.store(out_ptrs, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _gemm_kernel(
    x_ptr,  # [M, K] activations
    w_ptr,  # uint8 [N, row_bytes] quantized weights
    y_ptr,  # [M, N] output, x's dtype
    M,
    N,
    K,
    row_bytes,
    stride_xm,
    TYPE_ID: tl.constexpr,
    QBLOCK: tl.constexpr,
    QBYTES: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # int32 [BLOCK_M]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # int32 [BLOCK_N]
    m_mask = offs_m < M
    n_mask = offs_n < N
    row_off = offs_n.to(tl.int64) * row_bytes  # int64 [BLOCK_N]
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # ptr [BLOCK_M, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)  # int32 [BLOCK_K]
        k_mask = kk < K
        xt = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :],
                     other=0.0)  # [BLOCK_M, BLOCK_K], x's dtype
        # Rows of W become columns of the tile: W^T's [BLOCK_K, BLOCK_N] is what the dot
        # wants, built directly instead of transposing in registers.
        acc = tile_product(acc, xt, w_ptr, row_off, kk, n_mask, k_mask, True,
                           DOT_PRECISION, TYPE_ID, QBLOCK, QBYTES)
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]  # [BLOCK_M, BLOCK_N]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def gemv_tiles(m: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): the [BLOCK_M, BLOCK_N, BLOCK_K] product is held to
    8192 elements (64 fp32 registers a thread at 4 warps), trading N for M."""
    block_m = triton.next_power_of_2(max(m, 1))
    block_k = min(128, triton.next_power_of_2(k))
    block_n = max(8, 8192 // (block_m * block_k))
    return block_m, block_n, block_k


def choose_num_splits(n: int, k: int, block_n: int, block_k: int,
                      device: torch.device) -> int:
    """Enough K splits that the GEMV's programs fill every SM about twice, each split
    at least MIN_K_PER_SPLIT long. Off CUDA programs run one after another, so splitting
    only adds work."""
    if device.type != "cuda":
        return 1
    programs = triton.cdiv(n, block_n)
    target = 2 * _sm_count(device.index if device.index is not None else 0)
    if programs >= target:
        return 1
    by_length = max(1, k // max(MIN_K_PER_SPLIT, block_k))
    return max(1, min(triton.cdiv(target, programs), by_length, MAX_SPLITS))


def quant_matmul(x: torch.Tensor, qweight: torch.Tensor, type_id: int, n: int, k: int, *,
                 num_splits: int | None = None) -> torch.Tensor:
    """x [M, k] @ W.T for the GGUF-quantized W (uint8 [n, row_bytes] of block type
    type_id): [M, n] in x's dtype. num_splits forces the GEMV's K split (tests)."""
    fmt, qweight = check_quantized(qweight, type_id, n, k)
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be 2-D [M, {k}], got {list(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"x must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    if x.device != qweight.device:
        raise ValueError(f"x is on {x.device} but qweight on {qweight.device}")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if x.stride(1) != 1:
        x = x.contiguous()
    m = x.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    consts = dict(TYPE_ID=type_id, QBLOCK=fmt.block_size, QBYTES=fmt.block_bytes)
    row_bytes = qweight.shape[1]
    if m > GEMV_MAX_M:
        block_m = min(64, max(16, triton.next_power_of_2(m)))
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, 64))
        precision = "ieee" if x.dtype == torch.float32 else "tf32"
        _gemm_kernel[grid](x, qweight, y, m, n, k, row_bytes, x.stride(0),
                           DOT_PRECISION=precision, BLOCK_M=block_m, BLOCK_N=64,
                           BLOCK_K=64, **consts)
        return y
    block_m, block_n, block_k = gemv_tiles(m, k)
    k_tiles = triton.cdiv(k, block_k)
    splits = num_splits or choose_num_splits(n, k, block_n, block_k, x.device)
    tiles_per_split = triton.cdiv(k_tiles, min(splits, k_tiles))
    splits = triton.cdiv(k_tiles, tiles_per_split)  # no split left empty
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, block_n), splits)
    _gemv_kernel[grid](x, qweight, part, m, n, k, row_bytes, x.stride(0),
                       tiles_per_split * block_k, BLOCK_M=block_m, BLOCK_N=block_n,
                       BLOCK_K=block_k, **consts)
    return y.copy_(part[0] if splits == 1 else part.sum(0))
