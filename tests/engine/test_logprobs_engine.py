"""Log-probabilities through the whole engine on a tiny random Llama, against transformers
running the same weights over the same tokens: log_softmax of the model's own logits at
each position (before repetition penalty, temperature and top-p), for every candidate,
streamed token by token, kept across preemption, and computed only when asked for."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import FinishedEvent, TokenEvent
from tests.engine.tiny_models import random_prompt

ATOL = 1e-4  # the engine's logits against transformers' on this model (test_llama.py)


PROMPT = random_prompt(3, 30)


def reference(hf_model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), vocab]: log_softmax of the logits that predicted each output token."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)


def assert_matches(entries, output: list[int], expected: torch.Tensor, k: int) -> int:
    """Checks each entry against the reference; returns how many chosen tokens were
    outside their top-k."""
    assert [e.token_id for e in entries] == output
    outside = 0
    for entry, row in zip(entries, expected, strict=True):
        assert entry.logprob == pytest.approx(float(row[entry.token_id]), abs=ATOL)
        values = [v for _, v in entry.top]
        assert len(values) == k and values == sorted(values, reverse=True)
        best = torch.topk(row, k)
        assert values == pytest.approx(best.values.tolist(), abs=ATOL)
        for (token, value), ref_token in zip(entry.top, best.indices.tolist(), strict=True):
            assert token == ref_token or value == pytest.approx(float(row[ref_token]),
                                                                abs=ATOL)  # a near tie
        outside += entry.token_id not in [t for t, _ in entry.top]
    return outside


def test_every_candidates_logprobs_are_the_models_own(llm, hf_model):
    # Penalty, temperature and top-p change what is drawn, never what is reported.
    params = SamplingParams(n=3, temperature=1.8, top_p=0.95, repetition_penalty=1.3,
                            seed=5, max_tokens=24, ignore_eos=True, logprobs=2)
    [out] = llm.generate([PROMPT], params)
    outside = 0
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids) == 24
        outside += assert_matches(c.logprobs, c.token_ids, reference(hf_model, PROMPT,
                                                                     c.token_ids), 2)
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    assert outside > 0  # the sampler picked tokens outside the top 2: still reported


def test_greedy_logprobs_and_the_stop_token(llm, hf_model):
    params = SamplingParams(temperature=0, max_tokens=16, logprobs=20)
    [out] = llm.generate([PROMPT], params)
    c = out.outputs[0]
    assert_matches(c.logprobs, c.token_ids, reference(hf_model, PROMPT, c.token_ids), 20)
    # Greedy: the chosen token is the most probable one.
    assert all(e.top[0][0] == e.token_id for e in c.logprobs)


def test_streamed_events_carry_every_token_held_back_text_or_not(tiny_dir):
    engine = LLMEngine(str(tiny_dir), EngineConfig(num_gpu_blocks=64))
    # Random bytes: many tokens are half a UTF-8 character, whose text is held back.
    asking = engine.add_request(PROMPT, SamplingParams(
        n=2, temperature=1.0, seed=1, max_tokens=40, ignore_eos=True, logprobs=3))
    quiet = engine.add_request(random_prompt(4, 20), SamplingParams(
        temperature=1.0, seed=2, max_tokens=40, ignore_eos=True))
    events: dict[tuple[str, int], list[TokenEvent]] = {}
    done = {}
    while engine.has_unfinished_requests():
        for event in engine.step():
            if isinstance(event, TokenEvent):
                events.setdefault((event.request_id, event.index), []).append(event)
            elif isinstance(event, FinishedEvent):
                done[event.request_id] = event.output
    for c in done[asking].outputs:
        streamed = events[(asking, c.index)]
        assert [e for ev in streamed for e in ev.logprobs] == c.logprobs
        assert [t for ev in streamed for t in ev.token_ids] == c.token_ids
        assert "".join(ev.text for ev in streamed) == c.text
        assert any(ev.text == "" for ev in streamed)  # a held-back token still reported
    assert done[quiet].outputs[0].logprobs is None
    assert all(ev.logprobs is None for ev in events[(quiet, 0)])
    assert len(events[(quiet, 0)]) < 40  # held-back tokens make no event here


def test_requests_without_logprobs_compute_none(llm, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("log-probabilities computed for a request that did not ask")

    monkeypatch.setattr(torch, "log_softmax", forbidden)
    [out] = llm.generate([PROMPT], SamplingParams(n=2, max_tokens=8, seed=0))
    assert all(c.logprobs is None for c in out.outputs)


def test_logprobs_survive_recompute_preemption(tiny_dir):
    prompts = [random_prompt(i, 20 + i) for i in range(4)]
    params = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True, logprobs=3)
    big = LLM(str(tiny_dir), num_gpu_blocks=256, block_size=16)
    small = LLM(str(tiny_dir), num_gpu_blocks=20, block_size=16)
    expected = [out.outputs[0] for out in big.generate(prompts, params)]
    got = [out.outputs[0] for out in small.generate(prompts, params)]
    assert small.engine.scheduler.num_preemptions > 0
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.token_ids == theirs.token_ids
        assert len(mine.logprobs) == 100
        for a, b in zip(mine.logprobs, theirs.logprobs, strict=True):
            assert a.token_id == b.token_id
            assert a.logprob == pytest.approx(b.logprob, abs=ATOL)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
