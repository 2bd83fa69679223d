"""The output projection to vocabulary logits.

It is a StackedLinear with one block (so CPU float32 gets oneDNN's packed layout, see
engine/layers/onednn.py, and GGUF blocks stay quantized) that may share its matrix with the
input embedding, and that always returns float32 logits.
"""

from __future__ import annotations

import torch

from engine.layers.embedding import Embedding
from engine.layers.linear import StackedLinear
from kernels.quant.matrix import for_product, shares_layout


class LMHead(StackedLinear):
    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        tied: Embedding | None = None,
    ) -> None:
        """tied: the input embedding whose [vocab, hidden] matrix this head multiplies,
        shared, not copied; the lookup needs it as is, so a packed layout is kept beside
        it (float), or one quantized layout serves both where it can (see prepare)."""
        super().__init__(hidden_size, (vocab_size,), False, dtype, device)
        self.tied = tied
        if tied is not None:
            self.weight = tied.weight
            self.keeps_dense_weight = True

    def prepare(self) -> None:
        tied = self.tied
        if tied is None or tied.quantized is None:
            super().prepare()
            if tied is not None:
                tied.prepare()
            return
        product = for_product(tied.quantized, self.device)
        self._runs = [product]
        tied.prepare(shared=product if shares_layout(product) else None)

    @property
    def derived_bytes(self) -> int:
        # A layout shared with the tied embedding is counted there.
        if self.tied is not None and self._runs and self.tied.table is self._runs[0]:
            return 0
        return super().derived_bytes

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> float32 logits [N, vocab]."""
        logits = super().forward(hidden).float()
        if self._runs and hidden.shape[0]:
            refine_top_logits(logits, hidden, self._runs[0])
        return logits.contiguous()


# The quantized products round their output to 16 bits (the CPU ops return bf16; CUDA
# computes in the model's 16-bit dtype): logits near 20 move in steps of 0.125, so tokens
# a float32 head tells apart tie, and greedy decoding breaks the tie by token id. The top
# logits, where sampling's mass is, are recomputed in float32 from the dequantized rows.
REFINED_LOGITS = 32


def refine_top_logits(logits: torch.Tensor, hidden: torch.Tensor, matrix) -> None:
    """Overwrite each row's top REFINED_LOGITS logits with float32 products, in place."""
    top = logits.topk(min(REFINED_LOGITS, logits.shape[1]), dim=1).indices  # [n, k]
    rows = matrix.rows(top.reshape(-1), torch.float32).view(*top.shape, -1)  # [n, k, hidden]
    exact = torch.bmm(rows, hidden.float().unsqueeze(2)).squeeze(2)  # [n, k]
    logits.scatter_(1, top, exact)
