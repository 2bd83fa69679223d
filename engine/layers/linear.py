"""A bias-optional linear layer whose output can be several checkpoint matrices stacked,
each either a float matrix or a GGUF-quantized one.

Hugging Face checkpoints store q/k/v and gate/up as separate matrices; stacking them into
one weight at load time turns three (or two) matmuls per token into one, which matters on
CPU where each small matmul pays a fixed overhead. On CPU in float32 the layer then trades
its matrix for oneDNN's packed copy (engine/layers/onednn.py), the fastest layout there.

Quantized checkpoint matrices (GGUF files loaded with weights="stored") stay quantized:
stacked rows of one block type become one quantized matrix (rows of blocks stack as byte
rows) in the layout `kernels.quant.matrix` picks for the device; a stack mixing types
multiplies each run of rows and concatenates. The float weight is only allocated when a
float matrix is loaded, so a quantized model never holds its float size, even briefly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers import onednn
from engine.layers.base import Layer
from kernels.quant.formats import QuantizedTensor
from kernels.quant.matrix import QuantMatrix, dequantize_cpu, for_product


@dataclass(slots=True)
class WeightSlot:
    """Where one checkpoint matrix lands: rows [start, stop) of `owner`'s weight. A
    checkpoint target like a tensor view (`shape`, `copy_`), that also takes quantized
    matrices."""

    owner: StackedLinear | Layer
    start: int
    stop: int
    width: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.stop - self.start, self.width)

    def copy_(self, tensor: torch.Tensor | QuantizedTensor) -> None:
        self.owner.load_rows(self.start, self.stop, tensor)


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
        self.device = torch.device(device)
        out_features = sum(self.out_sizes)
        self.shape = (out_features, in_features)
        # Empty until a float matrix is loaded (see _dense); requires_grad=False keeps
        # autograd out of inference entirely.
        self.weight = nn.Parameter(torch.empty(0, dtype=dtype, device=device),
                                   requires_grad=False)
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=dtype, device=device),
                         requires_grad=False)
            if bias
            else None
        )
        self._packed: torch.Tensor | None = None
        self._pending: list[tuple[int, QuantizedTensor]] = []  # loaded, not yet prepared
        self._runs: list[QuantMatrix] = []  # the quantized matrices, in row order

    def block(self, index: int, name: str) -> torch.Tensor:
        """The float view of `weight` or `bias` that checkpoint matrix `index` fills."""
        start = sum(self.out_sizes[:index])
        if name == "bias":
            if self.bias is None:
                raise ValueError("bias requested from a layer without one")
            return self.bias.data[start:start + self.out_sizes[index]]
        return self._dense()[start:start + self.out_sizes[index]]

    def slot(self, index: int | None = None) -> WeightSlot:
        """The target of checkpoint matrix `index` (None: the whole stack, for checkpoints
        that store it fused)."""
        if index is None:
            return WeightSlot(self, 0, sum(self.out_sizes), self.in_features)
        start = sum(self.out_sizes[:index])
        return WeightSlot(self, start, start + self.out_sizes[index], self.in_features)

    def load_rows(self, start: int, stop: int, tensor: torch.Tensor | QuantizedTensor) -> None:
        if isinstance(tensor, QuantizedTensor):
            self._pending.append((start, tensor))
        else:
            self._dense()[start:stop].copy_(tensor)

    def _dense(self) -> torch.Tensor:
        """The float matrix, allocated on first use, unpacked if packed."""
        if self._packed is not None and not self.keeps_dense_weight:
            self.weight.data = onednn.unpack(self._packed)
        self._packed = None
        if self.weight.shape != self.shape:
            self.weight.data = torch.empty(self.shape, dtype=self.weight.dtype,
                                           device=self.device)
            self._runs = []
        return self.weight.data

    def prepare(self) -> None:
        """Call once the weights are loaded. Quantized rows become the device's quantized
        layout; a float matrix on CPU in float32 is swapped for its oneDNN packed copy
        (same bytes); `block` brings the plain matrix back for a new load."""
        if self._pending:
            self._prepare_quantized()
            return
        packed = onednn.pack(self.weight) if self.weight.shape == self.shape else None
        if packed is None:
            return
        self._packed = packed
        if not self.keeps_dense_weight:
            self.weight.data = self.weight.data.new_empty(0)

    def _prepare_quantized(self) -> None:
        pending = sorted(self._pending, key=lambda part: part[0])
        self._pending = []
        self._packed = None  # a float matrix packed by an earlier load is stale now
        rows = sum(t.shape[0] for _, t in pending)
        if rows != self.shape[0] or self.weight.shape == self.shape:
            # Float and quantized rows in one stack (rare in real files): all float.
            for start, tensor in pending:
                self._dense()[start:start + tensor.shape[0]].copy_(
                    dequantize_cpu(tensor.data, tensor.type_id))
            self.prepare()
            return
        runs: list[QuantizedTensor] = []
        for _, tensor in pending:
            if runs and runs[-1].type_id == tensor.type_id:
                last = runs.pop()
                tensor = QuantizedTensor(tensor.type_id,
                                         (last.shape[0] + tensor.shape[0], tensor.shape[1]),
                                         torch.cat([last.data, tensor.data]))
            runs.append(tensor)
        self._runs = [for_product(run, self.device) for run in runs]
        self.weight.data = torch.empty(0, dtype=self.weight.dtype, device=self.device)

    @property
    def quantized(self) -> bool:
        return bool(self._runs)

    def dense_weight(self) -> torch.Tensor:
        """The [out, in] matrix, whichever layout holds it (float layouts only)."""
        if self._packed is not None and not self.keeps_dense_weight:
            return onednn.unpack(self._packed)
        return self.weight.detach()

    @property
    def derived_bytes(self) -> int:
        """Bytes held outside the parameters (packed or quantized), for memory reports."""
        if self._packed is not None:
            return self._packed.numel() * self._packed.element_size()
        return sum(run.nbytes for run in self._runs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._runs:
            out = (self._runs[0].matmul(x) if len(self._runs) == 1
                   else torch.cat([run.matmul(x) for run in self._runs], dim=-1))
            return out if self.bias is None else out + self.bias
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
