"""Decode attention for sequences that start with the same blocks (the candidates of one
prompt), for the PyTorch reference: the shared blocks are read once for every sequence's
query, each sequence's own blocks after them separately, and the two partial softmaxes
merge through their log-sum-exps.

    seq 0  [ 7  8  9 10 | 31 ]      shared: blocks 7-10, read once (in place when
    seq 1  [ 7  8  9 10 | 40 ]      consecutive) by the 3 x nq query rows;
    seq 2  [ 7  8  9 10 | 52 ]      tails: 31, 40, 52, gathered and masked per sequence

Without it a batch gathers every sequence's whole context, the shared prompt once per
candidate; with n candidates of a long prompt that copy was most of a decode step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.reference.block_reads import block_ids, heads_of_blocks


@dataclass(slots=True)
class SharedPrefix:
    ids: torch.Tensor | slice  # the shared blocks, for heads_of_blocks
    num_tokens: int  # positions they hold (whole blocks)
    tail_ids: torch.Tensor  # [num_seqs * tail_blocks]: each sequence's blocks after them
    tail_mask: torch.Tensor  # bool [num_seqs, 1, 1, tail_blocks * block_size]
    tail_additive: torch.Tensor | None = None  # the same as 0 / -inf, made once per step

    @classmethod
    def find(cls, tables: torch.Tensor, lengths: torch.Tensor, block_size: int,
             device: torch.device) -> SharedPrefix | None:
        """The leading blocks every table holds, or None when there are none. Each
        sequence keeps at least its newest token in its tail, so no tail is empty."""
        same = (tables == tables[0]).all(dim=0).to(torch.int64)
        leading = int(same.cumprod(0).sum())
        shared = min(leading, (int(lengths.min()) - 1) // block_size)
        if shared < 1:
            return None
        tail = tables[:, shared:]
        positions = shared * block_size + torch.arange(tail.shape[1] * block_size,
                                                       device=device)
        mask = positions[None, :] < lengths.to(device)[:, None]
        return cls(block_ids(tables[0], shared, device), shared * block_size,
                   tail.flatten(), mask.view(tables.shape[0], 1, 1, -1))


def shared_prefix_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         shared: SharedPrefix, scale: float,
                         softcap: float | None = None,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    """query [num_seqs, nq, hd] -> [num_seqs, nq, hd]; caches [blocks, bs, nkv, hd].
    sinks [nq] (kernels.interface.check_sinks) join the merge as a third part whose
    log-sum-exp is the sink and whose output is zero."""
    num_seqs, num_q_heads, head_size = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    q = query.float().view(num_seqs, num_kv_heads, group, head_size)
    # The shared keys, per KV head, against every sequence's query heads of that KV head.
    keys, values = (heads_of_blocks(cache, shared.ids, shared.num_tokens, dtype=query.dtype,
                                    keys=is_k)
                    for cache, is_k in ((k_cache, True), (v_cache, False)))  # [nkv, n, hd]
    rows = q.transpose(0, 1).reshape(num_kv_heads, num_seqs * group, head_size)
    head_out, head_lse = _attend(rows[None], keys[None], values[None], scale, softcap, None)
    head_out, head_lse = head_out[0], head_lse[0]
    head_out = head_out.view(num_kv_heads, num_seqs, group, head_size).transpose(0, 1)
    head_lse = head_lse.view(num_kv_heads, num_seqs, group).transpose(0, 1)
    # Each sequence's own blocks: [nkv, B * n, hd] -> [B, nkv, n, hd].
    tail_keys = heads_of_blocks(k_cache, shared.tail_ids, dtype=query.dtype, keys=True).view(
        num_kv_heads, num_seqs, -1, head_size).transpose(0, 1)
    tail_values = heads_of_blocks(v_cache, shared.tail_ids, dtype=query.dtype).view(
        num_kv_heads, num_seqs, -1, head_size).transpose(0, 1)
    if shared.tail_additive is None:
        shared.tail_additive = torch.zeros(shared.tail_mask.shape, device=q.device).masked_fill(
            ~shared.tail_mask, float("-inf"))
    tail_out, tail_lse = _attend(q, tail_keys, tail_values, scale, softcap, shared.tail_mask,
                                 shared.tail_additive)
    lse = torch.logaddexp(head_lse, tail_lse)
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.float().view(1, num_kv_heads, group))
    out = (head_out * (head_lse - lse).exp().unsqueeze(-1)
           + tail_out * (tail_lse - lse).exp().unsqueeze(-1))
    return out.reshape(num_seqs, num_q_heads, head_size).to(query.dtype)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
            softcap: float | None, mask: torch.Tensor | None,
            additive: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q [B, h, rows, hd] over keys/values [B, h, n, hd] in float32;
    returns (output [B, h, rows, hd], log-sum-exp of the scores [B, h, rows]). `mask` bool
    (True = seen) and `additive` the same as 0 / -inf, broadcastable to the scores."""
    if softcap is None and _FLASH_WITH_LSE is not None:
        # One op that also returns the log-sum-exp (private to PyTorch; probed at import).
        return _FLASH_WITH_LSE(q, keys.float(), values.float(), 0.0, False,
                               attn_mask=additive, scale=scale)
    scores = torch.matmul(q, keys.float().transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    weights = (scores - top).exp()
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights, values.float()) / total
    return out, (top + total.log()).squeeze(-1)


def _flash_with_lse():
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    try:
        q = torch.ones(1, 1, 2, 4)
        out, lse = op(q, q, q, 0.0, False, scale=1.0)
        return op if out.shape == q.shape and lse.shape == (1, 1, 2) else None
    except (TypeError, RuntimeError):
        return None


# (output, logsumexp) = _FLASH_WITH_LSE(q, k, v, 0.0, False, attn_mask=..., scale=...) on
# 4-D CPU float tensors; None where this PyTorch lacks it (then the explicit math runs).
_FLASH_WITH_LSE = _flash_with_lse()
