"""RMSNorm as the Llama family defines it, and Gemma's variant."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.base import Layer
from engine.layers.native import fused_cpu, native_ops


class RMSNorm(Layer):
    """Normalizes over the last dimension in float32, casts back, then scales; the cast
    before the scale matches the reference implementation bit for bit in bfloat16."""

    # What the scale adds to the stored weight: Gemma stores weight - 1.
    weight_offset = 0.0

    def __init__(
        self, size: int, eps: float, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(
            torch.empty(size, dtype=dtype, device=device), requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_cpu(x, self.weight):
            return native_ops().rms_norm(x, self.weight, self.eps, self.weight_offset)
        if x.dtype == torch.float32:
            # One dispatch instead of six: per-op overhead is a large share of a decode
            # step on CPU, and in float32 there are no casts to match.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)

    def add_and_norm(self, update: torch.Tensor,
                     residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + update), residual + update): the residual add of a decoder
        layer and the norm after it. The fused CPU path sums into ``update`` in place and
        returns it as the new residual, so the caller must not use ``update`` again (a
        sublayer's fresh output)."""
        if fused_cpu(update, residual, self.weight) and update.is_contiguous():
            normed = native_ops().add_rms_norm(update, residual, self.weight, self.eps,
                                               self.weight_offset)
            return normed, update
        residual = residual + update
        return self(residual), residual


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the checkpoint stores weight - 1 (the scale is 1 + weight), and the
    scale is applied in float32 before the cast back, where Llama casts first."""

    weight_offset = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_cpu(x, self.weight):
            return native_ops().rms_norm(x, self.weight, self.eps, self.weight_offset)
        scale = 1.0 + self.weight.float()
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, scale, self.eps)
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return (x32 * torch.rsqrt(variance + self.eps) * scale).to(x.dtype)
