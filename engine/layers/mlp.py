"""The gated feed-forward block: SiLU for the Llama family, tanh-approximated GELU
(GeGLU) for Gemma."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.layers.base import Layer
from engine.layers.linear import StackedLinear
from engine.layers.native import fused_cpu, native_ops

# Config names of the activations (hidden_act / hidden_activation) -> the function.
ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
# The fused native CPU op of each activation: act(gate) * up in one op.
FUSED_OPS = {"silu": "silu_mul", "gelu_pytorch_tanh": "gelu_tanh_mul",
             "gelu_tanh": "gelu_tanh_mul"}


class GatedMLP(Layer):
    """down(act(gate(x)) * up(x)), with gate and up stacked into one matmul."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device | str,
        activation: str = "silu",
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"hidden activation {activation!r} is not supported; supported: "
                             f"{', '.join(ACTIVATIONS)}")
        self.act = ACTIVATIONS[activation]
        self.fused_op = FUSED_OPS[activation]
        self.intermediate_size = intermediate_size
        self.gate_up_proj = StackedLinear(hidden_size, (intermediate_size, intermediate_size),
                                          bias, dtype, device)
        self.down_proj = StackedLinear(intermediate_size, (hidden_size,), bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activate(self.gate_up_proj(x)))

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[..., 2 * intermediate] (gate then up) -> act(gate) * up [..., intermediate]."""
        if gate_up.dim() == 2 and fused_cpu(gate_up):
            return getattr(native_ops(), self.fused_op)(gate_up)
        size = self.intermediate_size
        # Slices and an in-place multiply: a decode step pays a fixed cost per op, per layer.
        return self.act(gate_up[..., :size]).mul_(gate_up[..., size:])
