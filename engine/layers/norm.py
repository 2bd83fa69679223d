"""RMSNorm as the Llama family defines it, and Gemma's variant."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.base import Layer


class RMSNorm(Layer):
    """Normalizes over the last dimension in float32, casts back, then scales; the cast
    before the scale matches the reference implementation bit for bit in bfloat16."""

    def __init__(
        self, size: int, eps: float, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(
            torch.empty(size, dtype=dtype, device=device), requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            # One dispatch instead of six: per-op overhead is a large share of a decode
            # step on CPU, and in float32 there are no casts to match.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the checkpoint stores weight - 1 (the scale is 1 + weight), and the
    scale is applied in float32 before the cast back, where Llama casts first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 + self.weight.float()
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, scale, self.eps)
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return (x32 * torch.rsqrt(variance + self.eps) * scale).to(x.dtype)
