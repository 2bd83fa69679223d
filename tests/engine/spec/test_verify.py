"""Verification of one candidate's drafts: greedy keeps the model's own choices, sampling
keeps the model's distribution (a chi-square test), a grammar cuts the drafts."""

from __future__ import annotations

import torch

from engine.core.sequence import Sequence
from engine.runner.sampler import Sampler, make_generator
from engine.sampling_params import SamplingParams
from engine.spec.verify import verify


def seq_with(generator=None) -> Sequence:
    seq = Sequence(0, "r", 0, [1, 2, 3], 3)
    seq.generator = generator
    return seq


def one_hot_logits(tokens: list[int], vocab: int = 8) -> torch.Tensor:
    logits = torch.zeros(len(tokens), vocab)
    for row, token in enumerate(tokens):
        logits[row, token] = 5.0
    return logits


def test_greedy_keeps_matching_drafts_then_the_models_token():
    params = SamplingParams(temperature=0)
    # The model would write 4 5 6 7: the drafts 4 5 0 keep two, then the model's 6.
    tokens, kept = verify(one_hot_logits([4, 5, 6, 7]), seq_with(), [4, 5, 0], params, None,
                          Sampler())
    assert (tokens, kept) == ([4, 5, 6], 2)
    # Every draft kept: the bonus token from the last row.
    tokens, kept = verify(one_hot_logits([4, 5, 6, 7]), seq_with(), [4, 5, 6], params, None,
                          Sampler())
    assert (tokens, kept) == ([4, 5, 6, 7], 3)
    # The first draft wrong: the model's own token alone, as plain decoding.
    tokens, kept = verify(one_hot_logits([4, 5]), seq_with(), [1], params, None, Sampler())
    assert (tokens, kept) == ([4], 0)


def test_greedy_rows_see_the_drafts_before_them_for_the_repetition_penalty():
    params = SamplingParams(temperature=0, repetition_penalty=10.0)
    logits = torch.tensor([[0.0, 0, 0, 0, 3.0, 2.9, 0, 0]] * 2)
    # Row 1 follows draft 4: penalized there, so the model picks 5 at row 1.
    tokens, _ = verify(logits, seq_with(), [4], params, None, Sampler())
    assert tokens == [4, 5]


def chi_square(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, probs, strict=True)
               if p > 0)


def test_sampled_tokens_follow_the_models_distribution():
    """Drafts of token 0 (likely) and token 3 (unlikely): the first token's distribution
    equals the target's either way. 4,000 seeded draws, 5 degrees of freedom: the 0.001
    critical value is 20.5."""
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05],
                                     [0.1, 0.1, 0.2, 0.2, 0.2, 0.2]]))
    target = [0.5, 0.2, 0.1, 0.1, 0.05, 0.05]
    params = SamplingParams(temperature=1.0, seed=0)
    sampler = Sampler()
    for draft in (0, 3):
        counts = [0] * 6
        second = [0] * 6
        for trial in range(4000):
            seq = seq_with(make_generator(trial, 0))
            tokens, kept = verify(logits, seq, [draft], params, None, sampler)
            counts[tokens[0]] += 1
            if kept:
                second[tokens[1]] += 1
        assert chi_square(counts, target) < 20.5, (draft, counts)
        if sum(second) > 500:
            # After a kept draft the bonus token follows row 1's distribution.
            assert chi_square(second, [0.1, 0.1, 0.2, 0.2, 0.2, 0.2]) < 20.5, second


class FakeMatcher:
    """A grammar that allows only the tokens in ``allowed`` and ends after ``length``."""

    def __init__(self, allowed: set[int], length: int, taken: int = 0) -> None:
        self.allowed, self.length, self.taken = allowed, length, taken

    def fork(self):
        return FakeMatcher(self.allowed, self.length, self.taken)

    def accept(self, token: int) -> bool:
        if token not in self.allowed:
            return False
        self.taken += 1
        return True

    @property
    def done(self) -> bool:
        return self.taken >= self.length

    def fill(self, bitmask, row):
        bits = 0
        for token in self.allowed:
            bits |= 1 << token
        bitmask[row, 0] = torch.tensor(bits, dtype=torch.int64).to(torch.int32)


def test_a_grammar_cuts_the_drafts_at_the_first_it_refuses():
    params = SamplingParams(temperature=0)
    matcher = FakeMatcher({4, 5, 6}, length=10)
    # Draft 7 is refused: its row is masked, so the model's 6 comes instead, and the
    # rows after it are not read.
    tokens, kept = verify(one_hot_logits([4, 6, 6, 6]), seq_with(), [4, 7, 6], params,
                          matcher, Sampler())
    assert (tokens, kept) == ([4, 6], 1)
    assert matcher.taken == 0  # the candidate's own state is untouched


def test_a_grammar_that_completes_on_a_draft_ends_there():
    params = SamplingParams(temperature=0)
    matcher = FakeMatcher({4, 5, 6}, length=2)
    tokens, kept = verify(one_hot_logits([4, 5, 6]), seq_with(), [4, 5], params, matcher,
                          Sampler())
    assert (tokens, kept) == ([4, 5], 2)
