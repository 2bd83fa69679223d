"""Phi-3 and Phi-4-mini (``Phi3ForCausalLM``) over the paged KV cache.

The decoder is the Llama one (pre-norm RMSNorm, grouped-query attention, gated SiLU MLP,
optionally tied LM head); what sets it apart, each matched to transformers'
``models/phi3/modeling_phi3.py`` (5.x):

- fused checkpoint matrices: ``self_attn.qkv_proj.weight`` (q, k, v rows in that order)
  and ``mlp.gate_up_proj.weight`` (gate rows, then up rows), which is exactly how our
  StackedLinear stacks them, so each loads whole into its layer (``checkpoint_targets``);
  no biases anywhere, whatever the config says (``phi3_spec``);
- partial rotary (Phi-4-mini: ``partial_rotary_factor`` 0.75): only the first
  ``rotary_dim = int(head_dim * factor)`` dims of each q/k head rotate, rotate-half paired
  within them (i with i + rotary_dim // 2), the rest pass through; the base frequencies
  are those of a ``rotary_dim``-wide head (``apply_partial_rotary``, the attention's rotary step);
- LongRoPE (the 128k variants, Phi-4-mini): per-pair rescale factors, short ones while a
  sequence is within ``original_max_position_embeddings``, long ones past it, and an
  attention factor applied to cos and sin (``LongRopeEmbedding`` in engine/layers/rotary.py
  documents the per-sequence rule); ``original_max_position_embeddings`` at the config's
  top level wins over the one in ``rope_parameters``, and the legacy rope types ``su`` and
  ``yarn`` mean LongRoPE, as Phi3Config reads them;
- ``sliding_window``: transformers 5 masks attention to the last W tokens whenever the
  config sets one (Phi-3-mini-4k: 2047), so the window goes to PagedSelfAttention and the
  context is the whole max_position_embeddings; a window at least that long hides nothing
  and is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from engine.layers.attention import PagedSelfAttention
from engine.layers.base import Layer
from engine.layers.mlp import GatedMLP
from engine.layers.norm import RMSNorm
from engine.layers.rotary import (
    LongRopeEmbedding,
    RotaryEmbedding,
    apply_partial_rotary,
    longrope_attention_factor,
)
from engine.models.base import CausalLM, Target
from engine.models.spec import DecoderSpec, FamilyTraits, base_spec
from kernels import AttentionBackend, AttentionMetadata

# Rope types Phi3Config accepts; "su" and "yarn" are older names it maps to "longrope".
_LONGROPE_NAMES = ("longrope", "su", "yarn")


@dataclass(slots=True)
class Phi3Spec(DecoderSpec):
    rotary_dim: int = 0  # the leading dims of each head that rotate
    # LongRoPE (None for the plain rope): per-pair rescale factors, the pretraining length
    # that switches between them, and the scale of cos and sin.
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float = 1.0


def phi3_spec(hf_config: Any, architecture: str, traits: FamilyTraits) -> Phi3Spec:
    base = base_spec(hf_config, architecture, traits, read_rope=False)
    params = _rope_params(hf_config)
    theta = float(params.get("rope_theta") or 10000.0)
    partial = params.get("partial_rotary_factor")
    if partial is None:
        partial = getattr(hf_config, "partial_rotary_factor", None)
    partial = 1.0 if partial is None else float(partial)
    rotary_dim = int(base.head_dim * partial)
    if not 0 < rotary_dim <= base.head_dim or rotary_dim % 2:
        raise ValueError(f"partial_rotary_factor {partial} gives {rotary_dim} rotary dims of "
                         f"a {base.head_dim}-dim head; they must be even and 1..head_dim")
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    window = base.sliding_window
    if window is not None and window >= base.max_position_embeddings:
        window = None
    shared = {f.name: getattr(base, f.name) for f in fields(DecoderSpec)}
    # Phi-3 has no biases: transformers builds every projection with bias=False.
    shared |= dict(rope_theta=theta, rope_scaling=None, qkv_bias=False, o_bias=False,
                   mlp_bias=False, sliding_window=window)
    if rope_type == "default":
        return Phi3Spec(**shared, rotary_dim=rotary_dim)
    if rope_type not in _LONGROPE_NAMES:
        raise ValueError(f"rope type {rope_type!r} is not supported for Phi-3; supported: "
                         "default, longrope")
    short, long = (_factors(params, key, rotary_dim) for key in ("short_factor", "long_factor"))
    # Phi3Config's own top-level field wins over rope_parameters' (standardize_rope_params).
    original = (getattr(hf_config, "original_max_position_embeddings", None)
                or params.get("original_max_position_embeddings")
                or base.max_position_embeddings)
    attention_factor = longrope_attention_factor(
        base.max_position_embeddings, int(original), params.get("factor"),
        params.get("attention_factor"))
    shared["rope_scaling"] = {
        "rope_type": "longrope", "short_factor": list(short), "long_factor": list(long),
        "original_max_position_embeddings": int(original),
        "attention_factor": attention_factor}
    return Phi3Spec(**shared, rotary_dim=rotary_dim, short_factor=short, long_factor=long,
                    original_max_position_embeddings=int(original),
                    attention_factor=attention_factor)


def _rope_params(hf_config: Any) -> dict[str, Any]:
    """transformers 5's rope_parameters, else an older config's rope_scaling, with the
    top-level rope_theta when the dict lacks one."""
    params = getattr(hf_config, "rope_parameters", None)
    if not isinstance(params, Mapping):
        params = getattr(hf_config, "rope_scaling", None)
    params = dict(params) if isinstance(params, Mapping) else {}
    if params.get("rope_theta") is None and getattr(hf_config, "rope_theta", None) is not None:
        params["rope_theta"] = hf_config.rope_theta
    return params


def _factors(params: Mapping[str, Any], key: str, rotary_dim: int) -> tuple[float, ...]:
    values = params.get(key)
    if not isinstance(values, (list, tuple)) or len(values) != rotary_dim // 2:
        count = len(values) if isinstance(values, (list, tuple)) else values
        raise ValueError(f"LongRoPE's {key} must list {rotary_dim // 2} numbers (rotary dims "
                         f"/ 2), got {count!r}")
    return tuple(float(v) for v in values)


class Phi3DecoderLayer(Layer):
    def __init__(self, spec: Phi3Spec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.self_attn = PagedSelfAttention(
            spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim, qkv_bias=False,
            o_bias=False, qk_norm_eps=None, dtype=dtype, device=device,
            sliding_window=spec.sliding_window, rotate=apply_partial_rotary)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype,
                                                device)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, False, dtype, device,
                            spec.hidden_act)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        attn_out = self.self_attn(self.input_layernorm(hidden), cos, sin, k_cache, v_cache,
                                  meta, backend)
        normed, hidden = self.post_attention_layernorm.add_and_norm(attn_out, hidden)
        return hidden + self.mlp(normed)


class Phi3ForCausalLM(CausalLM):
    def __init__(self, spec: Phi3Spec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__(spec, dtype, device,
                         RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device))
        self.rotary: RotaryEmbedding | LongRopeEmbedding
        if spec.long_factor is None or spec.short_factor is None:
            self.rotary = RotaryEmbedding(spec.rotary_dim, spec.max_position_embeddings,
                                          spec.rope_theta, None, dtype, device)
        else:
            assert spec.original_max_position_embeddings is not None
            self.rotary = LongRopeEmbedding(
                spec.rotary_dim, spec.max_position_embeddings, spec.rope_theta,
                spec.short_factor, spec.long_factor, spec.original_max_position_embeddings,
                spec.attention_factor, dtype, device)
        self.layers = nn.ModuleList(Phi3DecoderLayer(spec, dtype, device)
                                    for _ in range(spec.num_layers))

    def checkpoint_targets(self) -> dict[str, Target]:
        """Each Hugging Face parameter name -> the tensor it fills; the fused qkv_proj and
        gate_up_proj fill their stacked matrices whole."""
        targets = self.shared_targets()
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            targets |= {
                prefix + "input_layernorm.weight": layer.input_layernorm.weight.data,
                prefix + "post_attention_layernorm.weight":
                    layer.post_attention_layernorm.weight.data,
                # Fused in the checkpoint, in the order of our stacked blocks.
                prefix + "self_attn.qkv_proj.weight": attn.qkv_proj.slot(),
                prefix + "self_attn.o_proj.weight": attn.o_proj.slot(0),
                prefix + "mlp.gate_up_proj.weight": mlp.gate_up_proj.slot(),
                prefix + "mlp.down_proj.weight": mlp.down_proj.slot(0),
            }
        return targets

