"""Log-probabilities of the sampled tokens, for the rows of a step that ask for them.

They are log_softmax of the model's raw logits (before repetition penalty, temperature and
the top-k/p/min-p filters, as vLLM reports by default): what the model thinks of each
token, whatever the sampler then did with it. Only rows with ``SamplingParams.logprobs``
set are computed, in one batched call, so other requests pay nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.outputs import TokenLogprobs


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int],
                   wanted: Sequence[int | None]) -> list[TokenLogprobs | None]:
    """Per row of ``logits`` [N, vocab]: the log-probability of ``tokens[row]`` and the
    ``wanted[row]`` most probable tokens; None for rows whose ``wanted`` is None."""
    if not (logits.dim() == 2 and logits.shape[0] == len(tokens) == len(wanted)):
        raise ValueError(f"logits must be [len(tokens), vocab]; got {tuple(logits.shape)} "
                         f"for {len(tokens)} tokens and {len(wanted)} requests")
    out: list[TokenLogprobs | None] = [None] * len(tokens)
    rows = [r for r, k in enumerate(wanted) if k is not None]
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    logp = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    chosen_ids = torch.tensor([tokens[r] for r in rows], device=logits.device)
    chosen = logp.gather(1, chosen_ids.unsqueeze(1)).squeeze(1).tolist()
    widest = min(max(wanted[r] for r in rows), logp.shape[1])
    top_values, top_ids = ([], [])
    if widest:
        top = torch.topk(logp, widest, dim=-1)  # sorted, most probable first
        top_values, top_ids = top.values.tolist(), top.indices.tolist()
    for i, r in enumerate(rows):
        k = min(wanted[r], widest)
        pairs = tuple(zip(top_ids[i][:k], top_values[i][:k], strict=True)) if k else ()
        out[r] = TokenLogprobs(int(tokens[r]), chosen[i], pairs)
    return out
