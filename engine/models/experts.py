"""What every mixture-of-experts family shares above the layers: the experts a config
states (`read_experts`, `Experts`, which builds the sparse block), how a family names and
routes them (`MoETraits`), their checkpoint names (`sparse_targets`), transformers 5's
fused in-memory experts split one matrix per expert (`per_expert`), and the parameters a
token reads (`active_parameters`, for the catalog).

OLMoE, Qwen3-MoE and Mixtral (moe_decoder.py) and Qwen3.5-MoE (qwen35_moe.py) build
their sparse blocks from these; gpt-oss (gpt_oss.py) has its own router and experts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from engine.layers.moe.sparse import SparseMoE
from engine.models.base import Target
from engine.models.decoder import mlp_targets
from kernels.quant.formats import QuantizedTensor


@dataclass(slots=True, frozen=True)
class MoETraits:
    """How a family names and routes its experts."""

    block: str = "mlp"  # the sparse block's name under model.layers.N
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    always_normalize: bool = False  # the top-k scores rescaled to sum to 1 whatever the config
    full_qk_norm: bool = False  # RMSNorm over the whole q and k projections (OLMoE)


MOE_TRAITS = MappingProxyType({
    "OlmoeForCausalLM": MoETraits(full_qk_norm=True),
    "Qwen3MoeForCausalLM": MoETraits(),
    "MixtralForCausalLM": MoETraits(block="block_sparse_moe", expert_names=("w1", "w3", "w2"),
                                    always_normalize=True),
    # Qwen3.5-MoE's hybrid decoder (engine/models/qwen35_moe.py): its router always
    # rescales the top k (its config has no norm_topk_prob).
    "Qwen3_5MoeForCausalLM": MoETraits(always_normalize=True),
})


@dataclass(slots=True, frozen=True)
class Experts:
    """A sparse block's shape and routing, as a config states them."""

    num_experts: int
    top_k: int
    normalize_top_k: bool
    expert_size: int  # each routed expert's intermediate size
    shared_expert_size: int = 0  # the shared expert's intermediate size; 0: none

    def block(self, hidden_size: int, dtype: torch.dtype,
              device: torch.device | str) -> SparseMoE:
        return SparseMoE(hidden_size, self.expert_size, self.num_experts, self.top_k,
                         self.normalize_top_k, dtype, device,
                         shared_expert_size=self.shared_expert_size)


def read_experts(hf_config: Any, architecture: str, hidden_act: str,
                 default_size: int) -> Experts:
    """The experts of a config (``num_experts`` or Mixtral's ``num_local_experts``,
    ``num_experts_per_tok``, ``moe_intermediate_size`` else ``default_size``,
    ``shared_expert_intermediate_size``), the top k normalised where the family always
    does or ``norm_topk_prob`` says; ValueError naming a bad field."""
    if hidden_act != "silu":
        raise ValueError(f"hidden_act {hidden_act!r} is not supported; the experts use "
                         "'silu'")
    num_experts = getattr(hf_config, "num_experts", None) or getattr(
        hf_config, "num_local_experts", None)
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive integer, got {num_experts!r}")
    top_k = getattr(hf_config, "num_experts_per_tok", None)
    if not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"num_experts_per_tok must be between 1 and num_experts "
                         f"({num_experts}), got {top_k!r}")
    shared = getattr(hf_config, "shared_expert_intermediate_size", None) or 0
    if not isinstance(shared, int) or shared < 0:
        raise ValueError(f"shared_expert_intermediate_size must be an integer >= 0, "
                         f"got {shared!r}")
    always = MOE_TRAITS[architecture].always_normalize
    return Experts(num_experts, top_k,
                   always or bool(getattr(hf_config, "norm_topk_prob", False)),
                   int(getattr(hf_config, "moe_intermediate_size", None) or default_size),
                   shared)


def sparse_targets(block: str, mlp: SparseMoE,
                   expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
                   ) -> dict[str, Target]:
    """A sparse block's checkpoint names under ``block`` (``model.layers.N.mlp.``): the
    router, each expert's matrices, the shared expert and its gate where it has one."""
    targets: dict[str, Target] = {block + "gate.weight": mlp.gate.weight.data}
    for e, expert in enumerate(mlp.experts):
        targets |= mlp_targets(f"{block}experts.{e}.", expert, False, expert_names)
    if mlp.shared_expert is not None and mlp.shared_expert_gate is not None:
        targets |= mlp_targets(f"{block}shared_expert.", mlp.shared_expert, False)
        targets[block + "shared_expert_gate.weight"] = mlp.shared_expert_gate.slot(0)
    return targets


def per_expert(weights: Iterable[tuple[str, Any]],
               moe: MoETraits = MoETraits()) -> Iterator[tuple[str, Any]]:
    """transformers 5's in-memory names (every expert in one 3-D tensor, the router under
    ``mlp``) as the files' names, one matrix per expert under the family's names; others
    unchanged."""
    gate, up, down = moe.expert_names
    for name, tensor in weights:
        head, sep, tail = name.partition(".mlp.")
        if not sep or isinstance(tensor, QuantizedTensor) or tail not in _FUSED:
            yield name, tensor
            continue
        block = f"{head}.{moe.block}."
        if tail == "gate.weight":
            yield block + tail, tensor
        elif tail == "experts.gate_up_proj":
            size = tensor.shape[1] // 2
            for e, matrix in enumerate(tensor):
                yield f"{block}experts.{e}.{gate}.weight", matrix[:size]
                yield f"{block}experts.{e}.{up}.weight", matrix[size:]
        else:
            for e, matrix in enumerate(tensor):
                yield f"{block}experts.{e}.{down}.weight", matrix


_FUSED = ("gate.weight", "experts.gate_up_proj", "experts.down_proj")
# How the experts' matrices are named: one per expert in Hugging Face checkpoints
# (model.layers.N.mlp.experts.E.*), one stacked tensor per layer in GGUF (blk.N.ffn_*_exps).
_EXPERT_MARKERS = (".experts.", "_exps.")


def active_parameters(shapes: Mapping[str, Sequence[int]],
                      config: Mapping[str, Any]) -> int | None:
    """The parameters one token reads, from a checkpoint's tensor shapes and its config
    (as a dict): every tensor but the share of the experts a token is not routed to; None
    when the config has no experts."""
    experts = config.get("num_experts") or config.get("num_local_experts")
    top_k = config.get("num_experts_per_tok")
    if not isinstance(experts, int) or not isinstance(top_k, int) or not 0 < top_k <= experts:
        return None
    total = routed = 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        total += size
        if any(marker in name for marker in _EXPERT_MARKERS):
            routed += size
    return total - routed + routed * top_k // experts
