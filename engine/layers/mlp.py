"""The gated SiLU feed-forward block of the Llama family."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers.base import Layer
from engine.layers.linear import StackedLinear


class GatedMLP(Layer):
    """down(silu(gate(x)) * up(x)), with gate and up stacked into one matmul."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = StackedLinear(hidden_size, (intermediate_size, intermediate_size),
                                          bias, dtype, device)
        self.down_proj = StackedLinear(intermediate_size, (hidden_size,), bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        size = self.intermediate_size
        # Slices and an in-place multiply: a decode step pays a fixed cost per op, per layer.
        return self.down_proj(F.silu(gate_up[..., :size]).mul_(gate_up[..., size:]))
