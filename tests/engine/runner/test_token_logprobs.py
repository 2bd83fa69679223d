"""token_logprobs on hand-made logits: log_softmax of the raw logits, the top-k sorted, the
chosen token's own log-probability even outside the top-k, nothing for rows that do not
ask; and SamplingParams.logprobs' validation."""

from __future__ import annotations

import pytest
import torch

from engine.runner.logprobs import token_logprobs
from engine.sampling_params import MAX_LOGPROBS, SamplingParams


def test_equal_to_log_softmax_of_the_raw_logits_with_the_top_k_sorted():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    tokens = [3, 7, 11, 0]
    out = token_logprobs(logits, tokens, [5, 0, None, 20])
    expected = torch.log_softmax(logits, dim=-1)
    for row, k in ((0, 5), (1, 0), (3, 20)):
        entry = out[row]
        assert entry.token_id == tokens[row]
        assert entry.logprob == pytest.approx(float(expected[row, tokens[row]]), abs=1e-6)
        assert len(entry.top) == k
        values = [v for _, v in entry.top]
        assert values == sorted(values, reverse=True)
        reference = torch.topk(expected[row], k) if k else None
        if k:
            assert [i for i, _ in entry.top] == reference.indices.tolist()
            assert values == pytest.approx(reference.values.tolist(), abs=1e-6)
    assert out[2] is None


def test_the_chosen_token_is_reported_outside_the_top_k():
    logits = torch.tensor([[5.0, 4.0, 3.0, -2.0]])
    [entry] = token_logprobs(logits, [3], [2])
    assert [i for i, _ in entry.top] == [0, 1]
    assert entry.logprob == pytest.approx(float(torch.log_softmax(logits, -1)[0, 3]))


def test_bfloat16_logits_and_k_beyond_the_vocabulary():
    logits = torch.randn(2, 8).to(torch.bfloat16)
    out = token_logprobs(logits, [1, 2], [20, 3])
    assert len(out[0].top) == 8 and len(out[1].top) == 3
    assert out[0].logprob == pytest.approx(
        float(torch.log_softmax(logits.float(), -1)[0, 1]), abs=1e-6)


def test_no_row_asks_no_work(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("log_softmax computed for a batch that asked for nothing")

    monkeypatch.setattr(torch, "log_softmax", forbidden)
    assert token_logprobs(torch.zeros(3, 10), [1, 2, 3], [None] * 3) == [None] * 3


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="logits"):
        token_logprobs(torch.zeros(2, 10), [1], [None])


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1, 2.0, True, "3"])
def test_sampling_params_logprobs_is_validated(value):
    with pytest.raises(ValueError, match="SamplingParams.logprobs"):
        SamplingParams(logprobs=value)


def test_sampling_params_logprobs_range():
    assert SamplingParams().logprobs is None
    assert SamplingParams(logprobs=0).logprobs == 0
    assert SamplingParams(logprobs=MAX_LOGPROBS).logprobs == MAX_LOGPROBS
