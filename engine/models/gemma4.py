"""Gemma 4 (text) over the paged KV cache.

Gemma 3's layout (sandwich norms, sliding and global layers, a rope per kind, GeGLU,
embeddings times sqrt(hidden_size)), with these changes, each read from the config in
``gemma4_spec`` (gemma4_spec.py):
- RMSNorm scales by its weight (not 1 + weight), and values get a weightless RMSNorm;
- the score scale is 1 (the q/k norms already set the scale);
- global layers have heads of their own size (``global_head_dim``) and may share one
  projection for keys and values (``attention_k_eq_v``, with ``num_global_key_value_heads``);
- global layers' rope is "proportional": only a share of each head's pairs turn;
- per-layer embeddings (PLE): a second token table, mixed with a projection of the
  embeddings, gates a small residual update at the end of every layer;
- the last ``num_kv_shared_layers`` layers compute no K/V: each reads the K/V of the last
  earlier layer of its kind, so they keep no KV cache (and may have a double-wide MLP);
- each layer's output is multiplied by a stored ``layer_scalar``.
The mixture-of-experts variant (``enable_moe_block``) and bidirectional attention are
refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.base import Layer
from engine.layers.embedding import Embedding
from engine.layers.linear import StackedLinear
from engine.layers.mlp import ACTIVATIONS, GatedMLP
from engine.layers.native import fused_cpu, native_ops
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding, apply_rotary, proportional_inv_freq
from engine.models.base import CausalLM, LayerKV, Target
from engine.models.decoder import mlp_targets
from engine.models.gemma import FULL, SLIDING, softcap
from engine.models.gemma4_spec import Gemma4Spec
from kernels import AttentionBackend, AttentionMetadata


class Gemma4RMSNorm(RMSNorm):
    """Scales by the weight itself, in float32 before the cast back (as the reference)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_cpu(x, self.weight):
            return native_ops().rms_norm(x, self.weight, self.eps, 0.0)
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return F.rms_norm(x.float(), self.weight.shape, self.weight.float(),
                          self.eps).to(x.dtype)


class Gemma4Attention(Layer):
    """q (and, where the layer keeps K/V, k and v) projections, per-head norms, rope, and
    paged attention at scale 1; a layer reading another's K/V writes nothing."""

    def __init__(self, spec: Gemma4Spec, layer: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        kv_heads, head_dim = spec.layer_heads[layer]
        kind = spec.layer_types[layer]
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, kv_heads, head_dim
        self.eps = spec.rms_norm_eps
        self.owns_kv = spec.kv_source[layer] == layer
        self.k_eq_v = spec.k_eq_v and kind == FULL
        kv = kv_heads * head_dim
        sizes = (spec.num_heads * head_dim,)
        if self.owns_kv:
            sizes += (kv,) if self.k_eq_v else (kv, kv)
        self.qkv_proj = StackedLinear(spec.hidden_size, sizes, False, dtype, device)
        self.o_proj = StackedLinear(spec.num_heads * head_dim, (spec.hidden_size,), False,
                                    dtype, device)
        self.q_norm = Gemma4RMSNorm(head_dim, self.eps, dtype, device)
        self.k_norm = Gemma4RMSNorm(head_dim, self.eps, dtype, device) if self.owns_kv else None
        self.options = {"sliding_window": spec.window} if kind == SLIDING else {}

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        heads = self.qkv_proj(hidden).unflatten(-1, (-1, self.head_dim))
        query = apply_rotary(self.q_norm(heads[:, : self.num_heads]), cos, sin)
        if self.k_norm is not None:
            key = heads[:, self.num_heads: self.num_heads + self.num_kv_heads]
            value = key if self.k_eq_v else heads[:, self.num_heads + self.num_kv_heads:]
            value = F.rms_norm(value.float(), (self.head_dim,), None, self.eps).to(value.dtype)
            key = apply_rotary(self.k_norm(key), cos, sin)
            backend.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        out = backend.attention(query.contiguous(), k_cache, v_cache, meta, 1.0,
                                **self.options)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class Gemma4DecoderLayer(Layer):
    def __init__(self, spec: Gemma4Spec, layer: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        hidden, eps = spec.hidden_size, spec.rms_norm_eps
        self.kind = spec.layer_types[layer]
        for name in _LAYER_NORMS:
            setattr(self, name, Gemma4RMSNorm(hidden, eps, dtype, device))
        self.self_attn = Gemma4Attention(spec, layer, dtype, device)
        self.mlp = GatedMLP(hidden, spec.layer_intermediate[layer], False, dtype, device,
                            spec.hidden_act)
        self.layer_scalar = nn.Parameter(torch.empty(1, dtype=dtype, device=device),
                                         requires_grad=False)
        self.ple = spec.ple_size > 0
        if self.ple:
            self.act = ACTIVATIONS[spec.hidden_act]
            self.per_layer_input_gate = StackedLinear(hidden, (spec.ple_size,), False, dtype,
                                                      device)
            self.per_layer_projection = StackedLinear(spec.ple_size, (hidden,), False, dtype,
                                                      device)
            self.post_per_layer_input_norm = Gemma4RMSNorm(hidden, eps, dtype, device)

    def forward(self, hidden: torch.Tensor, per_layer: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, kv: LayerKV, backend: AttentionBackend) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(hidden), cos, sin, *kv, backend)
        hidden = hidden + self.post_attention_layernorm(attn)
        hidden = hidden + self.post_feedforward_layernorm(
            self.mlp(self.pre_feedforward_layernorm(hidden)))
        if per_layer is not None:
            gate = self.act(self.per_layer_input_gate(hidden)) * per_layer
            hidden = hidden + self.post_per_layer_input_norm(self.per_layer_projection(gate))
        return hidden * self.layer_scalar


_LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm")


class Gemma4ForCausalLM(CausalLM):
    def __init__(self, spec: Gemma4Spec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__(spec, dtype, device,
                         Gemma4RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device))
        # The reference rounds each scale to the activation dtype before multiplying.
        self.embed_scale = float(torch.tensor(spec.hidden_size ** 0.5, dtype=dtype))
        head_dims = {kind: spec.layer_heads[spec.layer_types.index(kind)][1]
                     for kind in set(spec.layer_types)}
        self.rotary = nn.ModuleDict({
            kind: RotaryEmbedding(head_dims[kind], spec.max_position_embeddings, theta, None,
                                  dtype, device,
                                  proportional_inv_freq(head_dims[kind], theta, share, factor))
            for kind, theta, share, factor in spec.rope})
        self.layers = nn.ModuleList(Gemma4DecoderLayer(spec, i, dtype, device)
                                    for i in range(spec.num_layers))
        owners = [i for i, source in enumerate(spec.kv_source) if source == i]
        # Each decoder layer's entry in the KV caches, which hold only the owners' K/V.
        self.kv_index = [owners.index(source) for source in spec.kv_source]
        self.owners = owners
        if spec.ple_size:
            width = spec.num_layers * spec.ple_size
            self.embed_tokens_per_layer = Embedding(spec.ple_vocab, width, dtype, device)
            self.ple_scale = float(torch.tensor(spec.ple_size ** 0.5, dtype=dtype))
            self.per_layer_model_projection = StackedLinear(spec.hidden_size, (width,), False,
                                                            dtype, device)
            self.per_layer_projection_norm = Gemma4RMSNorm(spec.ple_size, spec.rms_norm_eps,
                                                           dtype, device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: Sequence[LayerKV], meta: AttentionMetadata,
                backend: AttentionBackend,
                image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) * self.embed_scale
        ple_ids = input_ids
        if image_embeds is not None:
            # As transformers' Gemma4Model: an image row's token-identity per-layer input
            # is the pad token's; its embedding (unscaled) replaces the scaled one, and
            # the per-layer projection reads the merged embeddings.
            rows, embeds = image_embeds
            ple_ids = input_ids.index_copy(0, rows, torch.full_like(rows, self.spec.pad_token_id))
            hidden = hidden.index_copy(0, rows, embeds.to(hidden.dtype))
        per_layer = self._per_layer_inputs(ple_ids, hidden)
        tables = {kind: rotary.lookup(positions) for kind, rotary in self.rotary.items()}
        for i, layer in enumerate(self.layers):
            cos, sin = tables[layer.kind]
            hidden = layer(hidden, None if per_layer is None else per_layer[:, i], cos, sin,
                           kv_caches[self.kv_index[i]], backend)
        return self.norm(hidden)

    def _per_layer_inputs(self, input_ids: torch.Tensor,
                          embeds: torch.Tensor) -> torch.Tensor | None:
        """[T, layers, ple_size]: the token's own per-layer rows mixed with a normed
        projection of its embedding (transformers' project_per_layer_inputs)."""
        spec = self.spec
        if not spec.ple_size:
            return None
        shape = (input_ids.shape[0], spec.num_layers, spec.ple_size)
        rows = (self.embed_tokens_per_layer(input_ids) * self.ple_scale).reshape(shape)
        projected = self.per_layer_projection_norm(
            (self.per_layer_model_projection(embeds) * spec.hidden_size ** -0.5).reshape(shape))
        return (projected + rows) * 2.0 ** -0.5

    def layer_windows(self) -> list[int | None]:
        return [self.spec.window if self.spec.layer_types[i] == SLIDING else None
                for i in self.owners]

    def kv_heads(self) -> list[tuple[int, int]]:
        return [self.spec.layer_heads[i] for i in self.owners]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return softcap(super().compute_logits(hidden), self.spec.final_logit_softcap)

    def checkpoint_targets(self) -> dict[str, Target]:
        targets = self.shared_targets()
        if self.spec.ple_size:
            targets["model.embed_tokens_per_layer.weight"] = self.embed_tokens_per_layer.slot()
            targets["model.per_layer_model_projection.weight"] = (
                self.per_layer_model_projection.slot(0))
            targets["model.per_layer_projection_norm.weight"] = (
                self.per_layer_projection_norm.weight.data)
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            for name in _LAYER_NORMS:
                targets[f"{prefix}{name}.weight"] = getattr(layer, name).weight.data
            targets[f"{prefix}layer_scalar"] = layer.layer_scalar.data
            attn = layer.self_attn
            projections = ["q_proj"]
            if attn.owns_kv:
                projections += ["k_proj"] if attn.k_eq_v else ["k_proj", "v_proj"]
                targets[f"{prefix}self_attn.k_norm.weight"] = attn.k_norm.weight.data
            for index, proj in enumerate(projections):
                targets[f"{prefix}self_attn.{proj}.weight"] = attn.qkv_proj.slot(index)
            targets[f"{prefix}self_attn.o_proj.weight"] = attn.o_proj.slot(0)
            targets[f"{prefix}self_attn.q_norm.weight"] = attn.q_norm.weight.data
            targets |= mlp_targets(f"{prefix}mlp.", layer.mlp, False)
            if layer.ple:
                targets[f"{prefix}per_layer_input_gate.weight"] = (
                    layer.per_layer_input_gate.slot(0))
                targets[f"{prefix}per_layer_projection.weight"] = (
                    layer.per_layer_projection.slot(0))
                targets[f"{prefix}post_per_layer_input_norm.weight"] = (
                    layer.post_per_layer_input_norm.weight.data)
        return targets
