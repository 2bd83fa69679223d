"""The MTP head through the whole engine on tiny Qwen3.5 folders that ship one (float32
pools): greedy replies with ``speculative="mtp"`` equal plain decode token for token, with
n = 1 and 3, logprobs and a grammar, dense and MoE; drafts kept and rolled back; the head's pool and
rows empty after every run; models without a head refused by name.

Both layouts speculate: the hybrid one (Qwen3.5 as released: Gated DeltaNet layers, whose
state a verify step keeps per token and rolls back to the last kept one) and a variant of
the tiny model with every layer full attention. Random heads
guess nearly nothing: `save_mtp_model`'s ``leak`` builds a head that knows its model, so
that drafts are kept (all of them at leak 0, some at 0.3)."""

from __future__ import annotations

import json

import pytest

from engine.loaders import FolioLoadError, load_model_files
from engine.sampling_params import ResponseFormat, SamplingParams
from tests.engine.engine_runs import run_to_end
from tests.engine.tiny_models import random_prompt, save_tiny_model, tiny_qwen35_config
from tests.engine.tiny_mtp import mtp_config, save_mtp_model

BLOCK = 8
PROMPT = random_prompt(3, 12) * 3

# name -> (moe, hybrid, leak): leak None is a random head.
MODELS = {
    "dense-knowing": (False, False, 0.3),
    "moe-knowing": (True, False, 0.3),
    "dense-random": (False, False, None),
    "dense-hybrid": (False, True, 0.3),
    "moe-hybrid": (True, True, 0.3),
}


def make_engine(folder, **fields):
    from engine import LLM

    return LLM(str(folder), num_gpu_blocks=128, kv_cache_dtype="float32", block_size=BLOCK,
               **fields).engine


@pytest.fixture(scope="module", params=list(MODELS))
def engines(request, tmp_path_factory):
    moe, hybrid, leak = MODELS[request.param]
    folder = save_mtp_model(tmp_path_factory.mktemp("mtp") / request.param,
                            mtp_config(moe=moe, hybrid=hybrid), leak=leak)
    return request.param, make_engine(folder), make_engine(folder, speculative="mtp")


def run(engine, params, prompt=PROMPT):
    engine.add_request(prompt, params)
    return run_to_end(engine)


def head_is_empty(engine) -> None:
    """Every mirror ended and its rows dropped; every block of the head's pool free or
    cached."""
    mtp = engine._speculator.draft
    assert not mtp.scheduler.requests and not mtp._mirrors and not mtp._rows
    assert all(b.ref_count == 0 for b in mtp.scheduler.kv.pools[0].blocks)


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_replies_equal_plain_decode(engines, n):
    name, plain, spec = engines
    params = SamplingParams(temperature=0, max_tokens=40, n=n, ignore_eos=True, logprobs=2)
    expected = run(plain, params)
    got = run(spec, params)
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in expected.outputs]
    for a, b in zip(got.outputs, expected.outputs, strict=True):
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert x.token_id == y.token_id
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert [t for t, _ in x.top] == [t for t, _ in y.top]
            assert [p for _, p in x.top] == pytest.approx([p for _, p in y.top], abs=1e-4)
    head_is_empty(spec)
    drafted = got.metrics.num_draft_tokens
    kept = got.metrics.num_accepted_draft_tokens
    if MODELS[name][2] is None:  # a random head: drafts tried, nearly all rejected
        assert drafted > 0
    else:  # a head that knows its model: some kept, some rejected (leak 0.3)
        assert 0 < kept < drafted


def test_grammar_replies_equal_plain_decode(engines):
    """JSON mode: the head's drafts are cut at the first token the grammar refuses, and
    the replies are plain decode's."""
    _, plain, spec = engines
    params = SamplingParams(temperature=0, max_tokens=30, response_format=ResponseFormat(
        "json_object"))
    expected = run(plain, params).outputs[0]
    got = run(spec, params).outputs[0]
    assert got.token_ids == expected.token_ids
    assert got.finish_reason == expected.finish_reason
    head_is_empty(spec)


def test_a_head_that_knows_a_bigram_model_is_always_right(tmp_path):
    folder = save_mtp_model(tmp_path / "m", mtp_config(hybrid=False), leak=0.0)
    spec = make_engine(folder, speculative="mtp")
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    got = run(spec, params)
    assert got.outputs[0].token_ids == run(make_engine(folder), params).outputs[0].token_ids
    assert got.metrics.num_accepted_draft_tokens == got.metrics.num_draft_tokens > 24
    head_is_empty(spec)


def test_a_new_turn_finds_the_heads_blocks_in_its_prefix_cache(tmp_path):
    folder = save_mtp_model(tmp_path / "m", mtp_config(hybrid=False), leak=0.0)
    spec = make_engine(folder, speculative="mtp")
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    first = run(spec, params)
    head_kv = spec._speculator.draft.scheduler.kv
    hits = head_kv.prefix_hit_tokens
    second = run(spec, params, PROMPT + first.outputs[0].token_ids + [5, 6, 7])
    assert head_kv.prefix_hit_tokens - hits >= 3 * BLOCK
    assert second.metrics.num_accepted_draft_tokens == second.metrics.num_draft_tokens > 0


def test_plain_engines_never_read_the_head(tmp_path):
    folder = save_mtp_model(tmp_path / "m", mtp_config())
    plain = load_model_files(folder)
    assert not any(name.startswith("mtp.") for name in plain.weights.shapes)
    assert not any(name.startswith("mtp.") for name, _ in plain.weights)
    with_head = load_model_files(folder, with_mtp=True)
    assert "mtp.fc.weight" in with_head.weights.shapes
    engine = make_engine(folder)
    assert engine._speculator.draft is None and engine.runner.hidden_sink is None
    spec = make_engine(folder, speculative="mtp")
    assert spec.weights_bytes == engine.weights_bytes + spec._speculator.draft.weights_bytes > \
        engine.weights_bytes


def test_a_model_without_a_head_is_refused_by_name(tmp_path):
    folder = save_tiny_model(tmp_path / "plain", tiny_qwen35_config())
    with pytest.raises(ValueError, match=r"EngineConfig\.speculative: 'mtp' needs .*plain "
                                         r"has none \(its config has no mtp_num_hidden"):
        make_engine(folder, speculative="mtp")
    no_weights = save_tiny_model(tmp_path / "nohead", tiny_qwen35_config(
        mtp_num_hidden_layers=1))
    with pytest.raises(ValueError, match=r"nohead has none \(its weights hold no mtp"):
        make_engine(no_weights, speculative="mtp")


def test_a_request_asking_for_mtp_needs_an_mtp_engine(tmp_path):
    folder = save_mtp_model(tmp_path / "m", mtp_config(hybrid=False))
    engine = make_engine(folder, speculative="ngram")
    with pytest.raises(ValueError, match=r"SamplingParams\.speculative: 'mtp' needs"):
        engine.add_request(PROMPT, SamplingParams(speculative="mtp"))
    assert not engine.has_unfinished_requests()


def test_a_gguf_file_has_no_head_to_load(tmp_path):
    file = tmp_path / "qwen35.gguf"
    file.write_bytes(b"GGUF")
    with pytest.raises(FolioLoadError, match=r"speculative='mtp'.*no nextn tensors"):
        load_model_files(file, with_mtp=True)


def test_a_multimodal_releases_head_loads_beside_its_text_part(tmp_path):
    """Qwen3.5 as released: Qwen3_5ForConditionalGeneration, the text model under
    model.language_model., the LM head and mtp.* at the top level."""
    from safetensors.torch import load_file, save_file

    folder = save_mtp_model(tmp_path / "m", mtp_config(hybrid=False), leak=0.0)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {**config, "model_type": "qwen3_5_text"}}))
    tensors = load_file(folder / "model.safetensors")
    save_file({("model.language_model." + n[len("model."):] if n.startswith("model.") else n): t
               for n, t in tensors.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    assert not any(n.startswith("mtp.") for n in load_model_files(folder).weights.shapes)
    spec = make_engine(folder, speculative="mtp")
    got = run(spec, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert got.metrics.num_accepted_draft_tokens == got.metrics.num_draft_tokens > 0
