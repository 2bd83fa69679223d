"""What the gated delta rule's Triton kernels share: reading a token's q or k head as the
model prepares it, and the padded sizes of a head."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def l2_normalized(x):
    """x [..., BK] float32, each row L2-normalized as the reference model does
    (x * rsqrt(|x|^2 + 1e-6)); zero padding leaves the norm as it is."""
    return x * tl.rsqrt(tl.sum(x * x, -1, keep_dims=True) + 1e-6)


@triton.jit
def load_normalized(head_ptr, rows, row_mask, stride_row, offs_k, DK: tl.constexpr):
    """Rows [R] of one q or k head (``head_ptr`` at the head's first element) as float32
    [R, BK], `l2_normalized`; masked rows and the padding past DK read 0."""
    mask = row_mask[:, None] & (offs_k < DK)[None, :]
    x = tl.load(head_ptr + rows[:, None] * stride_row + offs_k[None, :], mask=mask,
                other=0.0).to(tl.float32)
    return l2_normalized(x)


@triton.jit
def k_head_of(v_head, RATIO: tl.constexpr, K_HEADS: tl.constexpr, TILED: tl.constexpr):
    """The q/k head a value head reads: consecutive value heads share one (Hugging Face's
    order), or value head j reads k head j % K_HEADS (llama.cpp's tiled order)."""
    if TILED:
        k_head = v_head % K_HEADS
    else:
        k_head = v_head // RATIO
    return k_head


def head_pad(size: int) -> int:
    """A head size padded for tl.dot, whose operands need at least 16 along each side."""
    return max(16, triton.next_power_of_2(size))


def check_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                num_v_heads: int) -> tuple[int, int, int]:
    """(k heads, Dk, Dv) of [T, k_heads, Dk] q and k and a [T, Hv, Dv] value, checked."""
    if query.shape != key.shape or query.stride() != key.stride():
        raise ValueError(f"query and key must match in shape and strides, got "
                         f"{tuple(query.shape)} and {tuple(key.shape)}")
    if query.dim() != 3 or num_v_heads % query.shape[1]:
        raise ValueError(f"query must be [tokens, k_heads, Dk] with k_heads dividing "
                         f"{num_v_heads}, got {tuple(query.shape)}")
    if value.dim() != 3 or value.shape[1] != num_v_heads:
        raise ValueError(f"value must be [tokens, {num_v_heads}, Dv], got {tuple(value.shape)}")
    if query.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("query, key and value must be contiguous in their last dimension")
    return query.shape[1], query.shape[2], value.shape[2]
