"""KV-cache writes and block moves (Triton): write at a slot mapping, copy-on-write
block copies, and swapping blocks between the device pool and the host pool.

A quantized pool (kernels/kv_format.py) is written by kernels/triton/kv_quant.py's
quantizing kernel and moved as bytes: a block's rows go where they go as they are. An int8
or int4 pool's key rows are encoded a block at a time (`KVFormat.keys_by_block`), so
`write_kv` writes only its values; the key stage encodes the keys."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kv_format import format_of
from kernels.triton.kv_quant import as_bytes, write_kv_quantized

COPY_CHUNK = 2048  # elements one copy program moves


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [num_tokens, nkv, hd]
    value_ptr,  # [num_tokens, nkv, hd]
    k_cache_ptr,  # [num_blocks, block_size, nkv, hd]
    v_cache_ptr,  # [num_blocks, block_size, nkv, hd] (same strides as k_cache)
    slot_ptr,  # int64 [num_tokens]: block_id * block_size + offset, -1 = skip
    stride_kt, stride_kh,
    stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NKV: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NKV_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    keep = slot >= 0
    # A skipped token still computes an address: clamp it so it stays inside the pool.
    slot = tl.where(keep, slot, 0)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, NKV_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    heads = tl.where(keep, NKV, 0)  # a skipped token masks every head
    mask = (offs_h < heads)[:, None] & (offs_d < HEAD_SIZE)[None, :]
    dst = block * stride_cb + offset * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :]
    k = tl.load(key_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :],
                mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(value_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :],
                mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _copy_blocks_kernel(
    src_ptr,  # [L, 2, src_blocks, block_size, nkv, hd], each block contiguous
    dst_ptr,  # [L, 2, dst_blocks, block_size, nkv, hd], each block contiguous (may be src)
    src_ids_ptr,  # int64 [n]
    dst_ids_ptr,  # int64 [n]
    stride_src_layer, stride_src_kv, stride_src_block,
    stride_dst_layer, stride_dst_kv, stride_dst_block,
    BLOCK_NUMEL: tl.constexpr,  # block_size * nkv * hd
    CHUNK: tl.constexpr,
):
    pair = tl.program_id(0).to(tl.int64)
    layer_kv = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2).to(tl.int64)
    layer = layer_kv // 2
    kv = layer_kv % 2
    src_block = tl.load(src_ids_ptr + pair).to(tl.int64)
    dst_block = tl.load(dst_ids_ptr + pair).to(tl.int64)
    src = src_ptr + layer * stride_src_layer + kv * stride_src_kv + src_block * stride_src_block
    dst = dst_ptr + layer * stride_dst_layer + kv * stride_dst_kv + dst_block * stride_dst_block
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < BLOCK_NUMEL
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k_cache/v_cache at slot_mapping[t] = key/value[t]; slots of -1 are skipped. A
    quantized pool [num_blocks, block_size, nkv, row] gets each row's encoding
    (`KVFormat.encode`: rotated, then quantized), but for an int8 or int4 pool's keys,
    which are not written here (`KVFormat.encode_keys` over whole blocks: the key
    stage's); key is still checked against the pool's shape."""
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(f"key and value must both be [num_tokens, nkv, hd], got "
                         f"{tuple(key.shape)} and {tuple(value.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError("v_cache must have k_cache's shape and strides")
    fmt = format_of(k_cache)
    if (key.shape[1] != k_cache.shape[2]
            or fmt.row_len(key.shape[2]) != k_cache.shape[3]):
        raise ValueError(f"key heads {tuple(key.shape[1:])} do not match the cache's "
                         f"{tuple(k_cache.shape[2:])} ({fmt.name} rows)")
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping must have one entry per token ({key.shape[0]}), "
                         f"got shape {tuple(slot_mapping.shape)}")
    if key.stride(2) != 1 or value.stride(2) != 1 or k_cache.stride(3) != 1:
        raise ValueError("key, value and the caches must be contiguous in the head dimension")
    num_tokens, nkv, head_size = key.shape
    if num_tokens == 0:
        return
    if fmt.quantized:
        write_kv_quantized(key, value, k_cache, v_cache, slot_mapping)
        return
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NKV=nkv, HEAD_SIZE=head_size, BLOCK_SIZE=k_cache.shape[1],
        NKV_PAD=triton.next_power_of_2(nkv), HEAD_PAD=triton.next_power_of_2(head_size),
        num_warps=4,
    )


def _check_pool(cache: torch.Tensor, name: str) -> None:
    if cache.dim() != 6 or cache.shape[1] != 2:
        raise ValueError(f"{name} must be [num_layers, 2, num_blocks, block_size, nkv, hd], "
                         f"got {tuple(cache.shape)}")
    if not cache[0, 0, 0].is_contiguous():
        raise ValueError(f"{name} blocks must be contiguous (block_size, nkv, hd innermost)")


def _check_ids(src: torch.Tensor, dst: torch.Tensor) -> None:
    if src.dim() != 1 or src.shape != dst.shape:
        raise ValueError(f"block id lists must be 1-D and of equal length, got "
                         f"{tuple(src.shape)} and {tuple(dst.shape)}")


def _launch_copy(src_cache: torch.Tensor, dst_cache: torch.Tensor, src_ids: torch.Tensor,
                 dst_ids: torch.Tensor) -> None:
    src_cache, dst_cache = as_bytes(src_cache), as_bytes(dst_cache)
    numel = src_cache[0, 0, 0].numel()
    grid = (src_ids.shape[0], src_cache.shape[0] * 2, triton.cdiv(numel, COPY_CHUNK))
    _copy_blocks_kernel[grid](
        src_cache, dst_cache, src_ids.to(torch.int64), dst_ids.to(torch.int64),
        *src_cache.stride()[:3], *dst_cache.stride()[:3],
        BLOCK_NUMEL=numel, CHUNK=COPY_CHUNK, num_warps=4,
    )


def copy_blocks(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """kv_cache[:, :, dst[i]] = kv_cache[:, :, src[i]] in every layer (copy-on-write).

    The copies run in parallel, so no dst may also appear in src (copy-on-write targets
    are freshly allocated blocks, which holds)."""
    _check_pool(kv_cache, "kv_cache")
    _check_ids(src, dst)
    if src.shape[0] == 0:
        return
    _launch_copy(kv_cache, kv_cache, src.to(kv_cache.device), dst.to(kv_cache.device))


def swap_blocks(src_cache: torch.Tensor, dst_cache: torch.Tensor, src_ids: torch.Tensor,
                dst_ids: torch.Tensor) -> None:
    """dst_cache[:, :, dst_ids[i]] = src_cache[:, :, src_ids[i]]; one side is usually the
    host pool.

    Between a CUDA pool and the host pool this uses torch's gather / copy / index_copy_:
    a Triton kernel can only dereference device memory (or mapped pinned memory, which a
    pageable host pool is not), and the DMA engines do the host link at full speed. Two
    pools on one device use the Triton block-copy kernel."""
    _check_pool(src_cache, "src_cache")
    _check_pool(dst_cache, "dst_cache")
    _check_ids(src_ids, dst_ids)
    if src_cache.shape[:2] != dst_cache.shape[:2] or src_cache.shape[3:] != dst_cache.shape[3:]:
        raise ValueError(f"pools differ in more than the block count: {tuple(src_cache.shape)} "
                         f"vs {tuple(dst_cache.shape)}")
    if src_cache.dtype != dst_cache.dtype:
        raise ValueError(f"pool dtypes differ: {src_cache.dtype} vs {dst_cache.dtype}")
    if src_ids.shape[0] == 0:
        return
    if src_cache.device == dst_cache.device:
        _launch_copy(src_cache, dst_cache, src_ids.to(src_cache.device),
                     dst_ids.to(dst_cache.device))
        return
    # Gather on the source side so the host link carries one contiguous transfer. The
    # copies are blocking: a non-blocking device-to-host copy would let index_copy_ read
    # the host buffer before the DMA finished.
    # (Quantized pools as bytes: torch has no index_copy_ for float8.)
    src_bytes, dst_bytes = as_bytes(src_cache), as_bytes(dst_cache)
    gathered = src_bytes.index_select(2, src_ids.to(src_cache.device, torch.int64))
    moved = gathered.to(dst_cache.device)
    dst_bytes.index_copy_(2, dst_ids.to(dst_cache.device, torch.int64), moved)
