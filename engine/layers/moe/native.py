"""A mixture of experts on the native CPU library: every routed expert's gate/up in one
call, the gated activation over all routes, every down product with the routing weights'
sum in one more (quant_matmul_grouped, kernels/cpu/csrc/quant/grouped.cpp).

A decode token's layer is then the router, two products and one activation, each
product one parallel region over its k experts' matrices instead of one per expert; a
prefill chunk is the same two calls, each expert's rows taking the tiles inside.
`SparseMoE.prepare` picks this where every expert's matrices hold the file's blocks in
the library's storage (`NativeQuantized`), in runs of one layout for every expert.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.layers.linear import StackedLinear
from engine.layers.mlp import GatedMLP
from engine.layers.weights import NativeQuantized
from kernels.cpu import quant


@dataclass(slots=True)
class GroupedMatrix:
    """One matrix of every expert (gate/up or down) as the grouped op's arguments; the
    experts' storages are kept to read `pairs` (cpu_activation_bits) when multiplying."""

    data: list[torch.Tensor]
    type_ids: list[int]
    orders: list[torch.Tensor | None]
    per_expert: int
    k: int
    storage: NativeQuantized
    bias: torch.Tensor | None  # [E, n]: each expert's bias, or None

    def __call__(self, x: torch.Tensor, experts: torch.Tensor,
                 weights: torch.Tensor | None) -> torch.Tensor:
        return quant.quant_matmul_grouped(x, self.data, self.type_ids, self.k, self.orders,
                                          self.per_expert, experts, weights,
                                          self.storage.pairs)


def _grouped(linears: Sequence[StackedLinear]) -> GroupedMatrix | None:
    storages = [linear.storage for linear in linears]
    if not all(isinstance(s, NativeQuantized) for s in storages):
        return None
    first = storages[0]
    per_expert = len(first.runs)
    if any(len(s.runs) != per_expert or s.shape != first.shape for s in storages):
        return None
    data, type_ids, orders = [], [], []
    for s in storages:
        for run in s.runs:
            tensor = run.tensor
            data.append(tensor.data)
            type_ids.append(tensor.type_id)
            orders.append(tensor.row_order)
    bias = None
    if linears[0].bias is not None:
        bias = torch.stack([linear.bias.detach() for linear in linears])
    return GroupedMatrix(data, type_ids, orders, per_expert, first.shape[1], first, bias)


@dataclass(slots=True)
class NativeExperts:
    """The experts' two grouped products and their activation (gpt-oss's clamped SwiGLU
    and biases too)."""

    gate_up: GroupedMatrix
    down: GroupedMatrix
    activate: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, x: torch.Tensor, weights: torch.Tensor,
                 ids: torch.Tensor) -> torch.Tensor:
        """x float32 [T, hidden], routes (weights, ids) [T, k] -> [T, hidden]."""
        routes = ids.reshape(-1)
        gate_up = self.gate_up(x, routes, None)  # [T * k, 2 * intermediate]
        if self.gate_up.bias is not None:
            gate_up += self.gate_up.bias[routes]
        weights = weights.float()
        out = self.down(self.activate(gate_up), routes, weights)
        if self.down.bias is not None:  # the routes' biases, weighted as their products
            out += (weights.unsqueeze(1) @ self.down.bias[ids]).squeeze(1)
        return out


def native_experts(experts: Sequence[GatedMLP]) -> NativeExperts | None:
    """The grouped products for `experts`, or None where one of their matrices is not in
    the native library's storage or their layouts differ (then the loop runs them)."""
    gate_up = _grouped([e.gate_up_proj for e in experts])
    down = _grouped([e.down_proj for e in experts])
    if gate_up is None or down is None:
        return None
    return NativeExperts(gate_up, down, experts[0].activate)
