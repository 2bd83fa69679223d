"""The gated delta rule's chunked prefill (Triton) over a batch of variable-length
sequences, their states in the state pool.

The batch's tokens are one [T, ...] tensor; each sequence's rows cut into chunks of
``CHUNK`` tokens (the last one shorter), and each snapshot (the state after n of a
sequence's tokens, copied into a slot) filed under the chunk holding its boundary
(`ChunkLayout`). Two launches:

1. `_wy_kernel`, one program per (chunk, value head), all in parallel: the chunk's
   corrections as the WY / UT form. With decay_i the cumulated log gate through token i
   and A[i, j] = beta_i k_i.k_j exp(decay_i - decay_j) for j < i, the unit lower system
   (I + A) inverts into T = (I + A)^-1 (see the kernel), then
   u = T (beta v) and w = T (beta exp(decay) k), written to scratch [T, Hv, D].
2. `_scan_kernel`, one program per (sequence, value head, block of value columns): the
   state S [Dk, BV] in registers across the sequence's chunks, in order:
       v' = u - w S
       o  = (q exp(decay)) S + (q k^T * exp(decay_i - decay_j), j <= i) v'
       S  = exp(decay_last) S + (k exp(decay_last - decay))^T v'
   reading S from the sequence's slot (or zeros) and writing it back at the end. A
   snapshot n rows into a chunk is the same update over those rows only,
       S_n = exp(decay_{n-1}) S + (k exp(decay_{n-1} - decay), rows < n)^T v',
   one more product, so snapshots at every 16-token block do not cut the chunks.

q and k arrive one head per k head, not normalized: both kernels normalize them (the
first only k). Everything is float32; the dots run at IEEE precision (no TF32), as the
state adds up the whole context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton.delta_rule_common import check_heads, head_pad, k_head_of, load_normalized

CHUNK = 64  # tokens per chunk, as the PyTorch path (engine/layers/delta_rule.py)
SUB = 16  # the diagonal blocks the WY kernel inverts by substitution: CHUNK / SUB = 4
SCAN_BV = 32  # value columns per scan program
# Both kernels hold [CHUNK, 128] float32 tiles of q, k, w (or v) at head size 128: eight
# warps keep them in registers where four would spill.
NUM_WARPS = 8


@dataclass(slots=True)
class ChunkLayout:
    """Host-built tables of a batch's chunks (int64 tensors on the kernels' device)."""

    chunk_start: torch.Tensor  # [N] first row of each chunk
    chunk_len: torch.Tensor  # [N] its rows, 1..CHUNK
    chunk_first_snapshot: torch.Tensor  # [N + 1] chunk c's snapshots: [first[c], first[c+1])
    snapshot_rows: torch.Tensor  # [M] rows of its chunk the snapshot's state has seen, 0..len
    snapshot_slot: torch.Tensor  # [M] the slot it is copied into
    seq_first_chunk: torch.Tensor  # [S + 1] each sequence's chunks: [first[s], first[s+1])
    seq_slot: torch.Tensor  # [S] the slot its state starts from and ends in
    seq_resume: torch.Tensor  # [S] 1: start from the slot's state, 0: from zeros


def chunk_layout(seq_rows: list[tuple[int, int]], slots: list[int], resumes: list[bool],
                 snapshots: list[list[tuple[int, int]]] | None, device: torch.device,
                 chunk: int = CHUNK) -> ChunkLayout:
    """Sequence s has the batch's rows [seq_rows[s][0], seq_rows[s][1]) and slot
    slots[s]; snapshots[s] lists (tokens into its rows, slot) for states to keep on the
    way (a token count of 0 keeps the state it starts from)."""
    starts, lens, snap_first, snap_rows, snap_slots, firsts = [], [], [0], [], [], [0]
    for s, (r0, r1) in enumerate(seq_rows):
        if r1 <= r0:
            raise ValueError(f"seq_rows: sequence {s} has no rows ({r0}, {r1})")
        cuts = sorted((snapshots or [[] for _ in slots])[s])
        if any(not 0 <= offset <= r1 - r0 for offset, _ in cuts):
            raise ValueError(f"snapshots: sequence {s} has an offset outside its "
                             f"{r1 - r0} rows")
        for c, pos in enumerate(range(r0, r1, chunk)):
            starts.append(pos)
            lens.append(min(chunk, r1 - pos))
            # A boundary at a chunk's end is filed under that chunk (all its rows seen).
            mine = [(offset - c * chunk, slot) for offset, slot in cuts
                    if max(0, offset - 1) // chunk == c]
            snap_rows += [rows for rows, _ in mine]
            snap_slots += [slot for _, slot in mine]
            snap_first.append(len(snap_rows))
        firsts.append(len(starts))

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return ChunkLayout(tensor(starts), tensor(lens), tensor(snap_first), tensor(snap_rows),
                       tensor(snap_slots), tensor(firsts), tensor(slots),
                       tensor([int(r) for r in resumes]))


@triton.jit
def _wy_kernel(
    k_ptr,  # [T, Hk, Dk]
    v_ptr,  # [T, Hv, Dv]
    g_ptr, beta_ptr,  # float32 [T, Hv]
    chunk_start_ptr, chunk_len_ptr,  # int64 [N]
    u_ptr,  # float32 [T, Hv, Dv] out
    w_ptr,  # float32 [T, Hv, Dk] out
    decay_ptr,  # float32 [T, Hv] out: the cumulated log gate within the chunk
    stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_betat,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr,
    RATIO: tl.constexpr, K_HEADS: tl.constexpr, TILED: tl.constexpr,
):
    chunk = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    start = tl.load(chunk_start_ptr + chunk)
    length = tl.load(chunk_len_ptr + chunk)
    offs_c = tl.arange(0, C)
    rows = start + offs_c
    valid = offs_c < length
    offs_k, offs_v = tl.arange(0, BK), tl.arange(0, BV)
    k_head = k_head_of(head, RATIO, K_HEADS, TILED)
    k = load_normalized(k_ptr + k_head * stride_kh, rows, valid, stride_kt, offs_k, DK)
    v = tl.load(v_ptr + rows[:, None] * stride_vt + head * stride_vh + offs_v[None, :],
                mask=valid[:, None] & (offs_v < DV)[None, :], other=0.0).to(tl.float32)
    g = tl.load(g_ptr + rows * stride_gt + head, mask=valid, other=0.0)
    beta = tl.load(beta_ptr + rows * stride_betat + head, mask=valid, other=0.0)
    decay = tl.cumsum(g, 0)
    below = (offs_c[:, None] > offs_c[None, :]) & valid[:, None]
    # Masked before the exp: a padded row's decay minus a real one's can overflow.
    pair = tl.exp(tl.where(below, decay[:, None] - decay[None, :], float("-inf")))
    k_beta = k * beta[:, None]
    a = tl.dot(k_beta, tl.trans(k), input_precision="ieee") * pair  # [C, C], strictly lower
    # T = (I + A)^-1 in two moves. D, the diagonal SUB x SUB blocks of I + A, inverts by
    # forward substitution, row i of every block at once (rows j < i are final by then).
    # The strictly block-lower rest N then leaves M = D^-1 N nilpotent (C / SUB = 4 block
    # rows: M^4 = 0), so T = (I + M)^-1 D^-1 = (I - M + M^2 - M^3) D^-1 exactly.
    eye = tl.where(offs_c[:, None] == offs_c[None, :], 1.0, 0.0)
    same_block = (offs_c // SUB)[:, None] == (offs_c // SUB)[None, :]
    a_diag = tl.where(same_block, a, 0.0)
    inv_d = eye
    for i in range(1, SUB):
        rows_i = (offs_c % SUB) == i
        inv_d = tl.where(rows_i[:, None], eye - tl.dot(a_diag, inv_d, input_precision="ieee"),
                         inv_d)
    m = tl.dot(inv_d, tl.where(same_block, 0.0, a), input_precision="ieee")
    m2 = tl.dot(m, m, input_precision="ieee")
    series = eye - m + m2 - tl.dot(m2, m, input_precision="ieee")
    inverse = tl.dot(series, inv_d, input_precision="ieee")
    u = tl.dot(inverse, v * beta[:, None], input_precision="ieee")
    w = tl.dot(inverse, k_beta * tl.exp(decay)[:, None], input_precision="ieee")
    tl.store(u_ptr + (rows[:, None] * HV + head) * DV + offs_v[None, :], u,
             mask=valid[:, None] & (offs_v < DV)[None, :])
    tl.store(w_ptr + (rows[:, None] * HV + head) * DK + offs_k[None, :], w,
             mask=valid[:, None] & (offs_k < DK)[None, :])
    tl.store(decay_ptr + rows * HV + head, decay, mask=valid)


@triton.jit
def _scan_kernel(
    q_ptr, k_ptr,  # [T, Hk, Dk] (same strides)
    u_ptr, w_ptr, decay_ptr,  # the first kernel's scratch
    state_ptr,  # float32 [slots, Hv, Dk, Dv], contiguous in its last two dimensions
    out_ptr,  # float32 [T, Hv, Dv]
    chunk_start_ptr, chunk_len_ptr,  # int64 [N]
    chunk_first_snapshot_ptr,  # int64 [N + 1]
    snapshot_rows_ptr, snapshot_slot_ptr,  # int64 [M]
    seq_first_chunk_ptr,  # int64 [S + 1]
    seq_slot_ptr, seq_resume_ptr,  # int64 [S]
    stride_qt, stride_qh, stride_slot, stride_sh, stride_ot, stride_oh,
    scale,  # Dk ** -0.5
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HV: tl.constexpr, C: tl.constexpr,
    RATIO: tl.constexpr, K_HEADS: tl.constexpr, TILED: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV)
    offs_c = tl.arange(0, C)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    tile_mask = mask_k[:, None] & mask_v[None, :]
    tile = head * stride_sh + offs_k[:, None] * DV + offs_v[None, :]
    slot = tl.load(seq_slot_ptr + seq)
    state = tl.load(state_ptr + slot * stride_slot + tile, mask=tile_mask, other=0.0)
    state = tl.where(tl.load(seq_resume_ptr + seq) != 0, state, 0.0)
    k_head = k_head_of(head, RATIO, K_HEADS, TILED)
    qk_offset = k_head * stride_qh
    first = tl.load(seq_first_chunk_ptr + seq)
    last_chunk = tl.load(seq_first_chunk_ptr + seq + 1)
    for chunk in range(first, last_chunk):
        start = tl.load(chunk_start_ptr + chunk)
        length = tl.load(chunk_len_ptr + chunk)
        rows = start + offs_c
        valid = offs_c < length
        q = load_normalized(q_ptr + qk_offset, rows, valid, stride_qt, offs_k, DK)
        q = q * scale
        k = load_normalized(k_ptr + qk_offset, rows, valid, stride_qt, offs_k, DK)
        w = tl.load(w_ptr + (rows[:, None] * HV + head) * DK + offs_k[None, :],
                    mask=valid[:, None] & mask_k[None, :], other=0.0)
        u = tl.load(u_ptr + (rows[:, None] * HV + head) * DV + offs_v[None, :],
                    mask=valid[:, None] & mask_v[None, :], other=0.0)
        decay = tl.load(decay_ptr + rows * HV + head, mask=valid, other=0.0)
        # The chunk's last decay.
        last = tl.sum(tl.where(offs_c == length - 1, decay, 0.0), 0)
        v_new = u - tl.dot(w, state, input_precision="ieee")  # [C, BV]
        causal = (offs_c[:, None] >= offs_c[None, :]) & valid[:, None]
        pair = tl.exp(tl.where(causal, decay[:, None] - decay[None, :], float("-inf")))
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * pair
        out = (tl.dot(q * tl.exp(decay)[:, None], state, input_precision="ieee")
               + tl.dot(scores, v_new, input_precision="ieee"))
        tl.store(out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_v[None, :],
                 out, mask=valid[:, None] & mask_v[None, :])
        for snap in range(tl.load(chunk_first_snapshot_ptr + chunk),
                          tl.load(chunk_first_snapshot_ptr + chunk + 1)):
            seen = tl.load(snapshot_rows_ptr + snap)
            upto = tl.sum(tl.where(offs_c == seen - 1, decay, 0.0), 0)
            k_to_n = k * tl.exp(tl.where(offs_c < seen, upto - decay, float("-inf")))[:, None]
            snapshot = state * tl.exp(upto) + tl.dot(tl.trans(k_to_n), v_new,
                                                     input_precision="ieee")
            tl.store(state_ptr + tl.load(snapshot_slot_ptr + snap) * stride_slot + tile,
                     snapshot, mask=tile_mask)
        k_to_end = k * tl.exp(tl.where(valid, last - decay, float("-inf")))[:, None]
        state = state * tl.exp(last) + tl.dot(tl.trans(k_to_end), v_new,
                                              input_precision="ieee")
    tl.store(state_ptr + slot * stride_slot + tile, state, mask=tile_mask)


def chunked_prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor,
                    layout: ChunkLayout, out: torch.Tensor, tiled: bool = False) -> None:
    """query, key [T, Hk, Dk] (the conv's output, not yet normalized), value [T, Hv, Dv],
    g, beta [T, Hv], states float32 [slots, Hv, Dk, Dv]: every sequence of ``layout``
    runs its rows from its slot's state (or zeros), leaving its snapshots and its final
    state in ``states``; out float32 [T, Hv, Dv] gets the rows the layout covers."""
    num_v_heads = value.shape[1]
    k_heads, dk, dv = check_heads(query, key, value, num_v_heads)
    if states.dtype != torch.float32 or states.shape[1:] != (num_v_heads, dk, dv) \
            or states.stride(-1) != 1 or states.stride(-2) != dv:
        raise ValueError(f"states must be float32 [slots, {num_v_heads}, {dk}, {dv}], "
                         f"contiguous in the last two, got {tuple(states.shape)}")
    if out.dtype != torch.float32 or out.shape != value.shape or out.stride(-1) != 1:
        raise ValueError(f"out must be float32 {tuple(value.shape)}, got {tuple(out.shape)}")
    num_chunks, num_seqs = layout.chunk_start.numel(), layout.seq_slot.numel()
    if num_chunks == 0:
        return
    g, beta = g.float().contiguous(), beta.float().contiguous()
    tokens = value.shape[0]
    scratch = dict(dtype=torch.float32, device=value.device)
    u = torch.empty(tokens, num_v_heads, dv, **scratch)
    w = torch.empty(tokens, num_v_heads, dk, **scratch)
    decay = torch.empty(tokens, num_v_heads, **scratch)
    heads = dict(DK=dk, DV=dv, BK=head_pad(dk), HV=num_v_heads, C=CHUNK,
                 RATIO=num_v_heads // k_heads, K_HEADS=k_heads, TILED=tiled)
    _wy_kernel[(num_chunks, num_v_heads)](
        key, value, g, beta, layout.chunk_start, layout.chunk_len, u, w, decay,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1), g.stride(0),
        beta.stride(0), BV=head_pad(dv), SUB=SUB, **heads, num_warps=NUM_WARPS,
    )
    block_v = min(SCAN_BV, head_pad(dv))
    _scan_kernel[(num_seqs, num_v_heads, triton.cdiv(dv, block_v))](
        query, key, u, w, decay, states, out, layout.chunk_start, layout.chunk_len,
        layout.chunk_first_snapshot, layout.snapshot_rows, layout.snapshot_slot,
        layout.seq_first_chunk, layout.seq_slot, layout.seq_resume,
        query.stride(0), query.stride(1), states.stride(0), states.stride(1), out.stride(0),
        out.stride(1), dk ** -0.5, BV=block_v, **heads, num_warps=NUM_WARPS,
    )
