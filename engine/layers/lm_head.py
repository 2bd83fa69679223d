"""The output projection to vocabulary logits.

It is a StackedLinear with one block (so CPU float32 gets oneDNN's packed layout, see
engine/layers/onednn.py, and GGUF blocks stay quantized) that may share its matrix with the
input embedding, and that always returns float32 logits.
"""

from __future__ import annotations

import torch

from engine.layers.embedding import Embedding
from engine.layers.linear import StackedLinear
from engine.layers.native import fused_cpu, native_ops
from engine.layers.weights import DenseWeight, QuantizedRuns, quantized_storage
from kernels.quant.matrix import shares_layout


class LMHead(StackedLinear):
    # 8-bit activations are enough to find the top logits, which refine_top_logits then
    # recomputes in float32; the rest only weigh in as the tail of the distribution.
    precise_products = False

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
        it (float), or one quantized storage serves both where it can (see prepare)."""
        super().__init__(hidden_size, (vocab_size,), False, dtype, device)
        self.tied = tied
        if tied is not None:
            self.weight = tied.weight
            self.storage = DenseWeight(self.weight, self.shape)
            self.keeps_dense_weight = True

    def prepare(self) -> None:
        tied = self.tied
        if tied is None or tied.quantized is None:
            super().prepare()
            if tied is not None:
                tied.prepare()
            return
        self.storage = quantized_storage([tied.quantized], self.device, self.precise_products)
        (layout,) = self.storage.runs
        tied.prepare(shared=self.storage if shares_layout(layout) else None)

    @property
    def derived_bytes(self) -> int:
        # A storage shared with the tied embedding is counted there.
        if self.tied is not None and self.tied.storage is self.storage:
            return 0
        return super().derived_bytes

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> float32 logits [N, vocab]."""
        logits = super().forward(hidden).float()
        if isinstance(self.storage, QuantizedRuns) and hidden.shape[0]:
            refine_top_logits(logits, hidden, self.storage)
        return logits.contiguous()


# The quantized products carry rounding the float32 path lacks (the CPU's 8-bit
# activations or bf16 outputs, CUDA's 16-bit dtype): tokens a float32 head tells apart
# tie or swap, and greedy decoding breaks a tie by token id. The top logits, where
# sampling's mass is, are recomputed in float32 from the dequantized rows.
REFINED_LOGITS = 32


def refine_top_logits(logits: torch.Tensor, hidden: torch.Tensor, matrix) -> None:
    """Overwrite each row's top REFINED_LOGITS logits with float32 products, in place."""
    k = min(REFINED_LOGITS, logits.shape[1])
    if fused_cpu(logits):  # one read of the row; torch.topk sorts it
        top = native_ops().top_k_indices(logits, k)  # [n, k]
    else:
        top = logits.topk(k, dim=1).indices
    rows = matrix.rows(top.reshape(-1), torch.float32).view(*top.shape, -1)  # [n, k, hidden]
    exact = torch.bmm(rows, hidden.float().unsqueeze(2)).squeeze(2)  # [n, k]
    logits.scatter_(1, top, exact)
