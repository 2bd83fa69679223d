"""gpt-oss's mixture-of-experts parts, for `SparseMoE` (sparse.py): its router
(a biased linear, the top k of the logits, a softmax over those k alone) and its experts'
clamped SwiGLU, with biases on every expert matrix."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.base import Layer
from engine.layers.mlp import GatedMLP


class SoftmaxOfTopKRouter(Layer):
    """The k largest of x @ W.T + b, then a softmax over those k: the weights always sum
    to one. Ties go as torch.topk orders them (the lower index first), as transformers'
    GptOssTopKRouter picks; the softmax runs in float32."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be between 1 and num_experts "
                             f"({num_experts}), got {top_k}")
        self.top_k = top_k
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype,
                                               device=device), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(num_experts, dtype=dtype, device=device),
                                 requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, k] in x's dtype, expert ids int64 [T, k])."""
        logits, ids = torch.topk(F.linear(x, self.weight, self.bias), self.top_k, dim=-1)
        return torch.softmax(logits.float(), dim=-1).to(x.dtype), ids


class ClampedSwiGLU(GatedMLP):
    """down((clamp(up, -l, l) + 1) * g * sigmoid(alpha * g)), g = min(gate, l): gpt-oss's
    expert, biased gate/up and down. Its gate and up are the stacked matrix's two halves
    (the checkpoint's interleaved columns are split on load)."""

    def __init__(self, hidden_size: int, intermediate_size: int, alpha: float, limit: float,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__(hidden_size, intermediate_size, True, dtype, device)
        self.alpha = alpha
        self.limit = limit

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        size = self.intermediate_size
        gate = gate_up[..., :size].clamp(max=self.limit)
        up = gate_up[..., size:].clamp(-self.limit, self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
