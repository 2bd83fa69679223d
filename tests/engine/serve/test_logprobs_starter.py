"""logprobs end to end: the official openai client against ``folio serve`` on the starter
(its float32 path), every candidate's log-probabilities, streamed and not, equal to
log_softmax of the model's logits over the same tokens, teacher-forced in one prefill."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.config import EngineConfig
from engine.serve.logprobs import TokenTexts
from tests.e2e.test_quantized_quality import teacher_forced_logits
from tests.engine.serve.conftest import Served

pytestmark = pytest.mark.slow

ATOL = 2e-3  # decode steps against one prefill of the same tokens, both float32
MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]


@pytest.fixture(scope="module")
def served():
    served = Served(LLM("starter", EngineConfig(weights="float32", max_model_len=1024,
                                                  kv_cache_dtype="float32")))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def ids_by_bytes(served):
    tokenizer = served.llm.tokenizer
    texts = TokenTexts(tokenizer)
    table = {}
    for token_id in range(tokenizer.vocab_size):
        table.setdefault(bytes(texts(token_id)[1]), token_id)
    return table


def forward_logprobs(served, build_attention_metadata, prompt, output) -> torch.Tensor:
    logits = teacher_forced_logits(served.llm, prompt + output, build_attention_metadata)
    return torch.log_softmax(logits[len(prompt) - 1:-1].float(), dim=-1)


def check(served, build_attention_metadata, ids_by_bytes, prompt, entries, k: int) -> int:
    """Compares one candidate's entries with the forward pass; returns how many chosen
    tokens lay outside their top k."""
    ids = [ids_by_bytes[bytes(e.bytes)] for e in entries]
    expected = forward_logprobs(served, build_attention_metadata, prompt, ids)
    outside = 0
    for entry, token, row in zip(entries, ids, expected, strict=True):
        assert entry.logprob == pytest.approx(float(row[token]), abs=ATOL)
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == k and values == sorted(values, reverse=True)
        assert values == pytest.approx(torch.topk(row, k).values.tolist(), abs=ATOL)
        for alt in entry.top_logprobs:
            assert alt.logprob == pytest.approx(float(row[ids_by_bytes[bytes(alt.bytes)]]),
                                                abs=ATOL)
        outside += entry.token not in [t.token for t in entry.top_logprobs]
    return outside


def test_chat_logprobs_equal_a_forward_pass(served, build_attention_metadata, ids_by_bytes):
    client = served.client()
    prompt = served.llm.tokenizer.encode_chat(MESSAGES)
    request = dict(model=served.model, messages=MESSAGES, n=2, temperature=1.5, seed=11,
                   max_tokens=16, logprobs=True, top_logprobs=3)
    reply = client.chat.completions.create(**request)
    assert reply.usage.prompt_tokens == len(prompt)
    outside = 0
    for choice in reply.choices:
        outside += check(served, build_attention_metadata, ids_by_bytes, prompt,
                         choice.logprobs.content, 3)
    assert sum(len(c.logprobs.content) for c in reply.choices) == reply.usage.completion_tokens
    streamed: dict[int, list] = {0: [], 1: []}
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed[choice.index] += choice.logprobs.content
    for entries in streamed.values():
        assert entries
        outside += check(served, build_attention_metadata, ids_by_bytes, prompt, entries, 3)
    assert outside > 0  # temperature 1.5 drew tokens outside the top 3: still reported


def test_top_20_of_a_greedy_reply(served, build_attention_metadata, ids_by_bytes):
    prompt = served.llm.tokenizer.encode_chat(MESSAGES)
    reply = served.client().chat.completions.create(
        model=served.model, messages=MESSAGES, temperature=0, max_tokens=8, logprobs=True,
        top_logprobs=20)
    entries = reply.choices[0].logprobs.content
    check(served, build_attention_metadata, ids_by_bytes, prompt, entries, 20)
    assert all(e.top_logprobs[0].token == e.token for e in entries)
    assert reply.choices[0].finish_reason == "length"
    assert "".join(e.token for e in entries) == reply.choices[0].message.content


def test_text_completion_logprobs(served):
    client = served.client()
    reply = client.completions.create(model=served.model, prompt="The capital of France is",
                                      max_tokens=8, temperature=0, logprobs=5,
                                      extra_body={"ignore_eos": True})
    choice = reply.choices[0]
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 8
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs,
                                 logprobs.top_logprobs, strict=True):
        assert top[token] == value == max(top.values()) and len(top) == 5
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(8)]
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model=served.model, prompt="The capital of France is", max_tokens=8, temperature=0,
        logprobs=5, stream=True, extra_body={"ignore_eos": True}) if c.choices[0].logprobs]
    assert [t for part in streamed for t in part.tokens] == logprobs.tokens
    assert [o for part in streamed for o in part.text_offset] == logprobs.text_offset
