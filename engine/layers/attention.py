"""Self-attention of one decoder layer over the paged KV cache.

The layer owns the projections and the rotary step; the attention itself (and the KV
write) is the `kernels` backend's, so the same layer runs on the PyTorch reference on CPU
and on Triton kernels on CUDA.
"""

from __future__ import annotations

import torch

from engine.layers.base import Layer
from engine.layers.linear import StackedLinear
from engine.layers.norm import RMSNorm
from engine.layers.rotary import apply_rotary
from kernels import AttentionBackend, AttentionMetadata


class PagedSelfAttention(Layer):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm_eps: float | None,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        """qk_norm_eps: set for Qwen3-style per-head RMSNorm of q and k before rope."""
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of "
                f"num_key_value_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = StackedLinear(hidden_size, (q_size, kv_size, kv_size), qkv_bias,
                                      dtype, device)
        self.o_proj = StackedLinear(q_size, (hidden_size,), o_bias, dtype, device)
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, dtype, device)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, dtype, device)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """hidden [T, hidden_size] -> [T, hidden_size]; cos/sin from RotaryEmbedding.lookup."""
        num_tokens = hidden.shape[0]
        heads = self.num_heads + 2 * self.num_kv_heads
        qkv = self.qkv_proj(hidden).unflatten(-1, (heads, self.head_dim))
        qk_heads = self.num_heads + self.num_kv_heads
        if self.q_norm is None:
            # q and k sit side by side in the stacked output: one rotary call covers both.
            qk = apply_rotary(qkv[:, :qk_heads], cos, sin)
            query, key = qk[:, : self.num_heads], qk[:, self.num_heads:]
        else:
            assert self.k_norm is not None
            query = apply_rotary(self.q_norm(qkv[:, : self.num_heads]), cos, sin)
            key = apply_rotary(self.k_norm(qkv[:, self.num_heads:qk_heads]), cos, sin)
        value = qkv[:, qk_heads:]
        backend.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        out = backend.attention(query, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))
