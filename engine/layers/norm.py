"""RMSNorm as the Llama family defines it."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
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
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)
