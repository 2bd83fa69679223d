"""The output projection to vocabulary logits, with the matmul layout picked per batch size.

On the 2-core AVX2 development CPU (docs: shared/PERF-NOTES.md) the LM head of the starter
model (49,152 x 576) costs, per call, in float32 (one run, side by side):

    rows  F.linear(x, W)  (W @ x.T).T  x @ W.T.contiguous()
    1     9.7 ms          10.1 ms      5.5 ms
    2     23.8 ms         7.8 ms       11.2 ms
    8     24.3 ms         11.8 ms      30.4 ms
    32    50.1 ms         33.8 ms      69.1 ms

so float32 keeps a transposed contiguous copy for single-row decode steps (2x, at the cost
of a second copy of the matrix) and uses (W @ x.T).T otherwise. In bfloat16 the transposed
layouts are 30-40x slower and F.linear is the best at every batch size, so it is used as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LMHead(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        tied_weight: nn.Parameter | None = None,
    ) -> None:
        """tied_weight: the input embedding's [vocab, hidden] matrix, shared, not copied."""
        super().__init__()
        if tied_weight is not None:
            self.weight = tied_weight
        else:
            self.weight = nn.Parameter(
                torch.empty(vocab_size, hidden_size, dtype=dtype, device=device),
                requires_grad=False,
            )
        self._weight_t: torch.Tensor | None = None

    def prepare(self) -> None:
        """Rebuild the derived layouts; call after the weight's values change (load)."""
        use_transposed = self.weight.dtype == torch.float32 and self.weight.device.type == "cpu"
        self._weight_t = self.weight.detach().t().contiguous() if use_transposed else None

    @property
    def derived_bytes(self) -> int:
        """Memory held beyond the parameters (the transposed copy), for memory reports."""
        if self._weight_t is None:
            return 0
        return self._weight_t.numel() * self._weight_t.element_size()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> float32 logits [N, vocab]."""
        weight = self.weight.detach()
        if self._weight_t is not None:
            if hidden.shape[0] == 1:
                return hidden @ self._weight_t
            return (weight @ hidden.t()).t().contiguous()
        return F.linear(hidden, weight).float()
