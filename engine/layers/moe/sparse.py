"""A mixture-of-experts feed-forward block: a router picks each token's top-k experts, and
the token's output is their gated MLPs' outputs weighted by the router's scores.

Each expert is a `GatedMLP` of its own (its gate/up and down `StackedLinear`s), so an
expert's matrices take whichever storage the device and file give a dense MLP: a GGUF
file's quantized blocks where they lie (the loader hands each expert its rows of the
file's stacked ``ffn_*_exps`` tensors as views), oneDNN-packed floats, Triton.

The step runs each expert once on the rows routed to it (tokens sorted by expert): a
decode step touches only its tokens' k experts, so only their blocks are read; a prefill
chunk multiplies every routed expert once over its rows, instead of a product per token.
`prepare` picks a fused method where the experts' storage has one: on the native CPU
library every expert's gate/up in one grouped call and every down with the weighted sum
in another (native.py), on CUDA with quantized experts the fused Triton kernels
(triton.py).

A family may add a shared expert (Qwen3.5-MoE): a dense MLP every token runs, its output
scaled by sigmoid(x @ gate) and added to the routed experts' sum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from engine.layers.base import Layer
from engine.layers.linear import StackedLinear
from engine.layers.mlp import GatedMLP
from engine.layers.moe.native import NativeExperts, native_experts
from engine.layers.moe.router import TopKRouter
from engine.layers.moe.triton import TritonExperts, triton_experts
from engine.layers.native import fused_cpu


class SparseMoE(Layer):
    """sum over each token's top-k experts e of weight_e * expert_e(x), plus
    sigmoid(x @ shared_gate) * shared_expert(x) where the family has a shared expert."""

    def __init__(self, hidden_size: int, expert_size: int, num_experts: int, top_k: int,
                 normalize: bool, dtype: torch.dtype, device: torch.device | str,
                 gate: Layer | None = None, experts: Sequence[GatedMLP] | None = None,
                 shared_expert_size: int = 0) -> None:
        """``gate`` and ``experts``: a family's own router (x -> weights, ids [T, k]) and
        experts (gpt-oss's), instead of the softmax router and plain SiLU experts.
        ``shared_expert_size``: the shared expert's intermediate size (0: none)."""
        super().__init__()
        if shared_expert_size < 0:
            raise ValueError(f"shared_expert_intermediate_size must be >= 0, got "
                             f"{shared_expert_size}")
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: StackedLinear | None = None
        if shared_expert_size:
            self.shared_expert = GatedMLP(hidden_size, shared_expert_size, False, dtype, device)
            self.shared_expert_gate = StackedLinear(hidden_size, (1,), False, dtype, device)
        self.gate = gate or TopKRouter(hidden_size, num_experts, top_k, normalize, dtype,
                                       device)
        self.experts = nn.ModuleList(experts or (
            GatedMLP(hidden_size, expert_size, False, dtype, device)
            for _ in range(num_experts)))
        # The method prepare() picks, if any.
        self.fused: TritonExperts | None = None
        self.native: NativeExperts | None = None

    def prepare(self) -> None:
        """Call once the experts are loaded (the loader does, after every load): the fused
        Triton kernels where every expert took Triton's quantized storage (CUDA), the
        native library's grouped products where they took its storage (CPU), else the
        loop of `mix`."""
        self.fused = triton_experts(self.experts)
        self.native = native_experts(self.experts)

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        weights, ids = self.gate(x)
        routed = self.mix(x, weights, ids)
        if self.shared_expert is None:
            return routed
        return routed + self.shared(x)

    def shared(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert's output, scaled by its sigmoid gate (one scalar per token)."""
        assert self.shared_expert is not None and self.shared_expert_gate is not None
        return torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

    def mix(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The experts' outputs for routes (weights, ids) [T, k]: the routes sorted by
        expert, each routed expert run once over its tokens' rows."""
        if self.fused is not None:
            return self.fused(x, weights, ids)
        if self.native is not None and fused_cpu(x):
            return self.native(x, weights, ids)
        top_k = ids.shape[1]
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        # One host sync for the whole layer: how many rows each expert takes.
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // top_k
        route_weights = weights.reshape(-1)[order].unsqueeze(1)
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts):
            if not count:
                continue
            stop = start + count
            rows = tokens[start:stop]
            y = self.experts[expert](x[rows]) * route_weights[start:stop]
            out.index_add_(0, rows, y)
            start = stop
        return out

    def expert_bytes(self) -> int:
        """Bytes of every expert's matrices (the router's are the model's other weights)."""
        params = sum(p.numel() * p.element_size() for p in self.experts.parameters()
                     if p.device.type != "meta")
        return params + sum(linear.derived_bytes for expert in self.experts
                            for linear in (expert.gate_up_proj, expert.down_proj))


def expert_bytes(model: nn.Module) -> int | None:
    """Bytes of every expert of `model` (the memory panel's figure), or None when it has
    no mixture-of-experts layer."""
    blocks = [m for m in model.modules() if isinstance(m, SparseMoE)]
    return sum(block.expert_bytes() for block in blocks) if blocks else None
