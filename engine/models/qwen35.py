"""Qwen3.5 / Qwen3.6 dense text (``Qwen3_5ForCausalLM``): a hybrid of Gated DeltaNet
(linear attention) layers and full-attention layers, three to one by default.

Matched to transformers' ``models/qwen3_5/modeling_qwen3_5.py`` (5.x):
- ``layer_types`` names each layer ``linear_attention`` or ``full_attention``; a linear
  layer's token mixer is `GatedDeltaNet` over the state pool, the full ones attend over
  the paged KV cache (their own KV group; the linear layers hold no KV);
- the full-attention layers: q_proj yields each head's query and an output gate side by
  side ([q | gate] per head), q/k RMSNorm per head, partial rotary (the first
  ``partial_rotary_factor * head_dim`` dims rotate), and the output multiplied by
  sigmoid(gate) before o_proj;
- multimodal rotary positions (engine/layers/mrope.py): text turns every section by its
  one position; an image's tokens (engine/vision/qwen35.py) by their 3-D ones;
- every RMSNorm but the linear layers' gated one scales by 1 + weight (zero-centred);
- a config without ``architectures`` is found by its model_type ``qwen3_5_text``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from engine.layers.attention import PagedSelfAttention
from engine.layers.base import Layer
from engine.layers.gated_deltanet import DeltaNetShape, GatedDeltaNet
from engine.layers.linear import StackedLinear
from engine.layers.mlp import GatedMLP
from engine.layers.mrope import MRopeEmbedding
from engine.layers.norm import GemmaRMSNorm
from engine.layers.rotary import apply_partial_rotary
from engine.models.base import CausalLM, Target
from engine.models.decoder import attention_targets, mlp_targets, norm_targets
from engine.models.spec import DecoderSpec, FamilyTraits, base_spec, rope_from_params
from kernels import AttentionBackend, AttentionMetadata

LINEAR, FULL = "linear_attention", "full_attention"
# A config flag the GGUF reader sets: llama.cpp reorders the linear layers' value heads
# from grouped by k head to tiled (every tensor alike), so k head j % k_heads serves v head j.
TILED_V_HEADS = "linear_value_heads_tiled"


@dataclass(slots=True)
class Qwen35Spec(DecoderSpec):
    layer_types: tuple[str, ...] = ()
    rotary_dim: int = 0
    deltanet: DeltaNetShape | None = None
    # M-RoPE's (time, height, width) frequency counts: image tokens' 3-D positions.
    mrope_section: tuple[int, ...] = (11, 11, 10)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == LINEAR)

    @property
    def num_kv_layers(self) -> int:
        """Layers with a KV cache: the full-attention ones."""
        return self.num_layers - len(self.linear_layers)


@dataclass(slots=True, frozen=True)
class HybridLayout:
    """What the models list and the memory estimate read of a hybrid config."""

    layer_types: tuple[str, ...]
    deltanet: DeltaNetShape

    @property
    def num_linear(self) -> int:
        return self.layer_types.count(LINEAR)

    @property
    def num_full(self) -> int:
        return self.layer_types.count(FULL)

    def state_bytes(self, itemsize: int) -> int:
        """One sequence's state across the linear layers (conv windows at ``itemsize``)."""
        return self.deltanet.state_bytes(itemsize) * self.num_linear


def hybrid_layout(config: Any) -> HybridLayout | None:
    """The layer kinds and Gated DeltaNet shape of a Qwen3.5 config (a HF config object
    or config.json's dict); None for a config without linear-attention fields."""
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    if get("linear_num_value_heads") is None:
        return None
    n = int(get("num_hidden_layers"))
    layer_types = tuple(get("layer_types") or
                        [FULL if (i + 1) % 4 == 0 else LINEAR for i in range(n)])
    if len(layer_types) != n or set(layer_types) - {LINEAR, FULL}:
        raise ValueError(f"layer_types must name {n} layers as {LINEAR!r} or {FULL!r}, "
                         f"got {list(layer_types)!r}")
    shape = DeltaNetShape(
        int(get("hidden_size")), int(get("linear_num_key_heads")),
        int(get("linear_num_value_heads")), int(get("linear_key_head_dim")),
        int(get("linear_value_head_dim")), int(get("linear_conv_kernel_dim") or 4),
        float(get("rms_norm_eps") or 1e-6), bool(get(TILED_V_HEADS)))
    if shape.num_v_heads % shape.num_k_heads:
        raise ValueError(f"linear_num_value_heads ({shape.num_v_heads}) must be a "
                         f"multiple of linear_num_key_heads ({shape.num_k_heads})")
    return HybridLayout(layer_types, shape)


def qwen35_spec(hf_config: Any, architecture: str, traits: FamilyTraits) -> Qwen35Spec:
    return Qwen35Spec(**hybrid_fields(hf_config, architecture, traits))


def hybrid_fields(hf_config: Any, architecture: str, traits: FamilyTraits,
                  size_field: str = "intermediate_size") -> dict[str, Any]:
    """The fields of a Qwen3.5 spec (``size_field``: the config's MLP width)."""
    base = base_spec(hf_config, architecture, traits, read_rope=False, size_field=size_field)
    layout = hybrid_layout(hf_config)
    if layout is None:
        raise ValueError("a Qwen3.5 config needs its linear_* fields (linear_num_value_heads)")
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    partial = float(params.pop("partial_rotary_factor", None) or
                    getattr(hf_config, "partial_rotary_factor", 0.25))
    # Text positions turn every section alike; image tokens' (engine/layers/mrope.py)
    # do not. Qwen3.5's sections are always interleaved.
    sections = tuple(int(n) for n in params.pop("mrope_section", None) or (11, 11, 10))
    params.pop("mrope_interleaved", None)
    theta, scaling = rope_from_params(params)
    shared = {f.name: getattr(base, f.name) for f in fields(DecoderSpec)}
    shared.update(rope_theta=theta, rope_scaling=scaling, qk_norm=True)
    return dict(**shared, layer_types=layout.layer_types,
                rotary_dim=int(base.head_dim * partial), deltanet=layout.deltanet,
                mrope_section=sections)


class GatedAttention(PagedSelfAttention):
    """Full attention with a sigmoid output gate computed beside the query."""

    def __init__(self, spec: Qwen35Spec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__(spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                         qkv_bias=spec.qkv_bias, o_bias=spec.o_bias,
                         qk_norm_eps=spec.rms_norm_eps, dtype=dtype, device=device,
                         norm_class=GemmaRMSNorm, rotate=apply_partial_rotary)
        q_size, kv_size = 2 * spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.qkv_proj = StackedLinear(spec.hidden_size, (q_size, kv_size, kv_size),
                                      spec.qkv_bias, dtype, device)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(hidden)
        query_gate, key, value = qkv.split((2 * h * d, kvh * d, kvh * d), dim=-1)
        query, gate = query_gate.unflatten(-1, (h, 2 * d)).chunk(2, dim=-1)
        query = self.rotate(self.q_norm(query.contiguous()), cos, sin)
        key = self.rotate(self.k_norm(key.unflatten(-1, (kvh, d))), cos, sin)
        backend.write_kv(key, value.unflatten(-1, (kvh, d)), k_cache, v_cache,
                         meta.slot_mapping)
        out = backend.attention(query.contiguous(), k_cache, v_cache, meta, self.scale)
        out = out.reshape(hidden.shape[0], h * d) * torch.sigmoid(gate.reshape(-1, h * d))
        return self.o_proj(out)


class Qwen35DecoderLayer(Layer):
    def __init__(self, spec: Qwen35Spec, kind: str, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.kind = kind
        hidden, eps = spec.hidden_size, spec.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hidden, eps, dtype, device)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps, dtype, device)
        if kind == LINEAR:
            assert spec.deltanet is not None
            self.linear_attn = GatedDeltaNet(spec.deltanet, dtype, device)
        else:
            self.self_attn = GatedAttention(spec, dtype, device)
        self.mlp = self.feed_forward(spec, dtype, device)

    def feed_forward(self, spec: Qwen35Spec, dtype: torch.dtype,
                     device: torch.device | str) -> Layer:
        """The layer's MLP: dense here, sparse in Qwen3.5-MoE."""
        return GatedMLP(spec.hidden_size, spec.intermediate_size, spec.mlp_bias, dtype, device)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache_a: torch.Tensor, cache_b: torch.Tensor, meta: Any,
                backend: AttentionBackend) -> torch.Tensor:
        """cache_a, cache_b: K and V for a full layer, conv and recurrent states for a
        linear one (``meta`` its StateMetadata)."""
        normed = self.input_layernorm(hidden)
        if self.kind == LINEAR:
            mixed = self.linear_attn(normed, cache_a, cache_b, meta)
        else:
            mixed = self.self_attn(normed, cos, sin, cache_a, cache_b, meta, backend)
        normed, hidden = self.post_attention_layernorm.add_and_norm(mixed, hidden)
        return hidden + self.mlp(normed)


class Qwen35ForCausalLM(CausalLM):
    layer_class: type[Qwen35DecoderLayer] = Qwen35DecoderLayer

    def __init__(self, spec: Qwen35Spec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__(spec, dtype, device,
                         GemmaRMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device))
        self.rotary = MRopeEmbedding(spec.rotary_dim, spec.max_position_embeddings,
                                     spec.rope_theta, spec.rope_scaling, spec.mrope_section,
                                     dtype, device)
        self.layers = nn.ModuleList(self.layer_class(spec, kind, dtype, device)
                                    for kind in spec.layer_types)

    @property
    def deltanet_shape(self) -> DeltaNetShape:
        assert self.spec.deltanet is not None
        return self.spec.deltanet

    def linear_layers(self) -> tuple[int, ...]:
        """The layers that keep a state slot per sequence instead of KV."""
        return self.spec.linear_layers

    def checkpoint_targets(self) -> dict[str, Target]:
        targets = self.shared_targets()
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            targets |= norm_targets(prefix, layer)
            if layer.kind == LINEAR:
                targets |= layer.linear_attn.checkpoint_targets(prefix + "linear_attn.")
            else:
                targets |= attention_targets(prefix, layer.self_attn, self.spec)
            targets |= self.feed_forward_targets(prefix + "mlp.", layer.mlp)
        return targets

    def feed_forward_targets(self, prefix: str, mlp: Any) -> dict[str, Target]:
        return mlp_targets(prefix, mlp, self.spec.mlp_bias)
