"""The official openai client against ``folio serve`` on the starter model: chat and text
completions, streamed and not, n candidates, the prefix cache across requests, and
greedy replies equal to ``LLM.chat``'s."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from engine import SamplingParams
from tests.engine.serve.conftest import Served

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = dict(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def reference(starter_llm):
    """LLM.chat's greedy reply, computed before any worker steps this engine."""
    return starter_llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=24))


@pytest.fixture(scope="module")
def served(starter_llm, reference):
    served = Served(starter_llm)
    yield served
    served.stop()


def test_models_health_and_metrics(served):
    client = served.client()
    assert [m.id for m in client.models.list().data] == [served.model]
    assert httpx.get(served.url + "/health").json()["status"] == "ok"
    text = httpx.get(served.url + "/metrics").text
    for name in ("folio_kv_blocks{state=\"used\"}", "folio_kv_blocks{state=\"free\"}",
                 "folio_kv_blocks{state=\"cached\"}", "folio_prefix_cache_hit_rate",
                 "folio_requests_in_flight{state=\"waiting\"}",
                 "folio_generation_tokens_total", "folio_time_to_first_token_seconds_bucket"):
        assert name in text


def test_greedy_chat_equals_llm_chat(served, reference):
    reply = served.client().chat.completions.create(model=served.model, messages=QUESTION,
                                                    **GREEDY)
    choice = reply.choices[0]
    assert choice.message.content == reference.outputs[0].text
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens == len(reference.prompt_token_ids)
    assert reply.usage.completion_tokens == len(reference.outputs[0].token_ids)


def test_streamed_chat_adds_up_to_the_same_reply(served, reference):
    chunks = list(served.client().chat.completions.create(
        model=served.model, messages=QUESTION, stream=True,
        stream_options={"include_usage": True}, **GREEDY))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference.outputs[0].text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        reference.outputs[0].token_ids)


def test_n_candidates_share_the_prompt(served):
    reply = served.client().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Name a fruit."}], n=3,
        temperature=1.0, seed=7, max_tokens=12)
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert all(c.message.content for c in reply.choices)
    # Three candidates of at most 12 tokens each, all counted; the prompt once.
    assert 3 <= reply.usage.completion_tokens <= 36
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    # The same request again finds its whole prompt cached, as the streamed one will: on
    # the quantized path (bf16 rounding) the split between cached and computed tokens
    # moves logits by a few hundredths, enough to change what a seed samples.
    again = served.client().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Name a fruit."}], n=3,
        temperature=1.0, seed=7, max_tokens=12)
    streamed = list(served.client().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Name a fruit."}], n=3,
        temperature=1.0, seed=7, max_tokens=12, stream=True))
    texts = {i: "" for i in range(3)}
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    # Same seed, same prompt, same cache state: the streamed candidates are the others.
    assert [texts[i] for i in range(3)] == [c.message.content for c in sorted(
        again.choices, key=lambda c: c.index)]


def test_second_turn_reports_the_first_turn_as_cached(served):
    client = served.client()
    first_turn = [{"role": "system", "content": "You are a terse travel guide."},
                  {"role": "user", "content": "Suggest one museum in Lisbon, in one line."}]
    first = client.chat.completions.create(model=served.model, messages=first_turn, **GREEDY)
    second = client.chat.completions.create(model=served.model, messages=first_turn + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And one restaurant nearby?"}], **GREEDY)
    block = served.llm.engine.config.block_size
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens // block * block
    assert cached < second.usage.prompt_tokens


def test_text_completion(served):
    client = served.client()
    reply = client.completions.create(model=served.model, prompt="Once upon a time",
                                      temperature=0, max_tokens=8)
    expected = served.llm.engine.tokenizer.encode("Once upon a time")
    assert reply.usage.prompt_tokens == len(expected)
    assert reply.usage.completion_tokens == 8 and reply.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=served.model, prompt="Once upon a time", temperature=0, max_tokens=8,
        stream=True) if c.choices)
    assert streamed == reply.choices[0].text


def test_stop_strings_and_the_pool_ends_free(served):
    reply = served.client().chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "Count from 1 to 9, "
                                       "separated by commas."}],
        temperature=0, max_tokens=40, stop=["5"])
    assert "5" not in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert served.worker.kv_stats().num_used == 0
