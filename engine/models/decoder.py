"""The pre-norm decoder layer and the checkpoint names of its parts, shared by the
families built on it: Llama (llama.py), the mixtures of experts (moe_decoder.py,
gpt_oss.py), and for the names alone Gemma, Gemma 4 and Qwen3.5.

`PreNormLayer` is a layer's step (norm, attention, residual add and norm, MLP or mixture
of experts, residual add), which runs as one native call where its parts allow
(`native_step`); `projection_targets`, `attention_targets` and `mlp_targets` give a
layer's attention and MLP parameters by their Hugging Face names.
"""

from __future__ import annotations

import torch

from engine.layers.attention import PagedSelfAttention
from engine.layers.base import Layer
from engine.layers.linear import StackedLinear
from engine.layers.mlp import GatedMLP
from engine.layers.native_layer import native_decoder_layer
from engine.layers.norm import RMSNorm
from engine.models.base import Target
from engine.models.spec import DecoderSpec
from kernels import AttentionBackend, AttentionMetadata


class PreNormLayer(Layer):
    """A pre-norm decoder layer's step: norm, attention, residual add and norm, MLP (or
    mixture of experts), residual add. Subclasses build the four parts."""

    input_layernorm: RMSNorm
    self_attn: PagedSelfAttention
    post_attention_layernorm: RMSNorm
    mlp: Layer

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
        attn_out = self.self_attn(self.input_layernorm(hidden), cos, sin, k_cache, v_cache,
                                  meta, backend)
        normed, hidden = self.post_attention_layernorm.add_and_norm(attn_out, hidden)
        return hidden + self.mlp(normed)

    def native_step(self):
        """This forward as one native call (engine/layers/native_layer.py), or None where
        a subclass changes the forward or a part needs its module."""
        if type(self).forward is not PreNormLayer.forward:
            return None
        return native_decoder_layer(self.input_layernorm, self.self_attn,
                                    self.post_attention_layernorm, self.mlp)


def projection_targets(prefix: str, attn: PagedSelfAttention, mlp: GatedMLP,
                       spec: DecoderSpec) -> dict[str, Target]:
    """One layer's attention and MLP parameters by Hugging Face name: q/k/v and gate/up land
    in blocks of their stacked matrices."""
    return attention_targets(prefix, attn, spec) | mlp_targets(f"{prefix}mlp.", mlp,
                                                               spec.mlp_bias)


def norm_targets(prefix: str, layer) -> dict[str, Target]:
    """A decoder layer's two norms by Hugging Face name (before attention, before the
    MLP)."""
    return {prefix + "input_layernorm.weight": layer.input_layernorm.weight.data,
            prefix + "post_attention_layernorm.weight":
                layer.post_attention_layernorm.weight.data}


def attention_targets(prefix: str, attn: PagedSelfAttention,
                      spec: DecoderSpec) -> dict[str, Target]:
    """One layer's attention parameters by Hugging Face name (q/k/v in blocks of the stacked
    matrix, and the per-head q/k norms where the layer has them)."""
    targets: dict[str, Target] = {}
    kinds = ("weight", "bias") if spec.qkv_bias else ("weight",)
    for index, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        for kind in kinds:
            targets[f"{prefix}self_attn.{proj}.{kind}"] = _target(attn.qkv_proj, index, kind)
    kinds = ("weight", "bias") if spec.o_bias else ("weight",)
    for kind in kinds:
        targets[f"{prefix}self_attn.o_proj.{kind}"] = _target(attn.o_proj, 0, kind)
    if attn.q_norm is not None and attn.k_norm is not None:
        targets[prefix + "self_attn.q_norm.weight"] = attn.q_norm.weight.data
        targets[prefix + "self_attn.k_norm.weight"] = attn.k_norm.weight.data
    return targets


def mlp_targets(prefix: str, mlp: GatedMLP, bias: bool,
                names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
                ) -> dict[str, Target]:
    """A gated MLP's matrices under `prefix` by their checkpoint names (gate, up, down:
    Mixtral's experts call them w1, w3, w2); gate and up land in the stacked matrix."""
    targets: dict[str, Target] = {}
    kinds = ("weight", "bias") if bias else ("weight",)
    for index, proj in enumerate(names[:2]):
        for kind in kinds:
            targets[f"{prefix}{proj}.{kind}"] = _target(mlp.gate_up_proj, index, kind)
    for kind in kinds:
        targets[f"{prefix}{names[2]}.{kind}"] = _target(mlp.down_proj, 0, kind)
    return targets


def _target(linear: StackedLinear, index: int, kind: str) -> Target:
    return linear.slot(index) if kind == "weight" else linear.block(index, kind)
