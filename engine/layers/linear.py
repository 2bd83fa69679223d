"""A bias-optional linear layer whose output can be several checkpoint matrices stacked,
each either a float matrix or a GGUF-quantized one.

Hugging Face checkpoints store q/k/v and gate/up as separate matrices; stacking them into
one weight at load time turns three (or two) matmuls per token into one, which matters on
CPU where each small matmul pays a fixed overhead. On CPU in float32 the layer then trades
its matrix for oneDNN's packed copy (engine/layers/onednn.py), the fastest layout there.

Quantized checkpoint matrices (GGUF files loaded with weights="stored") stay quantized.
What holds the matrix and multiplies it is one storage object (engine/layers/weights.py),
chosen by `prepare` once the weights are loaded: dense (float, oneDNN-packed on CPU), the
native CPU library, Triton, or PyTorch's weight-only ops. The float weight is only
allocated when a float matrix is loaded, so a quantized model never holds its float size,
even briefly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from engine.layers.base import Layer
from engine.layers.weights import (
    DenseWeight,
    QuantizedRuns,
    WeightStorage,
    quantized_storage,
)
from kernels.quant.formats import QuantizedTensor
from kernels.quant.matrix import dequantize_cpu


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
    # Whether quantized products keep ~15 bits of each activation (weights.NativeQuantized)
    # rather than 8: every layer whose output goes on through the model.
    precise_products = True

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
        # What forward multiplies: the plain parameter until prepare() picks the storage.
        self.storage: WeightStorage = DenseWeight(self.weight, self.shape)
        self._pending: list[tuple[int, QuantizedTensor]] = []  # loaded, not yet prepared

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
        """The float matrix to load into: allocated on first use, brought back from a
        packed copy; the layer multiplies it as is until the next prepare()."""
        storage = self.storage
        if isinstance(storage, DenseWeight) and storage.packed is not None:
            if not self.keeps_dense_weight:
                self.weight.data = storage.dense()
        if self.weight.shape != self.shape:
            self.weight.data = torch.empty(self.shape, dtype=self.weight.dtype,
                                           device=self.device)
        self.storage = DenseWeight(self.weight, self.shape)
        return self.weight.data

    def prepare(self) -> None:
        """Call once the weights are loaded: picks the storage. Quantized rows go to the
        device's quantized storage; a float matrix on CPU in float32 is swapped for its
        oneDNN packed copy (same bytes); `block` brings the plain matrix back for a new
        load."""
        if self._pending:
            self._prepare_quantized()
        elif self.weight.shape == self.shape:
            self.storage = DenseWeight.packing(self.weight, self.keeps_dense_weight)

    def _prepare_quantized(self) -> None:
        pending = sorted(self._pending, key=lambda part: part[0])
        self._pending = []
        rows = sum(t.shape[0] for _, t in pending)
        if rows != self.shape[0] or self.weight.shape == self.shape:
            # Float and quantized rows in one stack (rare in real files): all float.
            for start, tensor in pending:
                ordered = tensor.in_order()
                self._dense()[start:start + tensor.shape[0]].copy_(
                    dequantize_cpu(ordered.data, ordered.type_id))
            self.prepare()
            return
        self.storage = quantized_storage([tensor for _, tensor in pending], self.device,
                                         self.precise_products)
        self.weight.data = torch.empty(0, dtype=self.weight.dtype, device=self.device)

    @property
    def quantized(self) -> bool:
        return isinstance(self.storage, QuantizedRuns)

    def dense_weight(self) -> torch.Tensor:
        """The [out, in] matrix, whichever storage holds it (dequantized when quantized)."""
        if isinstance(self.storage, DenseWeight):
            return self.storage.dense()
        return self.storage.rows(None, self.weight.dtype)

    @property
    def derived_bytes(self) -> int:
        """Bytes held outside the parameters (packed or quantized), for memory reports."""
        return self.storage.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.storage.matmul(x)
        return out if self.bias is None else out + self.bias
