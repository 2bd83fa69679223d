"""What every model class shares: the input embedding, the LM head (tied or not), the
final norm's place, weight accounting and checkpoint loading.

A family's class builds its layers, rotary tables and forward; the checkpoint's names
come from its ``checkpoint_targets`` (the one source of names and shapes, which the
loaders' shape check reads too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from engine.layers.embedding import Embedding
from engine.layers.linear import StackedLinear, WeightSlot
from engine.layers.lm_head import LMHead
from engine.layers.moe.sparse import SparseMoE
from engine.layers.native_layer import NativeLayers
from engine.models.spec import DecoderSpec
from kernels import AttentionBackend, AttentionMetadata
from kernels.quant.formats import QuantizedTensor
from kernels.quant.matrix import dequantize_cpu

# A checkpoint tensor's destination: a float tensor (norms, biases) or a weight slot.
Target = torch.Tensor | WeightSlot

# One layer's KV cache and the metadata of its KV group: (k_cache, v_cache, meta). A
# forward gets one per layer (the runner's pool tensors are one per KV group,
# engine/core/kv_cache_manager.py).
LayerKV = tuple[torch.Tensor, torch.Tensor, AttentionMetadata]


def pool_layers(kv_cache: torch.Tensor, meta: AttentionMetadata) -> list[LayerKV]:
    """Each layer's K and V views of one pool tensor [L, 2, blocks, ...] holding every
    layer, all with ``meta``: how a test or script without a runner calls a model."""
    return [(*layer.unbind(0), meta) for layer in kv_cache.unbind(0)]


# Checkpoints written by older transformers versions carry these buffers; they are
# recomputed from the config, never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CausalLM(nn.Module):
    def __init__(self, spec: DecoderSpec, dtype: torch.dtype, device: torch.device | str,
                 norm: nn.Module) -> None:
        """Parameters are allocated uninitialized; load_weights fills every one of them.
        ``norm`` is the final norm (the family's kind)."""
        super().__init__()
        self.spec = spec
        self.dtype = dtype
        self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size, dtype, device)
        self.norm = norm
        tied = self.embed_tokens if spec.tie_word_embeddings else None
        self.lm_head = LMHead(spec.hidden_size, spec.vocab_size, dtype, device, tied)
        # Each layer's native step (engine/layers/native_layer.py), built at the first
        # forward, when the weights' storages are chosen.
        self.native_layers: NativeLayers | None = None

    @property
    def max_context_len(self) -> int:
        """The longest context (prompt + output) this model computes exactly."""
        return self.spec.max_context_len

    def weight_bytes(self) -> int:
        """Bytes of all weights, in whichever layout holds them (packed or quantized)."""
        params = sum(p.numel() * p.element_size() for p in self.parameters()
                     if p.device.type != "meta")
        return params + sum(m.derived_bytes for m in self.modules()
                            if isinstance(m, StackedLinear | Embedding))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: Sequence[LayerKV], meta: AttentionMetadata,
                backend: AttentionBackend,
                image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """input_ids, positions: int64 [T]; a (k_cache, v_cache, meta) per layer; ``meta``
        has the fields every KV group shares (positions, lengths).
        Returns the final-norm hidden states [T, hidden_size].
        ``image_embeds``: (rows int64 [R], embeddings [R, hidden_size]) that replace those
        rows' token embeddings (an image's tokens, engine/vision/inputs.py).

        For a model with one rotary table (``self.rotary``) shared by its ``self.layers``;
        a family with more (Gemma's per layer kind) overrides this."""
        hidden = self.embed_tokens(input_ids)
        if image_embeds is not None:
            rows, embeds = image_embeds
            hidden = hidden.index_copy(0, rows, embeds.to(hidden.dtype))
        cos, sin = self.rotary.lookup(positions, meta)
        if self.native_layers is None:  # once the weights are loaded: their storages
            self.native_layers = NativeLayers(self.layers)
        out = self.native_layers.run(hidden, cos, sin, kv_caches, backend)
        if out is not None:
            return self.norm(out)
        for layer, (k_cache, v_cache, layer_meta) in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos, sin, k_cache, v_cache, layer_meta, backend)
        return self.norm(hidden)

    def layer_windows(self) -> list[int | None]:
        """Each layer's sliding window (None: full attention), which groups the KV cache."""
        return [self.spec.sliding_window] * self.spec.num_layers

    def linear_layers(self) -> tuple[int, ...]:
        """The layers that keep a linear-attention state slot per sequence instead of K/V
        (a hybrid model's); none here."""
        return ()

    def kv_heads(self) -> list[tuple[int, int]]:
        """(num_kv_heads, head_dim) of each layer that keeps K/V, as ``layer_windows``
        lists them: the pool's shape per layer."""
        return [(self.spec.num_kv_heads, self.spec.head_dim)] * len(self.layer_windows())

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> float32 logits [N, vocab_size]."""
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_checkpoint(self, weights)

    def shared_targets(self) -> dict[str, Target]:
        """The embedding, final norm and (untied) LM head by Hugging Face name."""
        targets: dict[str, Target] = {
            "model.embed_tokens.weight": self.embed_tokens.slot(),
            "model.norm.weight": self.norm.weight.data,
        }
        if not self.spec.tie_word_embeddings:
            targets["lm_head.weight"] = self.lm_head.slot(0)
        return targets


def copy_checkpoint(model: nn.Module,
                    weights: Iterable[tuple[str, torch.Tensor | QuantizedTensor]]) -> None:
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
            if isinstance(tensor, QuantizedTensor) and isinstance(target, torch.Tensor):
                # A quantized matrix where the model keeps floats (a norm, a fused part).
                tensor = dequantize_cpu(tensor.data, tensor.type_id)
            target.copy_(tensor)
            loaded.add(name)
    missing = sorted(set(targets) - loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if
                                           len(missing) > 8 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} parameter(s): {shown}")
    # Linears first: a tied LM head decides the layout its embedding shares.
    for module in model.modules():
        if isinstance(module, StackedLinear):
            module.prepare()
    for module in model.modules():
        if isinstance(module, Embedding):
            module.prepare()
    for module in model.modules():  # once their experts' storages are chosen
        if isinstance(module, SparseMoE):
            module.prepare()
