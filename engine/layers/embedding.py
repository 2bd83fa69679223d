"""The input embedding table: float rows, or GGUF blocks dequantized row by row on lookup
(a lookup touches a handful of rows; the whole table is never dequantized)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.base import Layer
from engine.layers.linear import WeightSlot
from engine.layers.weights import WeightStorage, lookup_storage
from kernels.quant.formats import QuantizedTensor


class Embedding(Layer):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.dtype = dtype
        self.shape = (vocab_size, hidden_size)
        # Empty until a float table is loaded (see load_rows).
        self.weight = nn.Parameter(torch.empty(0, dtype=dtype, device=device),
                                   requires_grad=False)
        self.quantized: QuantizedTensor | None = None  # as loaded, until prepare
        self.storage: WeightStorage | None = None  # what lookups read when quantized

    def slot(self) -> WeightSlot:
        return WeightSlot(self, 0, *self.shape)

    def load_rows(self, start: int, stop: int, tensor: torch.Tensor | QuantizedTensor) -> None:
        if isinstance(tensor, QuantizedTensor):
            self.quantized = tensor
            return
        self.quantized = self.storage = None
        if self.weight.shape != self.shape:
            self.weight.data = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        self.weight.data[start:stop].copy_(tensor)

    def prepare(self, shared: WeightStorage | None = None) -> None:
        """Once loaded: a quantized table takes `shared` (the tied LM head's storage, when
        it answers lookups too) or its own row layout."""
        if self.quantized is None:
            return
        self.storage = shared or lookup_storage(self.quantized, self.device)
        self.quantized = None

    @property
    def derived_bytes(self) -> int:
        return 0 if self.storage is None else self.storage.nbytes

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """int64 [T] -> [T, hidden] in the model's dtype."""
        if self.storage is not None:
            return self.storage.rows(input_ids, self.dtype)
        return F.embedding(input_ids, self.weight)
