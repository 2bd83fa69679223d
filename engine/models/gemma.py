"""Gemma 2 and Gemma 3 (text) decoders over the paged KV cache.

What sets them apart from the Llama family, each read from the config in ``gemma_spec``:
- sandwich norms: RMSNorm before and after attention and before and after the MLP;
- GemmaRMSNorm (scale 1 + weight), embeddings multiplied by sqrt(hidden_size), GeGLU;
- the score scale query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5;
- sliding-window layers (``layer_types``): Gemma 2 alternates them with global ones,
  Gemma 3 has five to one;
- Gemma 2's tanh soft-caps on attention scores and final logits;
- Gemma 3's q/k norms and a rope per layer kind (a local base for sliding layers, the
  global base with its scaling for full ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from engine.layers.attention import PagedSelfAttention
from engine.layers.base import Layer
from engine.layers.mlp import GatedMLP
from engine.layers.norm import GemmaRMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.base import CausalLM, LayerKV, Target
from engine.models.decoder import projection_targets
from engine.models.spec import DecoderSpec, FamilyTraits, base_spec, rope_from_params
from kernels import AttentionBackend, AttentionMetadata

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(slots=True)
class GemmaSpec(DecoderSpec):
    embed_scale: float = 1.0
    attn_scale: float = 1.0
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    layer_types: tuple[str, ...] = ()
    window: int | None = None  # of the sliding layers
    # Rope per layer kind: (theta, scaling) for sliding and for full layers.
    rope: dict[str, tuple[float, dict[str, Any] | None]] = field(default_factory=dict)


def gemma_spec(hf_config: Any, architecture: str, traits: FamilyTraits) -> GemmaSpec:
    base = base_spec(hf_config, architecture, traits, act_field="hidden_activation")
    num_layers = base.num_layers
    layer_types = tuple(getattr(hf_config, "layer_types", None) or
                        [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)])
    window = checked_window(layer_types, num_layers, getattr(hf_config, "sliding_window", None))
    scalar = getattr(hf_config, "query_pre_attn_scalar", None) or base.head_dim
    shared = {f.name: getattr(base, f.name) for f in fields(DecoderSpec)}
    shared["sliding_window"] = None  # Gemma's window is per layer kind: `window` below
    return GemmaSpec(
        **shared,
        embed_scale=float(base.hidden_size) ** 0.5,
        attn_scale=float(scalar) ** -0.5,
        attn_logit_softcap=getattr(hf_config, "attn_logit_softcapping", None),
        final_logit_softcap=getattr(hf_config, "final_logit_softcapping", None),
        layer_types=layer_types,
        window=window,
        rope=_rope_by_kind(hf_config),
    )


def checked_window(layer_types: tuple[str, ...], num_layers: int, window: Any) -> int | None:
    """``layer_types`` checked to name every layer sliding or full, and the sliding
    layers' window (None where there is none)."""
    if len(layer_types) != num_layers or set(layer_types) - {SLIDING, FULL}:
        raise ValueError(f"layer_types must name {num_layers} layers as {SLIDING!r} or "
                         f"{FULL!r}, got {list(layer_types)!r}")
    if SLIDING not in layer_types:
        return None
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding_window must be a positive integer, got {window!r}")
    return window


def _rope_by_kind(hf_config: Any) -> dict[str, tuple[float, dict[str, Any] | None]]:
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and SLIDING in params:  # Gemma 3: one entry per kind
        return {kind: rope_from_params(params[kind]) for kind in (SLIDING, FULL)}
    shared = rope_from_params(params if isinstance(params, dict) else {
        "rope_theta": getattr(hf_config, "rope_theta", 10000.0)})
    return {SLIDING: shared, FULL: shared}


class GemmaDecoderLayer(Layer):
    def __init__(self, spec: GemmaSpec, kind: str, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        hidden, eps = spec.hidden_size, spec.rms_norm_eps
        self.kind = kind
        self.input_layernorm = GemmaRMSNorm(hidden, eps, dtype, device)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps, dtype, device)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps, dtype, device)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps, dtype, device)
        self.self_attn = PagedSelfAttention(
            hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim, qkv_bias=spec.qkv_bias,
            o_bias=spec.o_bias, qk_norm_eps=eps if spec.qk_norm else None, dtype=dtype,
            device=device, scale=spec.attn_scale, logit_softcap=spec.attn_logit_softcap,
            sliding_window=spec.window if kind == SLIDING else None, norm_class=GemmaRMSNorm)
        self.mlp = GatedMLP(hidden, spec.intermediate_size, spec.mlp_bias, dtype, device,
                            spec.hidden_act)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(hidden), cos, sin, k_cache, v_cache, meta,
                              backend)
        normed, hidden = self.pre_feedforward_layernorm.add_and_norm(
            self.post_attention_layernorm(attn), hidden)
        return hidden + self.post_feedforward_layernorm(self.mlp(normed))


class GemmaForCausalLM(CausalLM):
    def __init__(self, spec: GemmaSpec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__(spec, dtype, device,
                         GemmaRMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device))
        # The reference rounds the scale to the activation dtype before multiplying.
        self.register_buffer("embed_scale", torch.tensor(spec.embed_scale, dtype=dtype,
                                                         device=device), persistent=False)
        self.rotary = nn.ModuleDict({
            kind: RotaryEmbedding(spec.head_dim, spec.max_position_embeddings, theta, scaling,
                                  dtype, device)
            for kind, (theta, scaling) in spec.rope.items()})
        self.layers = nn.ModuleList(GemmaDecoderLayer(spec, kind, dtype, device)
                                    for kind in spec.layer_types)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: Sequence[LayerKV], meta: AttentionMetadata,
                backend: AttentionBackend,
                image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) * self.embed_scale
        if image_embeds is not None:
            # After the sqrt(hidden) scale, as transformers' Gemma 3 puts an image's rows
            # in place of the scaled token embeddings: image rows are never scaled.
            rows, embeds = image_embeds
            hidden = hidden.index_copy(0, rows, embeds.to(hidden.dtype))
        tables = {kind: rotary.lookup(positions) for kind, rotary in self.rotary.items()}
        for layer, (k_cache, v_cache, layer_meta) in zip(self.layers, kv_caches, strict=True):
            cos, sin = tables[layer.kind]
            hidden = layer(hidden, cos, sin, k_cache, v_cache, layer_meta, backend)
        return self.norm(hidden)

    def layer_windows(self) -> list[int | None]:
        return [self.spec.window if kind == SLIDING else None for kind in self.spec.layer_types]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return softcap(super().compute_logits(hidden), self.spec.final_logit_softcap)

    def checkpoint_targets(self) -> dict[str, Target]:
        targets = self.shared_targets()
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            for name in ("input_layernorm", "post_attention_layernorm",
                         "pre_feedforward_layernorm", "post_feedforward_layernorm"):
                targets[f"{prefix}{name}.weight"] = getattr(layer, name).weight.data
            targets |= projection_targets(prefix, layer.self_attn, layer.mlp, self.spec)
        return targets


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma's tanh cap on the final logits (None: none)."""
    return logits if cap is None else torch.tanh(logits / cap) * cap
