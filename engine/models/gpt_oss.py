"""gpt-oss (OpenAI's open-weight mixture of experts) over the paged KV cache.

What sets it apart from the other mixtures of experts (engine/models/moe_decoder.py), each read
from the config in ``gpt_oss_spec``:
- attention sinks: a learned logit per query head in the softmax's denominator
  (``self_attn.sinks``; kernels.check_sinks), biased q/k/v/o projections;
- sliding-window (128) and full layers alternating (``layer_types``), each kind on its KV
  group;
- YaRN rope (engine/layers/rotary.py);
- its router (a biased linear, a softmax over the top-k logits) and clamped SwiGLU
  experts with biases (engine/layers/moe/gpt_oss.py).

Checkpoints hold the experts fused (``mlp.experts.gate_up_proj`` [E, H, 2I] with gate
and up in interleaved columns, ``down_proj`` [E, I, H], both transposed, and their
biases); the model's own names are one matrix per expert, as GGUF files give them, and
``split_experts`` turns the first into the second, for the weights and for the loaders'
shape check alike. The folders as released store those two matrices in MXFP4 instead;
the loader hands each over as an ``Mxfp4Experts`` (engine/loaders/hf_mxfp4.py), which
splits the same way into one quantized matrix per expert.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from engine.layers.attention import PagedSelfAttention
from engine.layers.moe.gpt_oss import ClampedSwiGLU, SoftmaxOfTopKRouter
from engine.layers.moe.sparse import SparseMoE
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.base import CausalLM, Target, copy_checkpoint
from engine.models.decoder import PreNormLayer, attention_targets, mlp_targets, norm_targets
from engine.models.spec import DecoderSpec, FamilyTraits, base_spec
from kernels.quant.formats import QuantizedTensor
from kernels.quant.mxfp4 import MXFP4_TYPE, dequantize_mxfp4

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(slots=True)
class GptOssSpec(DecoderSpec):
    num_experts: int = 0
    top_k: int = 0
    layer_types: tuple[str, ...] = ()
    window: int | None = None  # of the sliding layers
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


def gpt_oss_spec(hf_config: Any, architecture: str, traits: FamilyTraits) -> GptOssSpec:
    base = base_spec(hf_config, architecture, traits)
    num_experts = getattr(hf_config, "num_local_experts", None)
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_local_experts must be a positive integer, got {num_experts!r}")
    top_k = getattr(hf_config, "num_experts_per_tok", None)
    if not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"num_experts_per_tok must be between 1 and num_local_experts "
                         f"({num_experts}), got {top_k!r}")
    layer_types = tuple(getattr(hf_config, "layer_types", None) or
                        [SLIDING if i % 2 == 0 else FULL for i in range(base.num_layers)])
    if len(layer_types) != base.num_layers or set(layer_types) - {SLIDING, FULL}:
        raise ValueError(f"layer_types must name {base.num_layers} layers as {SLIDING!r} or "
                         f"{FULL!r}, got {list(layer_types)!r}")
    window = getattr(hf_config, "sliding_window", None)
    if SLIDING in layer_types and (not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window must be a positive integer, got {window!r}")
    limit = getattr(hf_config, "swiglu_limit", 7.0)
    if not isinstance(limit, int | float) or limit <= 0:
        raise ValueError(f"swiglu_limit must be a positive number, got {limit!r}")
    shared = {f.name: getattr(base, f.name) for f in fields(DecoderSpec)}
    shared["sliding_window"] = None  # per layer kind: `window`
    return GptOssSpec(
        **shared, num_experts=num_experts, top_k=top_k, layer_types=layer_types,
        window=window if SLIDING in layer_types else None,
        swiglu_alpha=float(getattr(hf_config, "swiglu_alpha", 1.702)),
        swiglu_limit=float(limit))


class GptOssDecoderLayer(PreNormLayer):
    def __init__(self, spec: GptOssSpec, kind: str, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        hidden, eps = spec.hidden_size, spec.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps, dtype, device)
        self.self_attn = PagedSelfAttention(
            hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim, qkv_bias=spec.qkv_bias,
            o_bias=spec.o_bias, qk_norm_eps=None, dtype=dtype, device=device,
            sliding_window=spec.window if kind == SLIDING else None, sinks=True)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype, device)
        experts = [ClampedSwiGLU(hidden, spec.intermediate_size, spec.swiglu_alpha,
                                 spec.swiglu_limit, dtype, device)
                   for _ in range(spec.num_experts)]
        self.mlp = SparseMoE(hidden, spec.intermediate_size, spec.num_experts, spec.top_k,
                             True, dtype, device,
                             gate=SoftmaxOfTopKRouter(hidden, spec.num_experts, spec.top_k,
                                                      dtype, device),
                             experts=experts)


class GptOssForCausalLM(CausalLM):
    spec: GptOssSpec

    def __init__(self, spec: GptOssSpec, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__(spec, dtype, device,
                         RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device))
        self.rotary = RotaryEmbedding(spec.head_dim, spec.max_position_embeddings,
                                      spec.rope_theta, spec.rope_scaling, dtype, device)
        self.layers = nn.ModuleList(GptOssDecoderLayer(spec, kind, dtype, device)
                                    for kind in spec.layer_types)

    def layer_windows(self) -> list[int | None]:
        return [self.spec.window if kind == SLIDING else None for kind in self.spec.layer_types]

    def checkpoint_targets(self) -> dict[str, Target]:
        """Each checkpoint name -> the tensor (or stacked slice) it fills; one matrix (and
        bias) per expert, as GGUF files and ``split_experts`` give them."""
        targets = self.shared_targets()
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            targets |= norm_targets(prefix, layer)
            targets |= attention_targets(prefix, layer.self_attn, self.spec)
            targets[prefix + "self_attn.sinks"] = layer.self_attn.sinks.data
            targets[prefix + "mlp.router.weight"] = layer.mlp.gate.weight.data
            targets[prefix + "mlp.router.bias"] = layer.mlp.gate.bias.data
            for e, expert in enumerate(layer.mlp.experts):
                targets |= mlp_targets(f"{prefix}mlp.experts.{e}.", expert, True)
        return targets

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_checkpoint(self, split_experts(weights))


@dataclass(slots=True, frozen=True)
class Mxfp4Experts:
    """One fused expert matrix of a layer kept in MXFP4: `blocks` uint8 [E, out, k / 32
    * 17], each expert's rows (its outputs) in kernels/quant/mxfp4's blocks over `k`
    inputs. `shape` is the float checkpoint's fused tensor's, [E, k, out] (transposed)."""

    blocks: torch.Tensor
    k: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.blocks.shape[0], self.k, self.blocks.shape[1])

    def matrix(self, expert: int, rows: slice = slice(None)) -> QuantizedTensor:
        """Rows `rows` of one expert's [out, k] matrix, their blocks contiguous."""
        data = self.blocks[expert, rows].contiguous()
        return QuantizedTensor(MXFP4_TYPE, (data.shape[0], self.k), data)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The float fused tensor [E, k, out] the checkpoint would hold."""
        experts, out = self.blocks.shape[:2]
        dense = dequantize_mxfp4(self.blocks.reshape(experts * out, -1), self.k, dtype)
        return dense.reshape(experts, out, self.k).transpose(1, 2)


def _rows(fused: torch.Tensor | Mxfp4Experts, expert: int,
          rows: slice = slice(None)) -> torch.Tensor | QuantizedTensor:
    """Rows of one expert's [out, in] matrix from a fused tensor [E, in, out]."""
    if isinstance(fused, Mxfp4Experts):
        return fused.matrix(expert, rows)
    return fused[expert].t()[rows]


# The fused expert tensors of a checkpoint, by name under model.layers.N.mlp.experts.
_FUSED = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
_GGUF_SINKS = ".self_attn.sinks.weight"


def split_experts(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """A checkpoint's fused expert tensors as one matrix and bias per expert: gate from
    gate_up's even columns and up from its odd ones, each transposed to [I, H], down
    transposed to [H, I]; a GGUF file's ``self_attn.sinks.weight`` (llama.cpp names every
    tensor so) as ``self_attn.sinks``; every other tensor (and per-expert ones) unchanged.
    Works on meta tensors, so the loaders' shape check reads the same rule, and on
    `Mxfp4Experts`, whose experts come out as QuantizedTensors."""
    even, odd = slice(0, None, 2), slice(1, None, 2)
    for name, tensor in weights:
        if name.endswith(_GGUF_SINKS):
            yield name.removesuffix(".weight"), tensor
            continue
        head, sep, tail = name.rpartition(".experts.")
        if (not sep or tail not in _FUSED
                or not isinstance(tensor, torch.Tensor | Mxfp4Experts)):
            yield name, tensor
            continue
        for e in range(tensor.shape[0]):
            base = f"{head}.experts.{e}."
            if tail == "gate_up_proj":
                yield base + "gate_proj.weight", _rows(tensor, e, even)
                yield base + "up_proj.weight", _rows(tensor, e, odd)
            elif tail == "gate_up_proj_bias":
                yield base + "gate_proj.bias", tensor[e, even]
                yield base + "up_proj.bias", tensor[e, odd]
            elif tail == "down_proj":
                yield base + "down_proj.weight", _rows(tensor, e)
            else:
                yield base + "down_proj.bias", tensor[e]


def split_expert_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """`split_experts` on a checkpoint's shapes (name -> shape)."""
    meta = ((name, torch.empty(shape, device="meta")) for name, shape in shapes.items())
    return {name: tuple(t.shape) for name, t in split_experts(meta)}
