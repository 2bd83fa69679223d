"""Beam search equal to transformers' ``generate(num_beams=4, do_sample=False)`` on the
float32 tiny Llama: the same beams, token for token, in the same order, with the same
scores, under each length penalty and early-stopping rule; and BeamSearchParams'
checks."""

from __future__ import annotations

import pytest
import torch

from engine.beam.params import BeamSearchParams
from tests.engine.tiny_models import random_prompt

EOS = 258  # tiny_llama_config's
PROMPTS = [random_prompt(seed, 5 + 3 * seed) for seed in range(5)]
MAX_TOKENS = 24
WIDTH = 4


@pytest.fixture(scope="module")
def stops(hf_model) -> list[int]:
    """Two tokens the model does produce, at different depths of the first prompt's greedy
    reply, as extra stop tokens: some beams then end early and some run to max_tokens."""
    greedy = hf_model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=MAX_TOKENS,
                               do_sample=False, pad_token_id=256)[0, len(PROMPTS[0]):]
    return sorted({int(greedy[8]), int(greedy[20])} - {EOS})


def transformers_beams(hf_model, prompt, params: BeamSearchParams):
    """transformers' finished beams for ``prompt``: each one's generated ids (up to its
    stop token, which is kept) and its score, best first."""
    ends = [EOS, *params.stop_token_ids]
    out = hf_model.generate(
        torch.tensor([prompt]), max_new_tokens=params.max_tokens, do_sample=False,
        num_beams=params.beam_width, num_return_sequences=params.beam_width,
        length_penalty=params.length_penalty, early_stopping=params.early_stopping,
        eos_token_id=ends, pad_token_id=256, return_dict_in_generate=True,
        output_scores=True)
    beams = []
    for row in out.sequences[:, len(prompt):].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in ends), len(row))
        beams.append(row[:cut])
    return beams, out.sequences_scores.tolist()


@pytest.mark.parametrize(("length_penalty", "early_stopping", "with_stops"), [
    (1.0, False, False),
    (1.0, False, True),
    (0.5, True, True),
    (2.0, "never", True),
    (-1.0, False, True),
])
def test_beams_equal_transformers(llm, hf_model, stops, length_penalty, early_stopping,
                                  with_stops):
    params = BeamSearchParams(WIDTH, MAX_TOKENS, length_penalty, early_stopping,
                              stop_token_ids=stops if with_stops else [])
    outputs = llm.beam_search(PROMPTS, params)
    reasons = set()
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        expected, scores = transformers_beams(hf_model, prompt, params)
        assert [o.token_ids for o in output.outputs] == expected
        assert [o.score for o in output.outputs] == pytest.approx(scores, rel=1e-4, abs=1e-4)
        for o in output.outputs:
            assert o.score == pytest.approx(
                o.cumulative_logprob / len(o.token_ids) ** length_penalty, rel=1e-5)
            reasons.add(o.finish_reason)
    # The stop tokens are in play: some beams end on them, some run to max_tokens.
    assert reasons == ({"stop", "length"} if with_stops else {"length"})
    assert llm.kv_stats().num_used == 0


def test_text_and_stop_string(llm):
    [plain] = llm.beam_search([PROMPTS[1]], BeamSearchParams(2, 8))
    best = plain.outputs[0]
    assert best.text == llm.tokenizer.decode(best.token_ids)
    stop = best.text[3:5]
    [cut] = llm.beam_search([PROMPTS[1]], BeamSearchParams(2, 8, stop=[stop]))
    assert all(stop not in o.text for o in cut.outputs)
    assert any(o.finish_reason == "stop" for o in cut.outputs)


def test_beam_search_beside_sampling(llm):
    """A beam search and an ordinary request in the same batch leave each other alone."""
    from engine import SamplingParams

    greedy = SamplingParams(max_tokens=10, temperature=0)
    alone = llm.generate([PROMPTS[2]], greedy)[0].outputs[0].token_ids
    beams_alone = llm.beam_search([PROMPTS[3]], BeamSearchParams(3, 10))[0]
    engine = llm.engine
    beam_id = engine.add_request(PROMPTS[3], BeamSearchParams(3, 10))
    plain_id = engine.add_request(PROMPTS[2], greedy)
    done = {}
    while engine.has_unfinished_requests():
        for event in engine.step():
            if hasattr(event, "output"):
                done[event.request_id] = event.output
    assert done[plain_id].outputs[0].token_ids == alone
    assert [o.token_ids for o in done[beam_id].outputs] == \
        [o.token_ids for o in beams_alone.outputs]


@pytest.mark.parametrize(("field", "value"), [
    ("beam_width", 0), ("beam_width", 65), ("max_tokens", 0), ("max_tokens", None),
    ("early_stopping", "sometimes"), ("early_stopping", 1), ("stop", [""]),
    ("stop_token_ids", [-1]), ("length_penalty", "1"),
])
def test_params_name_the_bad_field(field, value):
    fields = {"beam_width": 2, "max_tokens": 4, field: value}
    with pytest.raises(ValueError, match=f"BeamSearchParams.{field}"):
        BeamSearchParams(**fields)


@pytest.mark.parametrize("config", [
    {"num_gpu_blocks": 14},  # preempted by recompute, beams parked and brought back
    {"num_gpu_blocks": 14, "num_host_blocks": 64},  # preempted by swap
    {"num_gpu_blocks": 256, "max_num_seqs": 5},  # a request's beams over two steps
])
def test_same_beams_when_preempted_or_split(llm, tiny_dir, config):
    from engine import LLM

    params = BeamSearchParams(WIDTH, MAX_TOKENS)
    expected = [[o.token_ids for o in out.outputs] for out in llm.beam_search(PROMPTS, params)]
    tight = LLM(str(tiny_dir), kv_cache_dtype="float32", **config)
    got = [[o.token_ids for o in out.outputs] for out in tight.beam_search(PROMPTS, params)]
    assert got == expected
    if config["num_gpu_blocks"] < 256:
        assert tight.engine.scheduler.num_preemptions > 0
    assert tight.kv_stats().num_used == 0
