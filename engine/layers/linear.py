"""A bias-optional linear layer whose output can be several checkpoint matrices stacked.

Hugging Face checkpoints store q/k/v and gate/up as separate matrices; stacking them into
one weight at load time turns three (or two) matmuls per token into one, which matters on
CPU where each small matmul pays a fixed overhead. On CPU in float32 the layer then trades
its matrix for oneDNN's packed copy (engine/layers/onednn.py), the fastest layout there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers import onednn
from engine.layers.base import Layer


class StackedLinear(Layer):
    """y = x @ W.T + b, where W (and b) are `len(out_sizes)` blocks stacked on dim 0."""

    # A layer whose matrix is shared with another module (the tied LM head) must keep it.
    keeps_dense_weight = False

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
        self._packed: torch.Tensor | None = None

    def block(self, index: int, name: str) -> torch.Tensor:
        """The view of `weight` or `bias` that checkpoint matrix `index` fills."""
        self._restore_dense()
        start = sum(self.out_sizes[:index])
        target = self.weight if name == "weight" else self.bias
        assert target is not None, f"{name} requested from a layer without it"
        return target.data[start:start + self.out_sizes[index]]

    def prepare(self) -> None:
        """Call once the weight is loaded: on CPU in float32 the matrix is swapped for its
        packed copy (same bytes); `block` brings the plain matrix back for a new load."""
        packed = onednn.pack(self.weight)
        if packed is None:
            return
        self._packed = packed
        if not self.keeps_dense_weight:
            self.weight.data = self.weight.data.new_empty(0)

    def _restore_dense(self) -> None:
        if self._packed is not None and not self.keeps_dense_weight:
            self.weight.data = onednn.unpack(self._packed)
        self._packed = None

    def dense_weight(self) -> torch.Tensor:
        """The [out, in] matrix, whichever layout holds it."""
        if self._packed is not None and not self.keeps_dense_weight:
            return onednn.unpack(self._packed)
        return self.weight.detach()

    @property
    def derived_bytes(self) -> int:
        """Bytes held outside the parameters (the packed copy), for memory reports."""
        if self._packed is None:
            return 0
        return self._packed.numel() * self._packed.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            return onednn.LINEAR_OP(x, self._packed, self.bias, *onednn.NO_POST_OP)
        if x.device.type == "cpu" and x.dtype == torch.float32 and x.shape[0] < SMALL_BATCH:
            return small_batch_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


# Without oneDNN, below this many rows (decode steps) CPU fp32 matmuls run faster as
# W @ x.T than as F.linear (README, "Performance"). One row is padded to two, which beats
# both at batch 1.
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
