"""Batched decode attention over the paged KV cache (Triton), with split-K.

One program per (sequence, KV head, split): the query heads of a GQA group are the rows
of one tile, so each K/V tile is loaded once for the whole group. A long context is cut
into splits (flash-decoding) whose partial outputs and base-2 log-sum-exps are merged by
a second small kernel; with one split the first kernel writes the output directly.

The helpers `paged_block_offsets`, `slot_offsets`, `attend_range`, `tanh` and
`merge_partials` are shared with the shared-prefix (cascade) decode and the prefill
kernel.

Options (kernels.interface.check_attention_options), both constexpr-specialized so that a
launch without them compiles to the plain kernel:

- SLIDING (window W): the query at position seq_len - 1 sees keys seq_len - W ..
  seq_len - 1 only (transformers' sliding_window_overlay: kv_idx > q_idx - W). The
  token loop starts at that first key, so blocks wholly before the window are never
  read, not even their block-table entries, and the split-K partition covers the
  window's W tokens only.
- SOFTCAP (c): scores become c * tanh(score * scale / c) before the softmax; qk_scale
  is then scale / c and softcap_log2 = c * log2(e) carries the scores to base 2.

Attention sinks (kernels.interface.check_sinks) join the merge kernel's denominator, so a
launch with sinks always writes partials and merges them, even with one split.

A quantized pool (int8, fp8, int4: kernels/kv_format.py) is read in place, each tile
dequantized in registers (kernels/triton/kv_quant.py, KV_FORMAT; an int8 or int4 key
tile with its blocks' centers or parameters, whichever blocks the tile spans). A quantized
pool holds rotated rows: the kernels attend in the rotated space, so the caller passes a
rotated query and rotates the output back (TritonBackend does).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernels.interface import (
    AttentionMetadata,
    check_attention_options,
    check_sinks,
    effective_window,
)
from kernels.kv_format import format_of, int4_group
from kernels.triton.kv_quant import as_bytes, format_code, key_scores, weighted_values

LOG2E = 1.4426950408889634
_NEG_TWO_LOG2E = tl.constexpr(-2.0 * LOG2E)
MAX_SPLITS = 64
MIN_TOKENS_PER_SPLIT = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def paged_block_offsets(
    bt_row_ptr,  # int32 [max_blocks]: one sequence's block table
    offs_n,  # int32 [BLOCK_N]: token positions in the sequence
    n_mask,  # bool [BLOCK_N]: positions that exist
    stride_block,  # elements between physical blocks
    BLOCK_SIZE: tl.constexpr,
):
    """int64 element offsets of each token's block: a block id times the block stride
    exceeds int32 for pools above 2**31 elements, so it is widened before multiplying."""
    block_ids = tl.load(bt_row_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    return block_ids * stride_block


@triton.jit
def slot_offsets(blk, offs_n, stride_slot, BLOCK_SIZE: tl.constexpr):
    """int64 element offsets of each token's slot, from its block's (blk, int64 [BLOCK_N])."""
    return blk + (offs_n % BLOCK_SIZE).to(tl.int64) * stride_slot


@triton.jit
def tanh(x):
    """tanh from exp2 (libdevice's tanh does not run in the interpreter): 2 sigmoid(2x) - 1,
    exactly +-1 once exp2 saturates, never NaN."""
    return 2.0 / (1.0 + tl.exp2(x * _NEG_TWO_LOG2E)) - 1.0


@triton.jit
def attend_range(
    q,  # [ROWS, HEAD_PAD] query tile, rows = query heads (of one or more sequences)
    acc,  # fp32 [ROWS, HEAD_PAD] running numerator
    m_i,  # fp32 [ROWS] running max of base-2 scores
    l_i,  # fp32 [ROWS] running denominator
    bt_row_ptr,  # int32 [max_blocks]: block table the K/V tokens are read through
    lo,  # first token position (inclusive)
    hi,  # last token position (exclusive)
    k_ptr,  # [num_blocks, block_size, nkv, row] K cache, offset to this KV head
    v_ptr,  # [num_blocks, block_size, nkv, row] V cache, offset to this KV head
    stride_block,
    stride_slot,
    offs_d,  # int32 [HEAD_PAD]
    d_mask,  # bool [HEAD_PAD]: real head dims
    qk_scale,  # softmax scale times log2(e); with SOFTCAP, scale / softcap
    softcap_log2,  # SOFTCAP: softcap times log2(e)
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    KV_FORMAT: tl.constexpr,  # kernels/triton/kv_quant.py: PLAIN, INT8, FP8, INT4
    HEAD_SIZE: tl.constexpr,
    GROUP: tl.constexpr,  # INT4: elements per scale
):
    """Online softmax over tokens [lo, hi), every row seeing every token."""
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        # An int8 or int4 pool's keys also read their block's part (blk).
        blk = paged_block_offsets(bt_row_ptr, offs_n, n_mask, stride_block, BLOCK_SIZE)
        tok = slot_offsets(blk, offs_n, stride_slot, BLOCK_SIZE)
        s = key_scores(q, k_ptr, tok, blk, stride_slot, offs_d, n_mask, d_mask, qk_scale,
                       KV_FORMAT, HEAD_SIZE, GROUP, DOT_PRECISION)
        if SOFTCAP:  # c * tanh(score / c), in base 2
            s = tanh(s) * softcap_log2
        s = tl.where(n_mask[None, :], s, float("-inf"))
        # Every tile holds at least one real token (n0 < hi), so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + weighted_values(p, v_ptr, tok, offs_d, n_mask, d_mask,
                                                     q.dtype, KV_FORMAT, HEAD_SIZE, GROUP,
                                                     DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _decode_kernel(
    q_ptr,  # [num_seqs, nq, hd] one query token per sequence
    k_ptr,  # [num_blocks, block_size, nkv, row]: hd values, or a quantized row's bytes
    v_ptr,  # [num_blocks, block_size, nkv, row] (same strides as k)
    bt_ptr,  # int32 [num_seqs, max_blocks]
    seq_lens_ptr,  # int32 [num_seqs]
    start_ptr,  # int32 [num_seqs]: first token to attend (HAS_START), else 0
    out_ptr,  # [num_seqs, nq, hd] final output (WRITE_FINAL)
    part_out_ptr,  # fp32 [num_seqs, nq, num_slots, hd] per-split outputs (not WRITE_FINAL)
    part_lse_ptr,  # fp32 [num_seqs, nq, num_slots] per-split base-2 log-sum-exp
    slot_offset,  # first partial slot this launch writes
    tokens_per_split,
    qk_scale,  # scale * log2(e); with SOFTCAP, scale / softcap
    softcap_log2,  # SOFTCAP: softcap * log2(e)
    window,  # SLIDING: keys seen by the query, its own included
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_bts,
    stride_os, stride_oh,
    stride_ps, stride_ph, stride_pslot,
    stride_ls, stride_lh,
    G: tl.constexpr,  # query heads per KV head
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    G_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_START: tl.constexpr,
    WRITE_FINAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SLIDING: tl.constexpr,
    SOFTCAP: tl.constexpr,
    KV_FORMAT: tl.constexpr,
    GROUP: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    start = 0
    if HAS_START:
        start = tl.load(start_ptr + seq)
    if SLIDING:
        # The query (position seq_len - 1) sees keys seq_len - window .. seq_len - 1:
        # the splits cover those alone, and nothing before them is loaded.
        start = tl.maximum(start, seq_len - window)
    lo = start + split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, seq_len)

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD_SIZE
    heads = kvh * G + offs_g
    row_mask = (offs_g < G)[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_mask, other=0.0)

    acc = tl.zeros([G_PAD, HEAD_PAD], dtype=tl.float32)
    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc, m_i, l_i = attend_range(
        q, acc, m_i, l_i, bt_ptr + seq * stride_bts, lo, hi,
        k_ptr + kvh * stride_kh, v_ptr + kvh * stride_kh, stride_kb, stride_kt,
        offs_d, d_mask, qk_scale, softcap_log2, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, SOFTCAP,
        KV_FORMAT, HEAD_SIZE, GROUP,
    )
    # An empty split (lo >= hi) leaves l_i == 0: it stores lse = -inf and a zero output,
    # which the merge weighs by zero.
    has_tokens = l_i > 0
    l_safe = tl.where(has_tokens, l_i, 1.0)
    out = acc / l_safe[:, None]
    if WRITE_FINAL:
        o_ptrs = out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        slot = (slot_offset + split).to(tl.int64)
        p_ptrs = (part_out_ptr + seq * stride_ps + heads[:, None] * stride_ph
                  + slot * stride_pslot + offs_d[None, :])
        tl.store(p_ptrs, out, mask=row_mask)
        lse = tl.where(has_tokens, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + seq * stride_ls + heads * stride_lh + slot, lse,
                 mask=offs_g < G)


@triton.jit
def _merge_kernel(
    part_out_ptr,  # fp32 [num_seqs, nq, num_slots, hd]
    part_lse_ptr,  # fp32 [num_seqs, nq, num_slots] base-2; -inf marks an empty slot
    out_ptr,  # [num_seqs, nq, hd]
    num_slots,
    stride_ps, stride_ph, stride_pslot,
    stride_ls, stride_lh,
    stride_os, stride_oh,
    G: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    G_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SLOT_PAD: tl.constexpr,  # >= num_slots
    HAS_SINKS: tl.constexpr,
    sinks_ptr,  # HAS_SINKS: fp32 [nq] base-2 logits, one more term of each denominator
):
    """One program per (sequence, KV head) merges the slots of its G query heads."""
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    offs_g = tl.arange(0, G_PAD)
    g_mask = offs_g < G
    heads = kvh * G + offs_g
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD_SIZE
    lse_rows = part_lse_ptr + seq * stride_ls + heads * stride_lh  # [G_PAD]
    out_rows = part_out_ptr + seq * stride_ps + heads[:, None] * stride_ph + offs_d[None, :]

    offs_s = tl.arange(0, SLOT_PAD)
    lse_all = tl.load(lse_rows[:, None] + offs_s[None, :],
                      mask=g_mask[:, None] & (offs_s < num_slots)[None, :], other=float("-inf"))
    # Every real head has a filled slot (a sequence has >= 1 token); padded heads do not.
    m = tl.max(lse_all, 1)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + heads, mask=g_mask, other=float("-inf"))
        m = tl.maximum(m, sink)
    m = tl.where(m > float("-inf"), m, 0.0)
    denom = tl.sum(tl.exp2(lse_all - m[:, None]), 1)
    if HAS_SINKS:
        denom += tl.exp2(sink - m)
    acc = tl.zeros([G_PAD, HEAD_PAD], dtype=tl.float32)
    for slot in range(num_slots):
        lse = tl.load(lse_rows + slot, mask=g_mask, other=float("-inf"))
        filled = lse > float("-inf")
        # Empty slots are never read: their outputs may be uninitialised memory.
        o = tl.load(out_rows + slot * stride_pslot, mask=filled[:, None] & d_mask[None, :],
                    other=0.0)
        acc += o * tl.exp2(lse - m)[:, None]
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 must not silently drop to TF32 on tensor cores; half types ignore this."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int,
                      device: torch.device) -> int:
    """Enough splits that (sequences x KV heads x splits) fills every SM about twice,
    but no split shorter than MIN_TOKENS_PER_SPLIT (the merge would cost more than it
    saves). Off CUDA programs run one after another, so splitting only adds work."""
    if device.type != "cuda":
        return 1
    programs = num_seqs * num_kv_heads
    target = 2 * _sm_count(device.index if device.index is not None else 0)
    if programs >= target:
        return 1
    by_length = max(1, max_seq_len // MIN_TOKENS_PER_SPLIT)
    return max(1, min(math.ceil(target / programs), by_length, MAX_SPLITS))


def tile_tokens(head_pad: int) -> int:
    # A 64 x 256 tile of K plus one of V would crowd shared memory with pipelining.
    return 32 if head_pad > 128 else 64


def score_scales(scale: float, softcap: float | None) -> tuple[float, float]:
    """(qk_scale, softcap_log2) for the kernels: scores in base 2, soft-capped or not."""
    if softcap is None:
        return scale * LOG2E, 0.0
    return scale / softcap, softcap * LOG2E


def check_inputs(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Shapes and dtypes a user of the kernels can get wrong. A quantized pool (its dtype
    tells its format) takes a query of any supported dtype; its rows are the format's."""
    if query.dim() != 3 or k_cache.dim() != 4:
        raise ValueError("query must be [tokens, nq, hd] and k_cache [blocks, bs, nkv, hd], "
                         f"got {tuple(query.shape)} and {tuple(k_cache.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError("v_cache must have k_cache's shape and strides")
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"v_cache dtype {v_cache.dtype} must be k_cache's {k_cache.dtype}")
    fmt = format_of(k_cache)
    if query.dtype not in SUPPORTED_DTYPES or (query.dtype != k_cache.dtype
                                               and not fmt.quantized):
        raise ValueError(f"query dtype {query.dtype} must match k_cache dtype {k_cache.dtype} "
                         "and be float16, bfloat16 or float32")
    if (fmt.row_len(query.shape[2]) != k_cache.shape[3]
            or query.shape[1] % k_cache.shape[2] != 0):
        raise ValueError(f"query heads {tuple(query.shape[1:])} do not fit KV heads "
                         f"{tuple(k_cache.shape[2:])}: nq must be a multiple of nkv")
    if query.stride(2) != 1 or k_cache.stride(3) != 1:
        raise ValueError("query and k_cache must be contiguous in the head dimension")


def launch_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, *,
                  max_tokens: int, num_splits: int, out: torch.Tensor | None = None,
                  partials: tuple[torch.Tensor, torch.Tensor] | None = None,
                  start: torch.Tensor | None = None, slot_offset: int = 0,
                  window: int | None = None, softcap: float | None = None) -> None:
    """Launch the split decode kernel: into `out` with one split, or else into slots
    [slot_offset, slot_offset + num_splits) of partials = (part_out, part_lse).
    max_tokens: the most keys one sequence attends (with a window, at most the window)."""
    num_seqs, nq, head_size = query.shape
    nkv = k_cache.shape[2]
    head_pad = triton.next_power_of_2(head_size)
    block_n = tile_tokens(head_pad)
    tokens_per_split = triton.cdiv(triton.cdiv(max(max_tokens, 1), num_splits), block_n) * block_n
    final = partials is None
    # The branch a launch does not take never touches its pointers: pass query there.
    o = out if final else query
    part_out, part_lse = (query, query[:, :, 0]) if final else partials
    qk_scale, softcap_log2 = score_scales(scale, softcap)
    _decode_kernel[(num_seqs, nkv, num_splits)](
        query, as_bytes(k_cache), as_bytes(v_cache), block_tables, seq_lens,
        start if start is not None else seq_lens, o, part_out, part_lse,
        slot_offset, tokens_per_split, qk_scale, softcap_log2, window or 0,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        o.stride(0), o.stride(1), *part_out.stride()[:3], *part_lse.stride()[:2],
        G=nq // nkv, HEAD_SIZE=head_size, BLOCK_SIZE=k_cache.shape[1],
        G_PAD=max(16, triton.next_power_of_2(nq // nkv)), HEAD_PAD=head_pad, BLOCK_N=block_n,
        HAS_START=start is not None, WRITE_FINAL=final,
        DOT_PRECISION=dot_precision(query.dtype), SLIDING=window is not None,
        SOFTCAP=softcap is not None, KV_FORMAT=format_code(k_cache),
        GROUP=int4_group(head_size), num_warps=4, num_stages=2,
    )


def sinks_operand(sinks: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The sinks as the kernels read them (fp32, to base 2), or any tensor where there
    are none (a launch without HAS_SINKS never reads it)."""
    if sinks is None:
        return like
    return (sinks.to(device=like.device, dtype=torch.float32) * LOG2E).contiguous()


def merge_partials(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor,
                   num_kv_heads: int, sinks: torch.Tensor | None = None) -> None:
    """out[s, h] = softmax-weighted sum of the filled partial slots of (s, h), the sink
    of head h (natural log, [nq]) one more term of the weights' denominator."""
    num_seqs, nq, num_slots, head_size = part_out.shape
    group = nq // num_kv_heads
    _merge_kernel[(num_seqs, num_kv_heads)](
        part_out, part_lse, out, num_slots,
        *part_out.stride()[:3], *part_lse.stride()[:2], out.stride(0), out.stride(1),
        G=group, HEAD_SIZE=head_size, G_PAD=triton.next_power_of_2(group),
        HEAD_PAD=triton.next_power_of_2(head_size),
        SLOT_PAD=triton.next_power_of_2(num_slots), HAS_SINKS=sinks is not None,
        sinks_ptr=sinks_operand(sinks, part_lse), num_warps=4,
    )


def paged_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata, scale: float, *, num_splits: int | None = None,
                 out: torch.Tensor | None = None, sliding_window: int | None = None,
                 logit_softcap: float | None = None,
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention for a batch with one new token per sequence.

    query [num_seqs, nq, hd]; returns [num_seqs, nq, hd] in query's dtype. `num_splits`
    None picks from the batch and the keys attended (choose_num_splits). sliding_window
    and logit_softcap as in kernels.interface.check_attention_options, sinks [nq] as in
    kernels.interface.check_sinks."""
    check_inputs(query, k_cache, v_cache)
    check_attention_options(sliding_window, logit_softcap)
    num_seqs, nq, head_size = query.shape
    check_sinks(sinks, nq)
    if num_seqs != meta.num_seqs:
        raise ValueError(f"decode query has {num_seqs} rows for {meta.num_seqs} sequences")
    window = effective_window(sliding_window, meta.max_seq_len)
    max_tokens = meta.max_seq_len if window is None else window
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, k_cache.shape[2], max_tokens, query.device)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_seqs == 0:
        return out
    if num_splits == 1 and sinks is None:
        launch_decode(query, k_cache, v_cache, meta.seq_lens, meta.block_tables, scale,
                      max_tokens=max_tokens, num_splits=1, out=out, window=window,
                      softcap=logit_softcap)
        return out
    part_out = torch.empty((num_seqs, nq, num_splits, head_size), dtype=torch.float32,
                           device=query.device)
    part_lse = torch.empty((num_seqs, nq, num_splits), dtype=torch.float32,
                           device=query.device)
    launch_decode(query, k_cache, v_cache, meta.seq_lens, meta.block_tables, scale,
                  max_tokens=max_tokens, num_splits=num_splits,
                  partials=(part_out, part_lse), window=window, softcap=logit_softcap)
    merge_partials(part_out, part_lse, out, k_cache.shape[2], sinks)
    return out
