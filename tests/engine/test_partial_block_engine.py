"""The partial last block reused through the whole engine, on the tiny random Llama
(block size 16): each follow-up turn computes only what the last turn never did, and
every reply equals the engine's with prefix caching off, alone, with candidates and
under preemption by recompute."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from tests.engine.tiny_models import random_prompt

GREEDY = SamplingParams(max_tokens=21, temperature=0, ignore_eos=True)

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def chat(llm: LLM, turns: int) -> tuple[list[list[int]], list[int]]:
    """Replies and each turn's cached tokens; each turn adds 5 tokens to the last
    prompt and reply (a 21-token reply: every turn ends inside a block)."""
    prompt, replies, cached = random_prompt(3, 37), [], []
    for turn in range(turns):
        [out] = llm.generate([prompt], GREEDY)
        replies.append(list(out.outputs[0].token_ids))
        cached.append(out.metrics.num_cached_tokens)
        prompt = prompt + replies[-1] + random_prompt(10 + turn, 5)
    return replies, cached


def test_a_chat_reuses_every_computed_token_and_replies_as_without_the_cache(tiny_dir):
    warm = LLM(str(tiny_dir), num_gpu_blocks=64)
    replies, cached = chat(warm, 4)
    # Turn t's prompt: 37 + 26 (t - 1) tokens; all but the last reply token are cached.
    assert cached == [0] + [37 + 26 * t - 6 for t in range(1, 4)]
    assert all(c % 16 for c in cached[1:])  # not block multiples: partial blocks helped
    cold = LLM(str(tiny_dir), num_gpu_blocks=64, enable_prefix_caching=False)
    assert chat(cold, 4) == (replies, [0, 0, 0, 0])
    assert warm.kv_stats().num_used == 0


def test_a_follow_up_on_one_candidate_copies_that_candidates_block(tiny_dir):
    llm = LLM(str(tiny_dir), num_gpu_blocks=64)
    prompt = random_prompt(4, 30)
    params = SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=9, ignore_eos=True)
    [out] = llm.generate([prompt], params)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    cold = LLM(str(tiny_dir), num_gpu_blocks=64, enable_prefix_caching=False)
    [cold_out] = cold.generate([prompt], params)
    assert [c.token_ids for c in cold_out.outputs] == [c.token_ids for c in out.outputs]
    for cand in out.outputs:
        follow = prompt + list(cand.token_ids) + [7, 8]
        [warm] = llm.generate([follow], GREEDY)
        assert warm.metrics.num_cached_tokens == 30 + 9 - 1
        assert warm.outputs[0].token_ids == cold.generate([follow], GREEDY)[0].outputs[0].token_ids


def test_preemption_by_recompute_gives_the_uncached_results(tiny_dir):
    """A sequence is preempted when it needs a new block, so at a block boundary: the
    hypothesis machine (tests/engine/core/test_kv_state_machine.py) preempts at any
    point; here the whole engine, whose freed sequences keep their partial blocks."""
    prompts = [random_prompt(i, 20 + i) for i in range(6)]
    params = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True)
    cold = LLM(str(tiny_dir), num_gpu_blocks=256, enable_prefix_caching=False, block_size=16)
    expected = [out.outputs[0].token_ids for out in cold.generate(prompts, params)]
    small = LLM(str(tiny_dir), num_gpu_blocks=24, block_size=16)
    got = [out.outputs[0].token_ids for out in small.generate(prompts, params)]
    assert small.engine.scheduler.num_preemptions > 0
    assert got == expected
    assert small.kv_stats().num_used == 0
