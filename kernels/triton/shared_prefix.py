"""Shared-prompt (cascade) decode for candidate sequences.

When n candidates of one request share a prompt, their block tables start with the same
physical blocks. Plain decode reads those blocks once per candidate; here one program
per (group, KV head, split) reads each shared block once and scores it against every
member's query heads (rows = member * G_PAD + head), writing a partial output and a
base-2 log-sum-exp per member. The plain decode kernel then covers each sequence's
private tail (from its group's shared length on) into further partial slots, and the
split-K merge combines all slots.

A logit soft-cap applies to both parts (SOFTCAP, as in kernels/triton/decode.py), and a
quantized pool is read in place by both (KV_FORMAT, as there). A
sliding window has no place here: members of a group have different windows, and a
window that starts past the shared blocks makes them irrelevant, so TritonBackend sends
windowed decode batches to the plain decode kernel (whose loop starts at each window).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.interface import AttentionMetadata, check_attention_options
from kernels.kv_format import int4_group
from kernels.triton.decode import (
    attend_range,
    check_inputs,
    choose_num_splits,
    dot_precision,
    launch_decode,
    merge_partials,
    score_scales,
    tile_tokens,
)
from kernels.triton.kv_quant import as_bytes, format_code

MAX_TILE_ROWS = 128  # members x padded group heads in one program


@dataclass(slots=True, frozen=True)
class SharedPrefixGroup:
    """Sequences (indices into the batch) whose first num_shared_blocks blocks are the
    same physical blocks, each holding block_size tokens of every member's context."""

    seq_indices: tuple[int, ...]
    num_shared_blocks: int


@triton.jit
def _shared_prefix_kernel(
    q_ptr,  # [num_seqs, nq, hd]
    k_ptr,  # [num_blocks, block_size, nkv, row]: hd values, or a quantized row's bytes
    v_ptr,  # [num_blocks, block_size, nkv, row] (same strides as k)
    bt_ptr,  # int32 [num_seqs, max_blocks]
    members_ptr,  # int32 [num_groups, MEMBERS_PAD]: sequence indices, -1 = padding
    shared_len_ptr,  # int32 [num_groups]: shared tokens of each group
    part_out_ptr,  # fp32 [num_seqs, nq, num_slots, hd]
    part_lse_ptr,  # fp32 [num_seqs, nq, num_slots] base-2
    tokens_per_split,
    qk_scale,  # scale * log2(e); with SOFTCAP, scale / softcap
    softcap_log2,  # SOFTCAP: softcap * log2(e)
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_bts,
    stride_ps, stride_ph, stride_pslot,
    stride_ls, stride_lh,
    G: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    G_PAD: tl.constexpr,
    MEMBERS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    KV_FORMAT: tl.constexpr,
    GROUP: tl.constexpr,
):
    group = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    rows = tl.arange(0, MEMBERS_PAD * G_PAD)
    member = tl.load(members_ptr + group * MEMBERS_PAD + rows // G_PAD)
    head_in_group = rows % G_PAD
    row_valid = (member >= 0) & (head_in_group < G)
    seq = tl.where(member >= 0, member, 0).to(tl.int64)
    heads = kvh * G + head_in_group
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD_SIZE
    io_mask = row_valid[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + seq[:, None] * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=io_mask, other=0.0)

    # Any member's block table serves: the first one is never padding.
    leader = tl.load(members_ptr + group * MEMBERS_PAD).to(tl.int64)
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, tl.load(shared_len_ptr + group))
    acc = tl.zeros([MEMBERS_PAD * G_PAD, HEAD_PAD], dtype=tl.float32)
    m_i = tl.full([MEMBERS_PAD * G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([MEMBERS_PAD * G_PAD], dtype=tl.float32)
    acc, m_i, l_i = attend_range(
        q, acc, m_i, l_i, bt_ptr + leader * stride_bts, lo, hi,
        k_ptr + kvh * stride_kh, v_ptr + kvh * stride_kh, stride_kb, stride_kt,
        offs_d, d_mask, qk_scale, softcap_log2, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, SOFTCAP,
        KV_FORMAT, HEAD_SIZE, GROUP,
    )
    has_tokens = l_i > 0
    l_safe = tl.where(has_tokens, l_i, 1.0)
    slot = split.to(tl.int64)
    tl.store(part_out_ptr + seq[:, None] * stride_ps + heads[:, None] * stride_ph
             + slot * stride_pslot + offs_d[None, :], acc / l_safe[:, None], mask=io_mask)
    lse = tl.where(has_tokens, m_i + tl.log2(l_safe), float("-inf"))
    tl.store(part_lse_ptr + seq * stride_ls + heads * stride_lh + slot, lse, mask=row_valid)


def find_shared_prefix_groups(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                              block_size: int, min_shared_blocks: int = 1
                              ) -> list[SharedPrefixGroup]:
    """Group the sequences whose block tables start with the same physical blocks.

    Only full blocks inside every member's context count as shared. Sharing nests (the
    candidates of one request share its whole prompt; other requests may share only a
    cached system prompt with them), so each sequence joins the deepest group it can:
    a walk down the tree of common prefixes. Reads the tables on the host (one device
    sync per step when they live on the GPU)."""
    if min_shared_blocks < 1:
        raise ValueError(f"min_shared_blocks must be >= 1, got {min_shared_blocks}")
    tables = block_tables.cpu().tolist()
    full_blocks = [n // block_size for n in seq_lens.cpu().tolist()]
    groups: list[SharedPrefixGroup] = []

    def walk(members: list[int], depth: int) -> list[int]:
        """members share blocks [0, depth); returns those left in no group."""
        while (all(full_blocks[i] > depth for i in members)
               and len({tables[i][depth] for i in members}) == 1):
            depth += 1
        by_next_block: dict[int, list[int]] = defaultdict(list)
        here = []
        for i in members:
            if full_blocks[i] > depth:
                by_next_block[tables[i][depth]].append(i)
            else:
                here.append(i)
        for branch in by_next_block.values():
            here += walk(branch, depth + 1) if len(branch) > 1 else branch
        if len(here) > 1 and depth >= min_shared_blocks:
            groups.append(SharedPrefixGroup(tuple(sorted(here)), depth))
            return []
        return here

    walk([i for i, n in enumerate(full_blocks) if n > 0], 0)
    return sorted(groups, key=lambda g: g.seq_indices)


def _pack_groups(groups: list[SharedPrefixGroup], g_pad: int, num_seqs: int, block_size: int
                 ) -> tuple[list[list[int]], list[int], list[int]]:
    """Members per program (split so rows fit MAX_TILE_ROWS), shared tokens per program,
    and each sequence's first private token."""
    per_program = max(1, MAX_TILE_ROWS // g_pad)
    members, shared_len = [], []
    start = [0] * num_seqs
    seen: set[int] = set()
    for group in groups:
        if not group.seq_indices or group.num_shared_blocks < 0:
            raise ValueError(f"shared-prefix group {group} needs members and a block count")
        for i in group.seq_indices:
            if not 0 <= i < num_seqs or i in seen:
                raise ValueError(f"shared-prefix groups: sequence index {i} is out of range "
                                 "or in two groups")
            seen.add(i)
            start[i] = group.num_shared_blocks * block_size
        for c in range(0, len(group.seq_indices), per_program):
            members.append(list(group.seq_indices[c:c + per_program]))
            shared_len.append(group.num_shared_blocks * block_size)
    return members, shared_len, start


def shared_prefix_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         meta: AttentionMetadata, scale: float,
                         groups: list[SharedPrefixGroup], *, num_splits: int | None = None,
                         logit_softcap: float | None = None) -> torch.Tensor:
    """Decode attention equal to paged_decode, reading each group's shared blocks once.

    Sequences in no group are decoded as usual. `num_splits` (None = automatic) applies
    to both the shared and the private parts. No sliding window (see the module doc)."""
    check_inputs(query, k_cache, v_cache)
    check_attention_options(None, logit_softcap)
    num_seqs, nq, head_size = query.shape
    if num_seqs != meta.num_seqs:
        raise ValueError(f"decode query has {num_seqs} rows for {meta.num_seqs} sequences")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    nkv, block_size = k_cache.shape[2], k_cache.shape[1]
    group_size = nq // nkv
    g_pad = triton.next_power_of_2(group_size)
    members, shared_len, start = _pack_groups(groups, g_pad, num_seqs, block_size)
    device = query.device
    max_shared = max(shared_len, default=0)
    shared_splits = 0
    if members:
        shared_splits = num_splits or choose_num_splits(len(members), nkv, max_shared, device)
    private_splits = num_splits or choose_num_splits(num_seqs, nkv, meta.max_seq_len, device)
    num_slots = shared_splits + private_splits
    # Sequences in no group leave the shared slots empty: -inf marks them for the merge.
    part_lse = torch.full((num_seqs, nq, num_slots), float("-inf"), dtype=torch.float32,
                          device=device)
    part_out = torch.empty((num_seqs, nq, num_slots, head_size), dtype=torch.float32,
                           device=device)
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_seqs == 0:
        return out
    head_pad = triton.next_power_of_2(head_size)
    if members:
        members_pad = triton.next_power_of_2(max(len(m) for m in members))
        members_pad = max(members_pad, triton.cdiv(16, g_pad))  # tl.dot needs >= 16 rows
        table = torch.full((len(members), members_pad), -1, dtype=torch.int32)
        for r, m in enumerate(members):
            table[r, :len(m)] = torch.tensor(m, dtype=torch.int32)
        block_n = tile_tokens(head_pad)
        tokens_per_split = triton.cdiv(triton.cdiv(max(max_shared, 1), shared_splits),
                                       block_n) * block_n
        _shared_prefix_kernel[(len(members), nkv, shared_splits)](
            query, as_bytes(k_cache), as_bytes(v_cache), meta.block_tables, table.to(device),
            torch.tensor(shared_len, dtype=torch.int32, device=device), part_out, part_lse,
            tokens_per_split, *score_scales(scale, logit_softcap),
            query.stride(0), query.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            meta.block_tables.stride(0),
            *part_out.stride()[:3], *part_lse.stride()[:2],
            G=group_size, HEAD_SIZE=head_size, BLOCK_SIZE=block_size, G_PAD=g_pad,
            MEMBERS_PAD=members_pad, HEAD_PAD=head_pad, BLOCK_N=block_n,
            DOT_PRECISION=dot_precision(query.dtype), SOFTCAP=logit_softcap is not None,
            KV_FORMAT=format_code(k_cache), GROUP=int4_group(head_size),
            num_warps=4, num_stages=2,
        )
    launch_decode(query, k_cache, v_cache, meta.seq_lens, meta.block_tables, scale,
                  max_tokens=meta.max_seq_len, num_splits=private_splits,
                  partials=(part_out, part_lse),
                  start=torch.tensor(start, dtype=torch.int32, device=device),
                  slot_offset=shared_splits, softcap=logit_softcap)
    merge_partials(part_out, part_lse, out, nkv)
    return out
