"""Varlen prefill attention over the paged KV cache (Triton).

A step's batch is a list of new-token chunks (`AttentionMetadata.query_start_loc`), each
sitting at the end of its sequence: it attends to the sequence's cached prefix through
the block table and causally to itself. So one kernel serves a fresh prompt, a chunked
prefill continuing an earlier chunk, a prompt whose prefix was a cache hit, and decode
rows (chunks of one token) mixed into the same batch.

One program per (sequence, KV head, tile of BLOCK_Q new tokens). The tile's rows are
its tokens times the GQA group's query heads (row = token * G_PAD + head), so each K/V
tile is read once for all the query heads that share it.

Options, constexpr-specialized as in kernels/triton/decode.py: SLIDING (window W) lets the
token at position p see keys p - W + 1 .. p only (transformers' sliding_window_overlay);
each tile's key loop starts at its first query's window start, so blocks wholly before
every query of the tile are never read. SOFTCAP (c): c * tanh(score / c) before the mask.
HAS_SINKS: a per-head logit joins each row's denominator (kernels.interface.check_sinks).
A quantized pool is read in place as in the decode kernel (KV_FORMAT; it wants a rotated
query and gives a rotated output).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.interface import (
    AttentionMetadata,
    check_attention_options,
    check_sinks,
    effective_window,
)
from kernels.kv_format import int4_group
from kernels.triton.decode import (
    check_inputs,
    dot_precision,
    paged_block_offsets,
    score_scales,
    sinks_operand,
    slot_offsets,
    tanh,
)
from kernels.triton.kv_quant import as_bytes, format_code, key_scores, weighted_values

TILE_ROWS = 64


@triton.jit
def _prefill_kernel(
    q_ptr,  # [num_tokens, nq, hd] new tokens of every sequence, back to back
    k_ptr,  # [num_blocks, block_size, nkv, row]: hd values, or a quantized row's bytes
    v_ptr,  # [num_blocks, block_size, nkv, row] (same strides as k)
    bt_ptr,  # int32 [num_seqs, max_blocks]
    seq_lens_ptr,  # int32 [num_seqs]: context length after this step
    qsl_ptr,  # int32 [num_seqs + 1]: query_start_loc
    out_ptr,  # [num_tokens, nq, hd]
    qk_scale,  # softmax scale times log2(e); with SOFTCAP, scale / softcap
    softcap_log2,  # SOFTCAP: softcap times log2(e)
    window,  # SLIDING: keys each token sees, its own included
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_bts,
    stride_ot, stride_oh,
    G: tl.constexpr,  # query heads per KV head
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    G_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # new tokens per tile; BLOCK_Q * G_PAD rows
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SLIDING: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    sinks_ptr,  # HAS_SINKS: fp32 [nq] base-2 logits in each row's denominator
    KV_FORMAT: tl.constexpr,  # kernels/triton/kv_quant.py: PLAIN, INT8, FP8, INT4
    GROUP: tl.constexpr,  # INT4: elements per scale
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    tile = tl.program_id(2)

    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_Q * G_PAD)
    tok = tile * BLOCK_Q + rows // G_PAD  # index among this sequence's new tokens
    head_in_group = rows % G_PAD
    row_valid = (tok < q_len) & (head_in_group < G)
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD_SIZE
    io_mask = row_valid[:, None] & d_mask[None, :]
    row_tok = (q_start + tok).to(tl.int64)
    heads = kvh * G + head_in_group
    q = tl.load(q_ptr + row_tok[:, None] * stride_qt + heads[:, None] * stride_qh
                + offs_d[None, :], mask=io_mask, other=0.0)
    q_pos = prefix_len + tok  # absolute position of each row's token

    # Keys up to the tile's last token; a tile past this sequence's chunk reads nothing.
    hi = tl.minimum(prefix_len + (tile + 1) * BLOCK_Q, seq_len)
    hi = tl.where(tile * BLOCK_Q < q_len, hi, 0)
    lo = 0
    if SLIDING:
        # The tile's first token (position prefix_len + tile * BLOCK_Q) sees keys from
        # window - 1 before it; the later tokens' windows start later still.
        lo = tl.maximum(prefix_len + tile * BLOCK_Q - window + 1, 0)

    bt_row = bt_ptr + seq * stride_bts
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_kh
    acc = tl.zeros([BLOCK_Q * G_PAD, HEAD_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_Q * G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * G_PAD], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        blk = paged_block_offsets(bt_row, offs_n, n_mask, stride_kb, BLOCK_SIZE)
        kv_off = slot_offsets(blk, offs_n, stride_kt, BLOCK_SIZE)
        s = key_scores(q, k_head, kv_off, blk, stride_kt, offs_d, n_mask, d_mask, qk_scale,
                       KV_FORMAT, HEAD_SIZE, GROUP, DOT_PRECISION)
        if SOFTCAP:  # c * tanh(score / c), in base 2
            s = tanh(s) * softcap_log2
        visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if SLIDING:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row may see nothing in a tile (keys past it; with a window, keys before its
        # own window): the guard keeps exp2(-inf - -inf) from producing NaN.
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + weighted_values(p, v_head, kv_off, offs_d, n_mask, d_mask,
                                                     q.dtype, KV_FORMAT, HEAD_SIZE, GROUP,
                                                     DOT_PRECISION)
        m_i = m_new

    if HAS_SINKS:
        # The sink (to base 2) is one more term of the denominator; both sides taken
        # relative to the larger of it and the row's max so that neither overflows.
        sink = tl.load(sinks_ptr + heads, mask=row_valid, other=0.0)
        top = tl.maximum(m_i, sink)
        keys_weight = tl.exp2(m_i - top)
        acc = acc * keys_weight[:, None]
        l_i = l_i * keys_weight + tl.exp2(sink - top)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + row_tok[:, None] * stride_ot + heads[:, None] * stride_oh
             + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=io_mask)


def tile_shape(group: int, head_size: int) -> tuple[int, int, int]:
    """(G_PAD, BLOCK_Q, BLOCK_N): about TILE_ROWS rows of (token, query head) per tile."""
    g_pad = triton.next_power_of_2(group)
    block_q = max(1, TILE_ROWS // g_pad)
    head_pad = triton.next_power_of_2(head_size)
    # Rows x 256 head dims of fp32 accumulator plus K and V tiles: keep BLOCK_N small.
    block_n = 32 if head_pad > 128 else 64
    return g_pad, block_q, block_n


def paged_prefill(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata, scale: float, *,
                  out: torch.Tensor | None = None, sliding_window: int | None = None,
                  logit_softcap: float | None = None,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention for a varlen batch of new-token chunks (any q_len >= 1 per sequence).

    query [num_tokens, nq, hd]; the new tokens' K/V must already be in the cache (the
    caller runs write_kv first). Returns [num_tokens, nq, hd] in query's dtype.
    sliding_window and logit_softcap as in kernels.interface.check_attention_options,
    sinks [nq] as in kernels.interface.check_sinks."""
    check_inputs(query, k_cache, v_cache)
    check_attention_options(sliding_window, logit_softcap)
    num_tokens, nq, head_size = query.shape
    check_sinks(sinks, nq)
    if meta.query_start_loc.shape[0] != meta.num_seqs + 1:
        raise ValueError("query_start_loc must have num_seqs + 1 entries, got "
                         f"{meta.query_start_loc.shape[0]} for {meta.num_seqs} sequences")
    if meta.max_query_len < 1:
        raise ValueError(f"max_query_len must be >= 1, got {meta.max_query_len}")
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_tokens == 0 or meta.num_seqs == 0:
        return out
    nkv = k_cache.shape[2]
    g_pad, block_q, block_n = tile_shape(nq // nkv, head_size)
    grid = (meta.num_seqs, nkv, triton.cdiv(meta.max_query_len, block_q))
    window = effective_window(sliding_window, meta.max_seq_len)
    qk_scale, softcap_log2 = score_scales(scale, logit_softcap)
    _prefill_kernel[grid](
        query, as_bytes(k_cache), as_bytes(v_cache), meta.block_tables, meta.seq_lens,
        meta.query_start_loc, out,
        qk_scale, softcap_log2, window or 0,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        meta.block_tables.stride(0),
        out.stride(0), out.stride(1),
        G=nq // nkv, HEAD_SIZE=head_size, BLOCK_SIZE=k_cache.shape[1], G_PAD=g_pad,
        BLOCK_Q=block_q, HEAD_PAD=triton.next_power_of_2(head_size), BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(query.dtype), SLIDING=window is not None,
        SOFTCAP=logit_softcap is not None, HAS_SINKS=sinks is not None,
        sinks_ptr=sinks_operand(sinks, query), KV_FORMAT=format_code(k_cache),
        GROUP=int4_group(head_size), num_stages=2,
        # 64 rows x 128+ head dims: 4 warps would need ~200 registers a thread.
        num_warps=8 if head_size > 64 else 4,
    )
    return out
