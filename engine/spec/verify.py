"""One candidate's drafts checked against the model's logits at each of their positions.

Row i of the logits follows the candidate's tokens and its first i drafts. Greedy rows
keep the drafts while each equals the model's choice, then add the model's own token (the
correction, or a bonus token after the last draft): the reply is the one plain decoding
writes. Sampled rows use the rejection rule of Leviathan et al. and Chen et al. for a
proposer that names one token (its distribution is one-hot): draft i is kept with the
probability the model's processed distribution gives it; at the first rejection a token is
drawn from that distribution without the draft; after the last draft, from the next row.
Each output token is therefore distributed as plain sampling would draw it.

A grammar (structured output) masks each row with its state after the drafts before it;
the drafts stop at the first one it refuses, or once it is complete.
"""

from __future__ import annotations

import torch

from engine.core.sequence import Sequence
from engine.grammar import Matcher, token_masks
from engine.runner.sampler import Sampler, SamplingRow
from engine.sampling_params import SamplingParams


def verify(logits: torch.Tensor, seq: Sequence, drafts: list[int], params: SamplingParams,
           matcher: Matcher | None, sampler: Sampler) -> tuple[list[int], int]:
    """``logits`` [len(drafts) + 1, vocab]: the tokens to append to ``seq`` (the kept
    drafts, then the model's own token unless a grammar ended the reply on a draft) and
    how many of them are kept drafts."""
    matchers = _grammar_states(matcher, drafts)
    rows_used = len(matchers) if matcher is not None else len(drafts) + 1
    masks = token_masks(matchers, logits.shape[-1]) if matcher is not None \
        else [None] * rows_used
    history = seq.token_ids
    # A row's tokens so far matter only to the repetition penalty: copied only for it.
    penalized = params.repetition_penalty != 1.0
    rows = [SamplingRow(params, seq.generator, history + drafts[:i] if penalized else history,
                        masks[i]) for i in range(rows_used)]
    logits = logits[:rows_used]
    if params.greedy:
        chosen = sampler(logits, rows)
        for i, token in enumerate(chosen):
            if i == len(drafts) or token != drafts[i]:
                return chosen[:i + 1], i
        return list(drafts[:rows_used]), rows_used  # the grammar completed the reply
    probs = sampler.probabilities(logits, rows)
    kept: list[int] = []
    for i in range(rows_used):
        if i == len(drafts):
            return kept + sampler.draw(probs[i:i + 1], [seq.generator]), i
        draft = drafts[i]
        if sampler.uniform(seq.generator) < float(probs[i, draft]):
            kept.append(draft)
            continue
        rest = probs[i:i + 1].clone()
        rest[0, draft] = 0.0
        return kept + sampler.draw(rest, [seq.generator]), i
    return kept, len(kept)


def _grammar_states(matcher: Matcher | None, drafts: list[int]) -> list[Matcher | None]:
    """The grammar's state before each row: before the drafts, then after each one it
    takes, stopping at a draft it refuses or that completes the reply."""
    if matcher is None:
        return [None]
    states = [matcher.fork()]
    for draft in drafts:
        after = states[-1].fork()
        if not after.accept(draft) or after.done:
            break
        states.append(after)
    return states
