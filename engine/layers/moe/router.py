"""The softmax router of a mixture of experts (OLMoE, Qwen3-MoE, Mixtral, Qwen3.5-MoE):
each token's top-k experts and their weights, `SparseMoE`'s default gate. gpt-oss's own
router is in gpt_oss.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.base import Layer


class TopKRouter(Layer):
    """softmax(x @ W.T) over the experts, then each token's top k, optionally rescaled to
    sum to one (``normalize``: Mixtral and Qwen3-MoE; OLMoE keeps the raw probabilities).

    The scores are float32 whatever the model's dtype, and the top k come from
    ``torch.topk`` over the probabilities, as transformers computes them: equal scores
    then go to the same experts (the lower index first)."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, normalize: bool,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be between 1 and num_experts "
                             f"({num_experts}), got {top_k}")
        self.top_k = top_k
        self.normalize = normalize
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype,
                                               device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, k] in x's dtype, expert ids int64 [T, k])."""
        probs = torch.softmax(F.linear(x, self.weight).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids
