"""Self-attention of one decoder layer over the paged KV cache.

The layer owns the projections and the rotary step; the attention itself (and the KV
write) is the `kernels` backend's, so the same layer runs on the PyTorch reference on CPU
and on Triton kernels on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.layers.base import Layer
from engine.layers.linear import StackedLinear
from engine.layers.native import fused_cpu, native_ops, native_pool
from engine.layers.norm import RMSNorm
from engine.layers.rotary import apply_partial_rotary, apply_rotary
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
        scale: float | None = None,
        sliding_window: int | None = None,
        logit_softcap: float | None = None,
        norm_class: type[RMSNorm] = RMSNorm,
        rotate: Callable[..., torch.Tensor] = apply_rotary,
        sinks: bool = False,
    ) -> None:
        """qk_norm_eps: set for Qwen3/Gemma 3-style per-head norms of q and k before rope
        (of ``norm_class``). scale: the score scale (default head_dim ** -0.5; Gemma's
        query_pre_attn_scalar sets its own). sliding_window: attend to the last W tokens
        only. logit_softcap: Gemma 2's tanh cap on the scores. rotate: the rotary step
        (Phi-4-mini's turns only the leading dims of each head). sinks: a learned logit per
        query head in the softmax's denominator (gpt-oss; kernels.check_sinks), loaded
        into ``self.sinks``."""
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of "
                f"num_key_value_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.rotate = rotate
        # Passed to the backend only when set, so the plain path stays the plain call.
        self.attention_options = {}
        if sliding_window is not None:
            self.attention_options["sliding_window"] = sliding_window
        if logit_softcap is not None:
            self.attention_options["logit_softcap"] = logit_softcap
        self.sinks: torch.Tensor | None = None
        if sinks:
            # The backends read it in float32 whatever the model's dtype.
            self.sinks = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32,
                                                  device=device), requires_grad=False)
            self.attention_options["sinks"] = self.sinks
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = StackedLinear(hidden_size, (q_size, kv_size, kv_size), qkv_bias,
                                      dtype, device)
        self.o_proj = StackedLinear(q_size, (hidden_size,), o_bias, dtype, device)
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = norm_class(head_dim, qk_norm_eps, dtype, device)
            self.k_norm = norm_class(head_dim, qk_norm_eps, dtype, device)

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
        qkv = self.project(hidden)
        qk_heads = self.num_heads + self.num_kv_heads
        if (self.rotate in ROTATE_HALF and qkv.stride(-1) == 1
                and fused_cpu(qkv, cos, sin) and native_pool(k_cache)):
            query = self._fused_rotary_write(qkv, cos, sin, k_cache, v_cache, meta, backend)
            out = backend.attention(query, k_cache, v_cache, meta, self.scale,
                                    **self.attention_options)
            return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))
        if self.q_norm is None:
            # q and k sit side by side in the stacked output: one rotary call covers both.
            qk = self.rotate(qkv[:, :qk_heads], cos, sin)
            query, key = qk[:, : self.num_heads], qk[:, self.num_heads:]
        else:
            assert self.k_norm is not None
            query = self.rotate(self.q_norm(qkv[:, : self.num_heads]), cos, sin)
            key = self.rotate(self.k_norm(qkv[:, self.num_heads:qk_heads]), cos, sin)
        value = qkv[:, qk_heads:]
        backend.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        out = backend.attention(query, k_cache, v_cache, meta, self.scale,
                                **self.attention_options)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden_size] -> q, k and v heads side by side [T, heads, head_dim]:
        the step a family with its own treatment of the projections overrides (OLMoE's
        norms over the whole of q and of k)."""
        heads = self.num_heads + 2 * self.num_kv_heads
        return self.qkv_proj(hidden).unflatten(-1, (heads, self.head_dim))

    def _fused_rotary_write(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor,
                            meta: AttentionMetadata, backend: AttentionBackend) -> torch.Tensor:
        """The native CPU path: q and k rotated in place in the projection's output (this
        call's own tensor) and K/V written, in one op where the backend offers it."""
        query, key, value = qkv.split((self.num_heads, self.num_kv_heads, self.num_kv_heads), 1)
        if self.q_norm is not None:
            assert self.k_norm is not None
            query, key = self.q_norm(query), self.k_norm(key)
        rotary_write_kv = getattr(backend, "rotary_write_kv", None)
        if rotary_write_kv is not None:
            rotary_write_kv(query, key, value, cos, sin, k_cache, v_cache, meta.slot_mapping)
        else:
            native_ops().rotary(query, key, cos, sin)
            backend.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        return query


# The rotary steps the native op implements (rotate-half over cos.shape[-1] leading dims).
ROTATE_HALF = (apply_rotary, apply_partial_rotary)
