"""The sampling driver: one step's logits to a token for each candidate that samples.

A sequence about to fork (a request with n > 1 candidates, its prompt just computed)
splits into its candidates here (`Scheduler.fork`: only the blocks split, every other
part was made at admission, engine/requests.py), and each candidate becomes a row: its
sequence's logits, its own generator, its grammar's mask, its request's parameters. The
sampler draws the batch's tokens at once and the log-probabilities asked for are read
from the same rows (engine/runner/logprobs.py).

This runs every step, so a decoding candidate is appended to the step's lists and never
wrapped in a list of its own (only a fork builds one).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.grammar import Matcher, token_masks
from engine.outputs import TokenLogprobs
from engine.requests import RequestState
from engine.runner.logprobs import token_logprobs
from engine.runner.sampler import Sampler, SamplingRow
from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class Sampled:
    """A step's sampled candidates, one entry each, in one order."""

    seqs: list[Sequence]
    states: list[RequestState]
    params: list[SamplingParams]
    matchers: list[Matcher | None]
    tokens: Seq[int]
    logprobs: list[TokenLogprobs | None]
    # Per entry: it follows a draft the model kept (engine/spec), whose K/V then counts
    # as computed; empty when no entry does.
    after_draft: list[bool] = field(default_factory=list)

    def extend(self, more: Sampled) -> None:
        """``more``'s entries after these (a verify step's tokens, engine/spec)."""
        if self.after_draft or more.after_draft:
            self.after_draft = [*(self.after_draft or [False] * len(self.seqs)),
                                *(more.after_draft or [False] * len(more.seqs))]
        self.seqs += more.seqs
        self.states += more.states
        self.params += more.params
        self.matchers += more.matchers
        self.tokens = [*self.tokens, *more.tokens]
        self.logprobs += more.logprobs


def sample(logits: torch.Tensor, seqs: list[Sequence], requests: dict[str, RequestState],
           scheduler: Scheduler, sampler: Sampler) -> Sampled:
    """``logits[i]`` is ``seqs[i]``'s last position; ``sampler`` is called as
    ``sampler(row_logits, rows)`` (a test may stand in its own)."""
    rows: list[int] = []
    targets: list[Sequence] = []
    states: list[RequestState] = []
    for row, seq in enumerate(seqs):
        state = requests[seq.request_id]
        if seq.needs_fork:
            candidates = scheduler.fork(state.request)
            for child in candidates[1:]:
                child.generator = state.generators[child.index]
            rows += [row] * len(candidates)
            targets += candidates
            states += [state] * len(candidates)
        else:
            rows.append(row)
            targets.append(seq)
            states.append(state)
    params = [state.request.params for state in states]
    matchers = [state.matcher(seq.index) for state, seq in zip(states, targets, strict=True)]
    masks = token_masks(matchers, logits.shape[-1])
    sampling_rows = [SamplingRow(p, s.generator, s.token_ids, allowed)
                     for p, s, allowed in zip(params, targets, masks, strict=True)]
    row_logits = logits[rows]
    tokens = sampler(row_logits, sampling_rows)
    logprobs = token_logprobs(row_logits, tokens, [p.logprobs for p in params])
    return Sampled(targets, states, params, matchers, tokens, logprobs)
