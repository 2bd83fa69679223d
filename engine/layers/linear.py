"""A bias-optional linear layer whose output can be several checkpoint matrices stacked.

Hugging Face checkpoints store q/k/v and gate/up as separate matrices; stacking them into
one weight at load time turns three (or two) matmuls per token into one, which matters on
CPU where each small matmul pays a fixed overhead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class StackedLinear(nn.Module):
    """y = x @ W.T + b, where W (and b) are `len(out_sizes)` blocks stacked on dim 0."""

    def __init__(
        self,
        in_features: int,
        out_sizes: Sequence[int],
        bias: bool,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_sizes = tuple(out_sizes)
        out_features = sum(self.out_sizes)
        # Filled by the model's load_weights; requires_grad=False keeps autograd out of
        # inference entirely.
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=dtype, device=device),
            requires_grad=False,
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=dtype, device=device),
                         requires_grad=False)
            if bias
            else None
        )

    def block(self, index: int, name: str) -> torch.Tensor:
        """The view of `weight` or `bias` that checkpoint matrix `index` fills."""
        start = sum(self.out_sizes[:index])
        target = self.weight if name == "weight" else self.bias
        assert target is not None, f"{name} requested from a layer without it"
        return target.data[start:start + self.out_sizes[index]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == torch.float32 and x.shape[0] < SMALL_BATCH:
            return small_batch_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


# Below this many rows (decode steps), CPU fp32 matmuls run faster as W @ x.T than as
# F.linear: measured on the 2-core dev machine over the starter's 30 layers, 1.5-2x
# faster at 2-16 rows. One row is padded to two, which beats both at batch 1.
SMALL_BATCH = 64


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T computed as (weight @ x.T).T. The result is a transposed view, not
    contiguous: callers reshape it (or let the next op copy it), which saves a copy per
    matmul."""
    rows = x.shape[0]
    columns = (torch.cat([x, x]) if rows == 1 else x).t()
    out = torch.mm(weight, columns).t()[:rows]
    return out if bias is None else out + bias
