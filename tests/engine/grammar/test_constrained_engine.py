"""Structured output through the engine on the tiny random model: every reply valid,
each candidate with its own grammar state, unconstrained rows in the same batch as if
alone, preemption (recompute and swap) and the prefix cache unchanged by the masks."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine import LLM, ResponseFormat, SamplingParams
from engine.grammar import GrammarError
from engine.outputs import FinishedEvent
from tests.engine.tiny_models import random_prompt

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "tag": {"type": "string", "maxLength": 4},
    },
    "required": ["kind", "age", "flags", "tag"],
}
FORMAT = ResponseFormat("json_schema", SCHEMA)


def constrained(**overrides) -> SamplingParams:
    fields = {"temperature": 1.0, "seed": 5, "max_tokens": 200, "response_format": FORMAT}
    return SamplingParams(**fields | overrides)


def valid(text: str) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, SCHEMA)
    return value


def test_each_candidate_follows_its_own_grammar_state_to_a_valid_reply(llm) -> None:
    [out] = llm.generate([random_prompt(1, 12)], constrained(n=3))
    texts = [c.text for c in out.outputs]
    assert [c.finish_reason for c in out.outputs] == ["stop"] * 3
    for text in texts:
        valid(text)
    assert len(set(texts)) > 1  # forked states, not one reply copied three times


def test_unconstrained_rows_in_the_same_batch_sample_as_if_alone(llm) -> None:
    free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [random_prompt(2, 10), random_prompt(3, 14)]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, free)]
    mixed = run_together(llm, [(prompts[0], free), (random_prompt(4, 9), constrained(
        temperature=0)), (prompts[1], free)])
    assert [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids] == alone
    valid(mixed[1].outputs[0].text)


def run_together(llm, requests) -> list:
    """Each (prompt, params) added before the first step, so they share every step."""
    ids = [llm.engine.add_request(prompt, params) for prompt, params in requests]
    done: dict = {}
    while len(done) < len(ids):
        for event in llm.engine.step():
            if isinstance(event, FinishedEvent):
                done[event.request_id] = event.output
    return [done[i] for i in ids]


def test_json_object_replies_are_objects_and_a_cut_reply_says_length(llm) -> None:
    fmt = ResponseFormat("json_object")
    [cut] = llm.generate([random_prompt(5, 8)], SamplingParams(
        temperature=1.0, seed=1, max_tokens=3, response_format=fmt))
    assert cut.outputs[0].finish_reason == "length"
    assert cut.outputs[0].text.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.outputs[0].text)


@pytest.mark.parametrize("host_blocks", [0, 64])
def test_preempted_candidates_keep_their_grammar_state(tiny_dir, host_blocks) -> None:
    prompts = [random_prompt(10 + i, 20 + i) for i in range(5)]
    params = constrained(n=2, seed=3)
    big = LLM(str(tiny_dir), num_gpu_blocks=256, block_size=16)
    small = LLM(str(tiny_dir), num_gpu_blocks=20, num_host_blocks=host_blocks, block_size=16)
    expected = [[c.text for c in o.outputs] for o in big.generate(prompts, params)]
    got = [[c.text for c in o.outputs] for o in small.generate(prompts, params)]
    assert small.engine.scheduler.num_preemptions > 0
    assert got == expected
    for texts in got:
        for text in texts:
            valid(text)


def test_the_prefix_cache_serves_constrained_and_free_requests_alike(llm) -> None:
    prompt = random_prompt(20, 70)
    llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0))
    [out] = llm.generate([prompt], constrained(temperature=0))
    assert out.metrics.num_cached_tokens >= 64
    valid(out.outputs[0].text)


def test_a_schema_that_cannot_be_enforced_is_refused_and_nothing_is_queued(llm) -> None:
    bad = ResponseFormat("json_schema", {"type": "object", "not": {"required": ["a"]}})
    with pytest.raises(GrammarError, match="'not'"):
        llm.engine.add_request(random_prompt(6, 5), constrained(response_format=bad))
    assert not llm.engine.has_unfinished_requests()


def test_a_compiled_schema_is_cached(llm) -> None:
    grammars = llm.engine.grammars
    first = grammars.compile(FORMAT)
    again = ResponseFormat("json_schema", json.loads(json.dumps(SCHEMA)), name="other")
    assert grammars.compile(again) is first


def test_response_format_is_validated() -> None:
    with pytest.raises(ValueError, match="ResponseFormat.type"):
        ResponseFormat("yaml")
    with pytest.raises(ValueError, match="ResponseFormat.schema"):
        ResponseFormat("json_schema")
    with pytest.raises(ValueError, match="SamplingParams.response_format"):
        SamplingParams(response_format={"type": "json_object"})


def test_logprobs_are_the_model_s_own_and_name_tokens_the_mask_forced(llm, hf_model) -> None:
    import torch

    prompt = random_prompt(30, 10)
    [out] = llm.generate([prompt], constrained(temperature=0, logprobs=3))
    reply = out.outputs[0]
    valid(reply.text)
    ids = torch.tensor([prompt + reply.token_ids])
    with torch.no_grad():
        rows = torch.log_softmax(hf_model(ids).logits[0, len(prompt) - 1:-1].float(), -1)
    outside = 0
    for entry, token, row in zip(reply.logprobs, reply.token_ids, rows, strict=True):
        assert entry.token_id == token
        assert entry.logprob == pytest.approx(float(row[token]), abs=1e-4)
        assert [t for t, _ in entry.top] == torch.topk(row, 3).indices.tolist()
        outside += token not in [t for t, _ in entry.top]
    assert outside > 0  # the mask picked tokens the model alone would not have
