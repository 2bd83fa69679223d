"""Speculative decoding through the whole engine on tiny models (float32 pools, so that a
verify step's rows are the numbers plain decode computes): greedy replies equal plain
decode token for token, with drafts kept and rolled back, on a dense model, a sliding-window
model and a mixture of experts; with n candidates, a grammar and logprobs; and the pool
holds exactly what the sequences' tables hold after every step."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.sampling_params import ResponseFormat, SamplingParams
from tests.engine.engine_runs import run_to_end
from tests.engine.tiny_models import (
    peaked_weights,
    random_prompt,
    save_tiny_model,
    tiny_gemma_config,
    tiny_llama_config,
)
from tests.engine.tiny_moe import save_moe_model

BLOCK = 8
# A prompt that repeats itself, so the reply (random weights loop) and the prompt give the
# lookup something to copy.
PROMPT = random_prompt(3, 12) * 3


def make_engine(folder, **fields):
    from engine import LLM

    return LLM(str(folder), num_gpu_blocks=128, kv_cache_dtype="float32", block_size=BLOCK,
               **fields).engine


@pytest.fixture(scope="module", params=["llama", "gemma3", "qwen3_moe"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / request.param
    if request.param == "llama":
        return save_tiny_model(path, tiny_llama_config(), init=peaked_weights)
    if request.param == "gemma3":
        return save_tiny_model(path, tiny_gemma_config(3), init=peaked_weights)
    save_moe_model(path, "qwen3_moe")
    return path


@pytest.fixture(scope="module")
def engines(folder):
    return make_engine(folder), make_engine(folder, speculative="ngram",
                                            num_speculative_tokens=4)


def run(engine, params, prompt=PROMPT, check=None):
    engine.add_request(prompt, params)
    return run_to_end(engine, check)


def check_pool(engine):
    """Every group's reference counts equal the live sequences' tables, and the free
    queue holds every other block."""
    seqs = [s for r in engine.scheduler.requests.values() for s in r.live_seqs]
    for g, pool in enumerate(engine.kv_cache.pools):
        refs = Counter(b for s in seqs for b in engine.kv_cache.block_tables(s)[g]
                       if b != pool.null_id)
        assert {b.block_id: b.ref_count for b in pool.blocks if b.ref_count} == dict(refs)
        assert {b.block_id for b in pool.free_queue} == set(range(pool.num_blocks)) - set(refs)


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_replies_equal_plain_decode(engines, n):
    plain, spec = engines
    params = SamplingParams(temperature=0, max_tokens=40, n=n, ignore_eos=True)
    expected = run(plain, params)
    got = run(spec, params, check=check_pool)
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in expected.outputs]
    assert got.metrics.num_accepted_draft_tokens > 0


def test_rejected_drafts_roll_back(tmp_path):
    """On the tiny Llama some drafts are rejected: the reply is plain decode's and after
    every step the pool holds exactly the tables' blocks (the drafts' extra ones back)."""
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), init=peaked_weights)
    plain, spec = make_engine(folder), make_engine(folder, speculative="ngram")
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompt = random_prompt(5, 12) * 3  # one whose drafts are kept and rejected
    expected = run(plain, params, prompt).outputs[0]
    got = run(spec, params, prompt, check=check_pool)
    assert got.outputs[0].token_ids == expected.token_ids
    assert got.metrics.num_draft_tokens > got.metrics.num_accepted_draft_tokens > 0
    assert spec.kv_stats().rolled_back_blocks > 0


def test_prediction_of_the_reply_is_accepted_and_changes_nothing(engines):
    plain, spec = engines
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = run(plain, params).outputs[0]
    with_prediction = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                     prediction=expected.text, speculative="ngram")
    got = run(plain, with_prediction, check=check_pool)  # an engine that does not speculate
    assert got.outputs[0].token_ids == expected.token_ids
    # Random bytes are not all valid UTF-8: the text's tokens match the reply's in runs.
    assert got.metrics.num_accepted_draft_tokens >= 10


def test_a_prediction_of_token_ids_is_drafted_as_they_are(engines):
    """Ids skip the text: a random reply whose text tokenizes to other ids is still
    drafted right, every draft kept; ids past the vocabulary are refused by name."""
    plain, _ = engines
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = run(plain, params).outputs[0]
    predicted = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                               prediction=list(expected.token_ids))
    got = run(plain, predicted, check=check_pool)
    assert got.outputs[0].token_ids == expected.token_ids
    assert got.metrics.num_accepted_draft_tokens == got.metrics.num_draft_tokens > 30
    vocab = plain.hf_config.vocab_size
    with pytest.raises(ValueError, match=r"SamplingParams\.prediction: token ids"):
        plain.add_request(PROMPT, SamplingParams(prediction=[vocab]))


def test_a_wrong_prediction_changes_nothing(engines):
    plain, _ = engines
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    expected = run(plain, params).outputs[0]
    wrong = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                           prediction="zzzz" * 20)
    got = run(plain, wrong, check=check_pool)
    assert got.outputs[0].token_ids == expected.token_ids
    # Where the reply never meets the prediction, the request's own tokens still draft.
    assert got.metrics.num_draft_tokens > 0


def test_off_turns_the_engines_speculation_off(engines):
    _, spec = engines
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, speculative="off")
    assert run(spec, params).metrics.num_draft_tokens == 0


def test_logprobs_are_the_targets_for_kept_drafts(engines):
    plain, spec = engines
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2)
    expected = run(plain, params).outputs[0]
    got = run(spec, params).outputs[0]
    assert got.token_ids == expected.token_ids
    for a, b in zip(got.logprobs, expected.logprobs, strict=True):
        assert a.token_id == b.token_id
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_every_block_is_free_or_cached_after_the_run(engines):
    _, spec = engines
    run(spec, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for pool in spec.kv_cache.pools:
        assert not any(b.ref_count for b in pool.blocks)
        assert len(pool.free_queue) == pool.num_blocks


def test_prefix_cache_holds_only_accepted_tokens(folder):
    """A plain run and a speculative run of the same reply leave the same cached blocks."""
    plain, spec = make_engine(folder), make_engine(folder, speculative="ngram")
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    a, b = run(plain, params), run(spec, params)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    for p, s in zip(plain.kv_cache.pools, spec.kv_cache.pools, strict=True):
        assert set(p.cached) == set(s.cached)
        assert {h: blk.token_ids for h, blk in p.cached.items()} == \
            {h: blk.token_ids for h, blk in s.cached.items()}


def test_grammar_replies_equal_plain_decode(tmp_path):
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), init=peaked_weights)
    plain, spec = make_engine(folder), make_engine(folder, speculative="ngram")
    fmt = ResponseFormat("json_object")
    params = SamplingParams(temperature=0, max_tokens=40, response_format=fmt)
    expected = run(plain, params).outputs[0]
    # The reply's own text as the prediction: drafts the grammar takes and some it refuses.
    predicted = SamplingParams(temperature=0, max_tokens=40, response_format=fmt,
                               prediction=expected.text + " {\"x\": 1}")
    got = run(spec, predicted, check=check_pool).outputs[0]
    assert got.token_ids == expected.token_ids
    assert got.finish_reason == expected.finish_reason


def test_out_of_room_drops_drafts_before_preempting(tmp_path):
    """A pool with room for the reply alone: the drafts go, nothing is preempted."""
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), init=peaked_weights)
    from engine import LLM

    engine = LLM(str(folder), num_gpu_blocks=6, kv_cache_dtype="float32", block_size=BLOCK,
                 speculative="ngram", num_speculative_tokens=8).engine
    plain = LLM(str(folder), num_gpu_blocks=6, kv_cache_dtype="float32",
                block_size=BLOCK).engine
    params = SamplingParams(temperature=0, max_tokens=47 - len(PROMPT[:8]), ignore_eos=True)
    got = run(engine, params, PROMPT[:8], check_pool)
    assert got.outputs[0].token_ids == run(plain, params, PROMPT[:8]).outputs[0].token_ids
    assert engine.scheduler.num_preemptions == 0


# ------------------------------------------------------------------------- draft model
def test_a_draft_model_of_the_same_weights_is_always_right(tmp_path):
    """The target drafting for itself: every draft kept, the reply plain decode's."""
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), init=peaked_weights)
    plain = make_engine(folder)
    spec = make_engine(folder, speculative=f"draft:{folder}", num_speculative_tokens=4)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = run(plain, params).outputs[0]
    got = run(spec, params, check=check_pool)
    assert got.outputs[0].token_ids == expected.token_ids
    m = got.metrics
    assert m.num_draft_tokens == m.num_accepted_draft_tokens >= 30
    assert spec.weights_bytes == 2 * plain.weights_bytes  # the draft's weights count


@pytest.mark.parametrize("n", [1, 2])
def test_another_draft_model_changes_no_token(tmp_path, n):
    """A draft of other weights (same vocabulary): drafts kept and rejected, the replies
    plain decode's; the draft's own pool holds exactly its mirrors' tables."""
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), init=peaked_weights)
    other = save_tiny_model(tmp_path / "draft", tiny_llama_config(num_hidden_layers=1),
                            seed=5, init=peaked_weights)
    plain = make_engine(folder)
    spec = make_engine(folder, speculative=f"draft:{other}")
    params = SamplingParams(temperature=0, max_tokens=40, n=n, ignore_eos=True)
    expected = run(plain, params)
    draft = spec._speculator.draft

    def check_both(engine):
        check_pool(engine)
        mirrors = [s for r in draft.scheduler.requests.values() for s in r.live_seqs]
        for g, pool in enumerate(draft.scheduler.kv.pools):
            refs = Counter(b for s in mirrors for b in draft.scheduler.kv.block_tables(s)[g]
                           if b != pool.null_id)
            assert {b.block_id: b.ref_count for b in pool.blocks if b.ref_count} == \
                dict(refs)

    got = run(spec, params, check=check_both)
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in expected.outputs]
    assert got.metrics.num_draft_tokens > got.metrics.num_accepted_draft_tokens
    assert not draft.scheduler.requests  # the mirrors went with the request


@pytest.mark.parametrize("n", [1, 3])
def test_a_draft_model_changes_no_token_of_any_family(folder, tmp_path, n):
    """A small Llama of the same vocabulary drafting for the dense, sliding-window and
    mixture-of-experts targets (test_spec_hybrid.py has the hybrid ones): the replies
    plain decode's, with a grammar and logprobs too."""
    draft = save_tiny_model(tmp_path / "draft", tiny_llama_config(num_hidden_layers=1),
                            seed=5, init=peaked_weights)
    plain = make_engine(folder)
    spec = make_engine(folder, speculative=f"draft:{draft}", num_speculative_tokens=4)
    params = SamplingParams(temperature=0, max_tokens=24, n=n, ignore_eos=True, logprobs=1)
    expected = run(plain, params)
    got = run(spec, params, check=check_pool)
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in expected.outputs]
    assert [[lp.token_id for lp in o.logprobs] for o in got.outputs] == \
        [[lp.token_id for lp in o.logprobs] for o in expected.outputs]
    assert got.metrics.num_draft_tokens > 0
    fmt = SamplingParams(temperature=0, max_tokens=24, n=n,
                         response_format=ResponseFormat("json_object"))
    assert [o.token_ids for o in run(spec, fmt, check=check_pool).outputs] == \
        [o.token_ids for o in run(plain, fmt).outputs]


def test_draft_models_that_cannot_draft_are_refused(tmp_path):
    from engine import LLM

    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), init=peaked_weights)
    sliding = save_tiny_model(tmp_path / "gemma3", tiny_gemma_config(3), init=peaked_weights)
    with pytest.raises(ValueError, match="sliding-window"):
        LLM(str(folder), num_gpu_blocks=32, speculative=f"draft:{sliding}")
    other = save_tiny_model(tmp_path / "other", tiny_llama_config(), init=peaked_weights)
    tokenizer_file = other / "tokenizer.json"
    tokenizer_file.write_text(tokenizer_file.read_text().replace('"<|im_end|>"', '"<|end|>"'))
    with pytest.raises(ValueError, match="another vocabulary"):
        LLM(str(folder), num_gpu_blocks=32, speculative=f"draft:{other}")
    engine = make_engine(folder)
    with pytest.raises(ValueError, match="draft model"):
        engine.add_request(PROMPT, SamplingParams(speculative="draft"))
    assert not engine.has_unfinished_requests()


def test_a_prompt_whose_last_token_is_left_alone_still_forks(tmp_path):
    """A chunked prefill that leaves one prompt token: it is sampled plainly (where the
    candidates fork), never verified as a draft step."""
    folder = save_tiny_model(tmp_path / "llama", tiny_llama_config(), init=peaked_weights)
    plain = make_engine(folder, max_num_batched_tokens=len(PROMPT) - 1)
    spec = make_engine(folder, max_num_batched_tokens=len(PROMPT) - 1, speculative="ngram")
    params = SamplingParams(temperature=0, max_tokens=20, n=2, ignore_eos=True)
    expected = run(plain, params)

    def forked_with_the_prompt(engine):
        check_pool(engine)
        for request in engine.scheduler.requests.values():
            [seq, *others] = request.seqs
            if seq.num_computed_tokens >= seq.num_prompt_tokens:
                assert len(others) == 1  # forked in the step that ended the prompt
                assert seq.output_token_ids[0] == others[0].output_token_ids[0]

    got = run(spec, params, check=forked_with_the_prompt)
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in expected.outputs]
