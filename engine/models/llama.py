"""The Llama-family decoder (Llama 2/3, Mistral, SmolLM, Qwen2, Qwen3) over a paged KV cache.

The model knows nothing of scheduling: a step hands it flattened token ids and positions,
the whole-model KV cache and the attention metadata, and it returns hidden states; the
caller picks the rows to turn into logits.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.attention import PagedSelfAttention
from engine.layers.base import Layer
from engine.layers.linear import StackedLinear
from engine.layers.lm_head import LMHead
from engine.layers.mlp import GatedMLP
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.spec import DecoderSpec
from kernels import AttentionBackend, AttentionMetadata

# Checkpoints written by older transformers versions carry these buffers; they are
# recomputed from the config, never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class DecoderLayer(Layer):
    def __init__(self, spec: DecoderSpec, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.self_attn = PagedSelfAttention(
            spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
            qkv_bias=spec.qkv_bias, o_bias=spec.o_bias,
            qk_norm_eps=spec.rms_norm_eps if spec.qk_norm else None,
            dtype=dtype, device=device, sliding_window=spec.sliding_window,
        )
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype,
                                                device)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.mlp_bias, dtype,
                            device)

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
        hidden = hidden + attn_out
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaForCausalLM(nn.Module):
    def __init__(
        self, spec: DecoderSpec, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        """Parameters are allocated uninitialized; load_weights fills every one of them."""
        super().__init__()
        self.spec = spec
        self.dtype = dtype
        self.embed_tokens = nn.Parameter(
            torch.empty(spec.vocab_size, spec.hidden_size, dtype=dtype, device=device),
            requires_grad=False,
        )
        self.rotary = RotaryEmbedding(spec.head_dim, spec.max_position_embeddings,
                                      spec.rope_theta, spec.rope_scaling, dtype, device)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, dtype, device) for _ in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        tied = self.embed_tokens if spec.tie_word_embeddings else None
        self.lm_head = LMHead(spec.hidden_size, spec.vocab_size, dtype, device, tied)

    @property
    def max_context_len(self) -> int:
        """The longest context (prompt + output) this model computes exactly."""
        return self.spec.max_context_len

    def weight_bytes(self) -> int:
        """Bytes of all weights, in whichever layout holds them (packed linears)."""
        params = sum(p.numel() * p.element_size() for p in self.parameters())
        return params + sum(m.derived_bytes for m in self.modules()
                            if isinstance(m, StackedLinear))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """input_ids, positions: int64 [T]; kv_cache [L, 2, blocks, block_size, nkv, hd].
        Returns the final-norm hidden states [T, hidden_size]."""
        hidden = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self.rotary.lookup(positions)
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, cos, sin, kv_cache[index, 0], kv_cache[index, 1], meta,
                           backend)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> float32 logits [N, vocab_size]."""
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_checkpoint(self, weights)

    def checkpoint_targets(self) -> dict[str, torch.Tensor]:
        """Each Hugging Face parameter name -> the tensor (or stacked slice) it fills."""
        targets: dict[str, torch.Tensor] = {
            "model.embed_tokens.weight": self.embed_tokens.data,
            "model.norm.weight": self.norm.weight.data,
        }
        if not self.spec.tie_word_embeddings:
            targets["lm_head.weight"] = self.lm_head.block(0, "weight")
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            targets[prefix + "input_layernorm.weight"] = layer.input_layernorm.weight.data
            targets[prefix + "post_attention_layernorm.weight"] = (
                layer.post_attention_layernorm.weight.data
            )
            targets |= projection_targets(prefix, layer.self_attn, layer.mlp, self.spec)
        return targets


def projection_targets(prefix: str, attn: PagedSelfAttention, mlp: GatedMLP,
                       spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """One layer's attention and MLP parameters by Hugging Face name: q/k/v and gate/up land
    in blocks of their stacked matrices."""
    targets: dict[str, torch.Tensor] = {}
    kinds = ("weight", "bias") if spec.qkv_bias else ("weight",)
    for index, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        for kind in kinds:
            targets[f"{prefix}self_attn.{proj}.{kind}"] = attn.qkv_proj.block(index, kind)
    kinds = ("weight", "bias") if spec.o_bias else ("weight",)
    for kind in kinds:
        targets[f"{prefix}self_attn.o_proj.{kind}"] = attn.o_proj.block(0, kind)
    if attn.q_norm is not None and attn.k_norm is not None:
        targets[prefix + "self_attn.q_norm.weight"] = attn.q_norm.weight.data
        targets[prefix + "self_attn.k_norm.weight"] = attn.k_norm.weight.data
    kinds = ("weight", "bias") if spec.mlp_bias else ("weight",)
    for index, proj in enumerate(("gate_proj", "up_proj")):
        for kind in kinds:
            targets[f"{prefix}mlp.{proj}.{kind}"] = mlp.gate_up_proj.block(index, kind)
    for kind in kinds:
        targets[f"{prefix}mlp.down_proj.{kind}"] = mlp.down_proj.block(0, kind)
    return targets


def copy_checkpoint(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy a full checkpoint given as (Hugging Face name, tensor) pairs into ``model``'s
    checkpoint targets, in one call, then let stacked linears pack their matrices.

    Raises ValueError for a name the config does not expect, a shape that does not match
    the config, or missing names."""
    spec = model.spec
    targets = model.checkpoint_targets()
    loaded: set[str] = set()
    with torch.no_grad():
        for name, tensor in weights:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if name == "lm_head.weight" and spec.tie_word_embeddings:
                # Some tied checkpoints store the shared matrix twice.
                continue
            target = targets.get(name)
            if target is None:
                raise ValueError(f"unexpected parameter {name!r} for {spec.architecture} "
                                 f"with {spec.num_layers} layers")
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"parameter {name!r} has shape {tuple(tensor.shape)} in the checkpoint "
                    f"but the config expects {tuple(target.shape)}")
            target.copy_(tensor)
            loaded.add(name)
    missing = sorted(set(targets) - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if
                                           len(missing) > 8 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} parameter(s): {shown}")
    for module in model.modules():
        if isinstance(module, StackedLinear):
            module.prepare()
