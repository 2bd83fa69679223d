"""The gated delta rule's recurrent step (Triton): one token for each of a batch of
sequences, each reading and rewriting its state in the state pool in place.

    S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q

q and k arrive as the conv leaves them (one head per k head); the kernel L2-normalizes
them, scales q by Dk ** -0.5 and maps each value head to its k head, so no repeated copy
of q and k is made. One program per (row, value head, block of BV value columns) holds its
[Dk, BV] slice of the state in registers: the step reads and writes each state once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.delta_rule_common import check_heads, head_pad, k_head_of, l2_normalized

DECODE_BV = 32  # value columns per program: a [128, 32] float32 tile of the state


@triton.jit
def _recurrent_step_kernel(
    q_ptr, k_ptr,  # [B, Hk, Dk] (same strides)
    v_ptr,  # [B, Hv, Dv]
    g_ptr, beta_ptr,  # float32 [B, Hv]
    state_ptr,  # float32 [slots, Hv, Dk, Dv], contiguous in its last two dimensions
    slot_ptr,  # int64 [B]: each row's slot
    out_ptr,  # float32 [B, Hv, Dv]
    stride_qb, stride_qh, stride_vb, stride_vh, stride_gb, stride_betab,
    stride_slot, stride_sh, stride_ob, stride_oh,
    scale,  # Dk ** -0.5
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    RATIO: tl.constexpr, K_HEADS: tl.constexpr, TILED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    k_head = k_head_of(head, RATIO, K_HEADS, TILED)
    qk = row * stride_qb + k_head * stride_qh + offs_k
    q = l2_normalized(tl.load(q_ptr + qk, mask=mask_k, other=0.0).to(tl.float32))
    q = q * scale
    k = l2_normalized(tl.load(k_ptr + qk, mask=mask_k, other=0.0).to(tl.float32))
    v = tl.load(v_ptr + row * stride_vb + head * stride_vh + offs_v, mask=mask_v,
                other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * stride_gb + head)
    beta = tl.load(beta_ptr + row * stride_betab + head)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    tile = (state_ptr + slot * stride_slot + head * stride_sh + offs_k[:, None] * DV
            + offs_v[None, :])
    tile_mask = mask_k[:, None] & mask_v[None, :]
    state = tl.load(tile, mask=tile_mask, other=0.0) * tl.exp(g)
    delta = (v - tl.sum(state * k[:, None], 0)) * beta  # [BV]
    state += k[:, None] * delta[None, :]
    tl.store(tile, state, mask=tile_mask)
    out = tl.sum(state * q[:, None], 0)
    tl.store(out_ptr + row * stride_ob + head * stride_oh + offs_v, out, mask=mask_v)


def recurrent_step(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor,
                   slots: torch.Tensor, tiled: bool = False) -> torch.Tensor:
    """query, key [B, Hk, Dk] (the conv's output, not yet normalized), value [B, Hv, Dv],
    g, beta float32 [B, Hv], states float32 [slots, Hv, Dk, Dv] (updated in place at
    ``slots``, int64 [B], distinct) -> out float32 [B, Hv, Dv]."""
    batch, num_v_heads = value.shape[0], value.shape[1]
    k_heads, dk, dv = check_heads(query, key, value, num_v_heads)
    if states.dtype != torch.float32 or states.shape[1:] != (num_v_heads, dk, dv):
        raise ValueError(f"states must be float32 [slots, {num_v_heads}, {dk}, {dv}], got "
                         f"{states.dtype} {tuple(states.shape)}")
    if states.stride(-1) != 1 or states.stride(-2) != dv:
        raise ValueError("states must be contiguous in their last two dimensions")
    out = torch.empty(batch, num_v_heads, dv, dtype=torch.float32, device=value.device)
    if batch == 0:
        return out
    g, beta = g.float().contiguous(), beta.float().contiguous()
    block_v = min(DECODE_BV, head_pad(dv))
    grid = (batch, num_v_heads, triton.cdiv(dv, block_v))
    _recurrent_step_kernel[grid](
        query, key, value, g, beta, states, slots.to(torch.int64), out,
        query.stride(0), query.stride(1), value.stride(0), value.stride(1), g.stride(0),
        beta.stride(0), states.stride(0), states.stride(1), out.stride(0), out.stride(1),
        dk ** -0.5, DK=dk, DV=dv, BK=head_pad(dk), BV=block_v, RATIO=num_v_heads // k_heads,
        K_HEADS=k_heads, TILED=tiled,
    )
    return out
