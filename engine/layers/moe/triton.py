"""The fused Triton method of a mixture of experts (kernels/triton/fused_moe.py), chosen
once at load by `SparseMoE.prepare`: where every expert's gate/up and down matrices took
Triton's quantized storage (CUDA, a GGUF file's blocks, MXFP4 included), a step runs two
grouped kernels over all its experts instead of a product per routed expert.

The kernels want each matrix as one [E, n, row_bytes] stack per block type, and the
loader gave each expert its own blocks on the card; `triton_experts` stacks them, then
points every expert's storage at its slice of the stack, so the card holds one copy (the
memory panel's expert bytes stay the same) and the per-expert layers still work.
Float experts (a Hugging Face folder) keep the loop of `SparseMoE.mix`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.layers.linear import StackedLinear
from engine.layers.mlp import GatedMLP
from engine.layers.weights import TritonQuantized
from kernels.quant.formats import QuantizedTensor
from kernels.quant.matrix import RawBlocks

if TYPE_CHECKING:  # Triton is imported only where the experts took its storage
    from kernels.triton.fused_moe import ExpertMatrix


@dataclass(slots=True, frozen=True)
class TritonExperts:
    """Every expert's matrices stacked for the fused kernels, and their activation."""

    gate_up: ExpertMatrix
    down: ExpertMatrix
    activate: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, x: torch.Tensor, weights: torch.Tensor,
                 ids: torch.Tensor) -> torch.Tensor:
        """The routes (weights, ids) [T, k] of x [T, hidden] -> [T, hidden]."""
        from kernels.triton.fused_moe import fused_moe

        return fused_moe(x, ids, weights, self.gate_up, self.down, self.activate)


def triton_experts(experts: Sequence[GatedMLP]) -> TritonExperts | None:
    """The fused method for `experts`, or None where one of their matrices is not in
    Triton's storage or the experts' block types differ (then the loop runs them)."""
    linears = ([e.gate_up_proj for e in experts], [e.down_proj for e in experts])
    if not all(_stackable(linear) for group in linears for linear in group):
        return None
    runs = [[[run.tensor for run in linear.storage.runs] for linear in group]
            for group in linears]
    if not all(_same_layout(group) for group in runs):
        return None
    gate_up, down = (_stack(group, tensors) for group, tensors in zip(linears, runs,
                                                                      strict=True))
    return TritonExperts(gate_up, down, experts[0].activate)


def _stackable(linear: StackedLinear) -> bool:
    storage = linear.storage
    return isinstance(storage, TritonQuantized) and all(
        isinstance(run, RawBlocks) and run.tensor.row_order is None for run in storage.runs)


def _same_layout(per_expert: list[list[QuantizedTensor]]) -> bool:
    """Whether every expert's matrix is the same runs of block types and shapes (a GGUF
    file's stacked tensor gives them one type each)."""
    first = [(t.type_id, t.shape) for t in per_expert[0]]
    return all([(t.type_id, t.shape) for t in runs] == first for runs in per_expert)


def _stack(linears: list[StackedLinear], per_expert: list[list[QuantizedTensor]]
           ) -> ExpertMatrix:
    from kernels.triton.fused_moe import ExpertMatrix, ExpertPart

    parts = []
    start = 0
    for r, first in enumerate(per_expert[0]):
        data = torch.stack([runs[r].data for runs in per_expert])  # uint8 [E, n_r, bytes]
        parts.append(ExpertPart(first.type_id, data, start))
        start += first.shape[0]
    for e, linear in enumerate(linears):
        linear.storage = TritonQuantized([
            RawBlocks(QuantizedTensor(part.type_id, run.shape, part.data[e]), triton=True)
            for part, run in zip(parts, per_expert[e], strict=True)])
    bias = None
    if linears[0].bias is not None:
        bias = torch.stack([linear.bias.detach() for linear in linears]).float()
    return ExpertMatrix(tuple(parts), linears[0].in_features, bias)
