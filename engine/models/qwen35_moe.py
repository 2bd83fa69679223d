"""Qwen3.5-MoE / Qwen3.6-MoE text (``Qwen3_5MoeForCausalLM``): Qwen3.5's hybrid decoder
(engine/models/qwen35.py: Gated DeltaNet and gated full-attention layers, as they are)
with every layer's MLP a sparse block (engine/layers/moe/) that has a shared expert.

Matched to transformers' ``models/qwen3_5_moe/modeling_qwen3_5_moe.py`` (5.x): a softmax
router whose top k are always rescaled to sum to one, routed experts of
``moe_intermediate_size``, and a shared expert of ``shared_expert_intermediate_size``
scaled by sigmoid(``shared_expert_gate``). The checkpoints hold one matrix per expert
(transformers 5 fuses them in memory only: ``mlp.experts.gate_up_proj`` [E, 2I, H],
``down_proj`` [E, H, I], which `load_weights` takes too, split per expert).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.layers.base import Layer
from engine.models.base import Target, copy_checkpoint
from engine.models.experts import Experts, per_expert, read_experts, sparse_targets
from engine.models.qwen35 import (
    Qwen35DecoderLayer,
    Qwen35ForCausalLM,
    Qwen35Spec,
    hybrid_fields,
)
from engine.models.spec import FamilyTraits


@dataclass(slots=True)
class Qwen35MoeSpec(Qwen35Spec):
    experts: Experts | None = None


def qwen35_moe_spec(hf_config: Any, architecture: str, traits: FamilyTraits) -> Qwen35MoeSpec:
    fields = hybrid_fields(hf_config, architecture, traits, size_field="moe_intermediate_size")
    experts = read_experts(hf_config, architecture, fields["hidden_act"],
                           fields["intermediate_size"])
    return Qwen35MoeSpec(**fields, experts=experts)


class Qwen35MoeDecoderLayer(Qwen35DecoderLayer):
    def feed_forward(self, spec: Qwen35Spec, dtype: torch.dtype,
                     device: torch.device | str) -> Layer:
        assert isinstance(spec, Qwen35MoeSpec) and spec.experts is not None
        return spec.experts.block(spec.hidden_size, dtype, device)


class Qwen35MoeForCausalLM(Qwen35ForCausalLM):
    layer_class = Qwen35MoeDecoderLayer

    def feed_forward_targets(self, prefix: str, mlp: Any) -> dict[str, Target]:
        return sparse_targets(prefix, mlp)

    def load_weights(self, weights) -> None:
        copy_checkpoint(self, per_expert(weights))
