"""The starter model end to end: real weights, real tokenizer, a two-turn chat."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def starter():
    return LLM("starter")


def test_capital_of_france_mentions_paris(starter):
    out = starter.chat(QUESTION, SamplingParams(max_tokens=32, temperature=0))
    assert "Paris" in out.outputs[0].text
    assert out.metrics.num_prompt_tokens > 0
    assert out.metrics.ttft_s > 0


def test_second_turn_finds_the_first_turn_in_the_cache(starter):
    params = SamplingParams(max_tokens=24, temperature=0)
    first = starter.chat(QUESTION, params)
    reply = first.outputs[0]
    messages = QUESTION + [
        {"role": "assistant", "content": reply.text, "token_ids": reply.token_ids},
        {"role": "user", "content": "And of Germany?"},
    ]
    second = starter.chat(messages, params)
    turn_one = first.metrics.num_prompt_tokens + len(reply.token_ids)
    assert second.metrics.num_cached_tokens >= turn_one - starter.kv_stats().block_size
    assert second.metrics.num_cached_tokens < second.metrics.num_prompt_tokens
    assert "Berlin" in second.outputs[0].text


def test_candidates_share_the_prompt_blocks(starter):
    params = SamplingParams(n=3, temperature=0.9, seed=11, max_tokens=12)
    out = starter.chat(QUESTION, params)
    texts = [o.text for o in out.outputs]
    assert len(texts) == 3 and all(texts)
    assert len(set(texts)) > 1
