"""Speculative decoding on hybrid models (Qwen3.5, dense and mixture of experts), whose
linear-attention layers keep a recurrent state: the verify step keeps the state after
each of its tokens, and the state after the last kept one runs on.

Random hybrid models rarely repeat themselves, so prompt lookup finds little: these tests
draft from a prediction, the plain reply's ids with some tokens changed, so that steps
keep all, some and none of their drafts. Float32 pools, so a verify step's rows are the
numbers plain decode computes."""

from __future__ import annotations

import pytest

from engine.sampling_params import ResponseFormat, SamplingParams
from tests.engine.engine_runs import run_to_end
from tests.engine.spec.test_spec_engine import check_pool
from tests.engine.tiny_models import (
    peaked_weights,
    random_prompt,
    save_tiny_model,
    tiny_llama_config,
    tiny_qwen35_config,
    tiny_qwen35_moe_config,
)

BLOCK = 8
PROMPT = random_prompt(3, 12) * 3


def make_engine(folder, **fields):
    from engine import LLM

    fields = {"num_gpu_blocks": 128, "kv_cache_dtype": "float32", "block_size": BLOCK,
              **fields}
    return LLM(str(folder), **fields).engine


@pytest.fixture(scope="module", params=["qwen35", "qwen35_moe"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / request.param
    config = tiny_qwen35_config() if request.param == "qwen35" else tiny_qwen35_moe_config()
    return save_tiny_model(path, config, init=peaked_weights)


@pytest.fixture(scope="module")
def plain(folder):
    return make_engine(folder)


def run(engine, params, prompt=PROMPT, check=None):
    engine.add_request(prompt, params)
    return run_to_end(engine, check)


def wrong_in_places(engine, token_ids: list[int]) -> str:
    """The reply's text with a few of its tokens replaced: drafts that are kept up to
    each wrong token, then rejected."""
    ids = list(token_ids)
    for i in (3, 4, 17, 26):
        ids[i] = (ids[i] + 1) % 256
    return engine.tokenizer.decode(ids)


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_replies_equal_plain_decode(folder, plain, n):
    params = SamplingParams(temperature=0, max_tokens=40, n=n, ignore_eos=True)
    expected = run(plain, params).outputs[0]
    spec = make_engine(folder, speculative="ngram", num_speculative_tokens=4)
    predicted = SamplingParams(temperature=0, max_tokens=40, n=n, ignore_eos=True,
                               prediction=wrong_in_places(plain, expected.token_ids))
    got = run(spec, predicted, check=check_pool)
    assert [o.token_ids for o in got.outputs] == [expected.token_ids] * n
    assert got.metrics.num_draft_tokens > got.metrics.num_accepted_draft_tokens > 0


def test_logprobs_are_the_targets_for_kept_drafts(folder, plain):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2)
    expected = run(plain, params).outputs[0]
    predicted = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2,
                               prediction=wrong_in_places(plain, expected.token_ids))
    got = run(plain, predicted).outputs[0]
    assert got.token_ids == expected.token_ids
    for a, b in zip(got.logprobs, expected.logprobs, strict=True):
        assert a.token_id == b.token_id
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_prefix_cache_holds_what_plain_decode_leaves(folder):
    """The attention blocks and the state snapshots at block boundaries: a speculative
    run leaves the same cached prefixes as a plain run of the same reply, and a follow-up
    turn finds as many of them."""
    plain, spec = make_engine(folder), make_engine(folder)
    params = SamplingParams(temperature=0, max_tokens=41, ignore_eos=True)
    expected = run(plain, params).outputs[0]
    predicted = SamplingParams(temperature=0, max_tokens=41, ignore_eos=True,
                               prediction=wrong_in_places(plain, expected.token_ids))
    got = run(spec, predicted, check=check_pool)
    assert got.outputs[0].token_ids == expected.token_ids
    for p, s in zip(plain.kv_cache.pools, spec.kv_cache.pools, strict=True):
        assert {h: blk.token_ids for h, blk in p.cached.items()} == \
            {h: blk.token_ids for h, blk in s.cached.items()}
    follow_up = PROMPT + list(expected.token_ids) + random_prompt(9, 5)
    again = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a, b = run(plain, again, follow_up), run(spec, again, follow_up)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert b.metrics.num_cached_tokens == a.metrics.num_cached_tokens > len(PROMPT)


def test_grammar_replies_equal_plain_decode(folder, plain):
    fmt = ResponseFormat("json_object")
    params = SamplingParams(temperature=0, max_tokens=30, response_format=fmt)
    expected = run(plain, params).outputs[0]
    predicted = SamplingParams(temperature=0, max_tokens=30, response_format=fmt,
                               prediction=expected.text + " {\"x\": 1}")
    got = run(plain, predicted, check=check_pool)
    assert got.outputs[0].token_ids == expected.token_ids
    assert got.outputs[0].finish_reason == expected.finish_reason
    assert got.metrics.num_accepted_draft_tokens > 0


def test_a_small_state_pool_cuts_drafts_and_stays_exact(folder, plain):
    """Fewer spare state slots than three candidates' drafts: the drafts are cut to
    what fits (halved until they do), some still kept, and the replies are plain
    decode's."""
    params = SamplingParams(temperature=0, max_tokens=30, n=3, ignore_eos=True)
    expected = run(plain, params)
    spec = make_engine(folder, num_gpu_blocks=24, max_num_seqs=3)
    assert spec.kv_cache.state_slots < 3 + 3 * 8  # running states and first drafts
    predicted = SamplingParams(temperature=0, max_tokens=30, n=3, ignore_eos=True,
                               prediction=wrong_in_places(plain, expected.outputs[0].token_ids))
    got = run(spec, predicted, check=check_pool)
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in expected.outputs]
    assert got.metrics.num_accepted_draft_tokens > 0
    assert spec.scheduler.num_preemptions == 0
    for pool in spec.kv_cache.pools:
        assert not any(b.ref_count for b in pool.blocks)


@pytest.mark.parametrize("n", [1, 3])
def test_a_dense_draft_model_drafts_for_a_hybrid_target(folder, plain, tmp_path, n):
    """A small Llama of the same vocabulary drafting for the hybrid model: its random
    drafts are rejected (the target's state goes back every step), the replies plain
    decode's."""
    draft = save_tiny_model(tmp_path / "draft", tiny_llama_config(num_hidden_layers=1),
                            seed=5, init=peaked_weights)
    spec = make_engine(folder, speculative=f"draft:{draft}", num_speculative_tokens=4)
    params = SamplingParams(temperature=0, max_tokens=30, n=n, ignore_eos=True)
    expected = run(plain, params)
    got = run(spec, params, check=check_pool)
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in expected.outputs]
    assert got.metrics.num_draft_tokens > 0
