"""The output projection to vocabulary logits.

It is a StackedLinear with one block (so CPU float32 gets oneDNN's packed layout, see
engine/layers/onednn.py) that may share its matrix with the input embedding, and that
always returns float32 logits.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.linear import StackedLinear


class LMHead(StackedLinear):
    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        tied_weight: nn.Parameter | None = None,
    ) -> None:
        """tied_weight: the input embedding's [vocab, hidden] matrix, shared, not copied; the
        embedding lookup needs it as is, so a packed layout is kept beside it."""
        super().__init__(hidden_size, (vocab_size,), False, dtype,
                         device if tied_weight is None else "meta")
        if tied_weight is not None:
            self.weight = tied_weight
            self.keeps_dense_weight = True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> float32 logits [N, vocab]."""
        return super().forward(hidden).float().contiguous()
