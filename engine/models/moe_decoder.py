"""Mixture-of-experts decoders over the paged KV cache: OLMoE, Qwen3-MoE and Mixtral.

Each is the Llama decoder with the MLP of its sparse layers replaced by a `SparseMoE`
(engine/layers/moe/): a softmax router over the experts, each token's top k. What sets
the families apart, read from the config in ``moe_spec`` and their `MoETraits`
(experts.py):

- OLMoE: RMSNorm over the whole q and k projections (not per head), an optional clamp of
  q/k/v (``clip_qkv``), the top-k probabilities left as they are (``norm_topk_prob``);
- Qwen3-MoE: Qwen3's per-head q/k norms, experts of ``moe_intermediate_size``, dense MLP
  layers where ``mlp_only_layers`` / ``decoder_sparse_step`` say, normalised top k;
- Mixtral: Mistral's attention, top k always normalised, the experts stored as
  ``block_sparse_moe.experts.N.w1/w3/w2`` (gate, up, down).

Checkpoint names are the files' (one matrix per expert); transformers 5 holds the
experts fused in memory (``mlp.experts.gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I])
and `load_weights` takes those too, split per expert.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from engine.layers.attention import PagedSelfAttention
from engine.layers.mlp import GatedMLP
from engine.layers.moe.sparse import SparseMoE
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.base import CausalLM, Target, copy_checkpoint
from engine.models.decoder import PreNormLayer, attention_targets, mlp_targets, norm_targets
from engine.models.experts import (
    MOE_TRAITS,
    Experts,
    MoETraits,
    per_expert,
    read_experts,
    sparse_targets,
)
from engine.models.spec import DecoderSpec, FamilyTraits, base_spec


@dataclass(slots=True)
class MoESpec(DecoderSpec):
    num_experts: int = 0
    top_k: int = 0
    normalize_top_k: bool = False
    expert_size: int = 0  # each expert's intermediate size
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP (of intermediate_size)
    clip_qkv: float | None = None

    @property
    def moe(self) -> MoETraits:
        return MOE_TRAITS[self.architecture]


def moe_spec(hf_config: Any, architecture: str, traits: FamilyTraits) -> MoESpec:
    base = base_spec(hf_config, architecture, traits)
    experts = read_experts(hf_config, architecture, base.hidden_act, base.intermediate_size)
    clip = getattr(hf_config, "clip_qkv", None)
    if clip is not None and (not isinstance(clip, int | float) or clip <= 0):
        raise ValueError(f"clip_qkv must be a positive number or None, got {clip!r}")
    shared = {f.name: getattr(base, f.name) for f in fields(DecoderSpec)}
    return MoESpec(
        **shared,
        num_experts=experts.num_experts,
        top_k=experts.top_k,
        normalize_top_k=experts.normalize_top_k,
        expert_size=experts.expert_size,
        dense_layers=_dense_layers(hf_config, base.num_layers),
        clip_qkv=None if clip is None else float(clip),
    )


def _dense_layers(hf_config: Any, num_layers: int) -> tuple[int, ...]:
    """Qwen3-MoE's layers with a dense MLP: those in mlp_only_layers, and those off the
    decoder_sparse_step period (transformers' rule); the other families have none."""
    only = set(getattr(hf_config, "mlp_only_layers", None) or ())
    step = getattr(hf_config, "decoder_sparse_step", None) or 1
    return tuple(i for i in range(num_layers) if i in only or (i + 1) % step)


class FullNormAttention(PagedSelfAttention):
    """OLMoE's attention: RMSNorm over the whole q projection and the whole k projection
    (all heads at once), then an optional clamp of q, k and v, before the heads split."""

    def __init__(self, spec: MoESpec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__(spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                         qkv_bias=spec.qkv_bias, o_bias=spec.o_bias, qk_norm_eps=None,
                         dtype=dtype, device=device, sliding_window=spec.sliding_window)
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.q_proj_norm = RMSNorm(self.q_size, spec.rms_norm_eps, dtype, device)
        self.k_proj_norm = RMSNorm(self.kv_size, spec.rms_norm_eps, dtype, device)
        self.clip = spec.clip_qkv

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k = qkv[:, :self.q_size], qkv[:, self.q_size:self.q_size + self.kv_size]
        q.copy_(self.q_proj_norm(q.contiguous()))
        k.copy_(self.k_proj_norm(k.contiguous()))
        if self.clip is not None:
            qkv.clamp_(-self.clip, self.clip)
        heads = self.num_heads + 2 * self.num_kv_heads
        return qkv.unflatten(-1, (heads, self.head_dim))


class MoEDecoderLayer(PreNormLayer):
    def __init__(self, spec: MoESpec, index: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        eps = spec.rms_norm_eps
        self.input_layernorm = RMSNorm(spec.hidden_size, eps, dtype, device)
        if spec.moe.full_qk_norm:
            self.self_attn: PagedSelfAttention = FullNormAttention(spec, dtype, device)
        else:
            self.self_attn = PagedSelfAttention(
                spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                qkv_bias=spec.qkv_bias, o_bias=spec.o_bias,
                qk_norm_eps=eps if spec.qk_norm else None, dtype=dtype, device=device,
                sliding_window=spec.sliding_window)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, eps, dtype, device)
        self.mlp: GatedMLP | SparseMoE
        if index in spec.dense_layers:
            self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, False, dtype, device)
        else:
            self.mlp = Experts(spec.num_experts, spec.top_k, spec.normalize_top_k,
                               spec.expert_size).block(spec.hidden_size, dtype, device)


class MoEForCausalLM(CausalLM):
    spec: MoESpec

    def __init__(self, spec: MoESpec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__(spec, dtype, device,
                         RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device))
        self.rotary = RotaryEmbedding(spec.head_dim, spec.max_position_embeddings,
                                      spec.rope_theta, spec.rope_scaling, dtype, device)
        self.layers = nn.ModuleList(
            MoEDecoderLayer(spec, i, dtype, device) for i in range(spec.num_layers))

    def checkpoint_targets(self) -> dict[str, Target]:
        """Each checkpoint name -> the tensor (or stacked slice) it fills; one matrix per
        expert, as the files store them."""
        targets = self.shared_targets()
        moe = self.spec.moe
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            targets |= norm_targets(prefix, layer)
            attn = layer.self_attn
            targets |= attention_targets(prefix, attn, self.spec)
            if isinstance(attn, FullNormAttention):
                targets[prefix + "self_attn.q_norm.weight"] = attn.q_proj_norm.weight.data
                targets[prefix + "self_attn.k_norm.weight"] = attn.k_proj_norm.weight.data
            mlp = layer.mlp
            if isinstance(mlp, GatedMLP):
                targets |= mlp_targets(f"{prefix}mlp.", mlp, False)
                continue
            targets |= sparse_targets(f"{prefix}{moe.block}.", mlp, moe.expert_names)
        return targets

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_checkpoint(self, per_expert(weights, self.spec.moe))
