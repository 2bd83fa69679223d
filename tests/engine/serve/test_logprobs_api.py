"""logprobs through ``folio serve`` on the tiny model, in OpenAI's shapes: chat's
``content`` entries and text completions' legacy lists, streamed and not, for every
candidate, equal to log_softmax of transformers' logits over the same tokens."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest
import torch
from transformers import LlamaForCausalLM

from engine.serve.logprobs import TokenTexts

ATOL = 1e-4
MESSAGES = [{"role": "user", "content": "Tell me something."}]


@pytest.fixture(scope="module")
def hf_model(tiny_path):
    return LlamaForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def ids_by_bytes(tiny_llm):
    texts = TokenTexts(tiny_llm.tokenizer)
    table = {tuple(texts(i)[1]): i for i in range(tiny_llm.tokenizer.vocab_size)}
    assert len(table) == tiny_llm.tokenizer.vocab_size  # every token told apart by bytes
    return table


def ids_by_bytes_inverse(ids_by_bytes) -> dict[str, tuple[int, ...]]:
    """Token text (as the server names it) -> its bytes, over the tiny vocabulary."""
    names = {}
    for raw in ids_by_bytes:
        try:
            names[bytes(raw).decode("utf-8")] = raw
        except UnicodeDecodeError:
            names["bytes:" + "".join(f"\\x{b:02x}" for b in raw)] = raw
    return names


def post(served, path: str, **body) -> dict:
    response = httpx.post(served.url + path, json={"model": served.model, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def stream(served, path: str, **body) -> list[dict]:
    with httpx.stream("POST", served.url + path, json={"model": served.model, "stream": True,
                                                       **body}, timeout=60) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def reference(hf_model, prompt: list[int], output: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)


def check_chat_entries(entries: list[dict], k: int, prompt, hf_model, ids_by_bytes) -> None:
    ids = [ids_by_bytes[tuple(e["bytes"])] for e in entries]
    expected = reference(hf_model, prompt, ids)
    for entry, token, row in zip(entries, ids, expected, strict=True):
        assert entry["logprob"] == pytest.approx(float(row[token]), abs=ATOL)
        top = entry["top_logprobs"]
        assert len(top) == k
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True)
        assert values == pytest.approx(torch.topk(row, k).values.tolist(), abs=ATOL)
        for alt in top:
            alt_id = ids_by_bytes[tuple(alt["bytes"])]
            assert alt["logprob"] == pytest.approx(float(row[alt_id]), abs=ATOL)
            assert set(alt) == {"token", "logprob", "bytes"}


def test_chat_logprobs_of_every_candidate(tiny_served, tiny_llm, hf_model, ids_by_bytes):
    body = post(tiny_served, "/v1/chat/completions", messages=MESSAGES, n=3, seed=4,
                temperature=1.5, max_tokens=12, logprobs=True, top_logprobs=5)
    prompt = tiny_llm.tokenizer.encode_chat(MESSAGES)
    assert body["usage"]["prompt_tokens"] == len(prompt)
    counted = 0
    for choice in body["choices"]:
        logprobs = choice["logprobs"]
        assert set(logprobs) == {"content", "refusal"} and logprobs["refusal"] is None
        check_chat_entries(logprobs["content"], 5, prompt, hf_model, ids_by_bytes)
        counted += len(logprobs["content"])
    assert counted == body["usage"]["completion_tokens"]  # one entry per token


def test_streamed_chat_logprobs_add_up_to_the_whole_reply(tiny_served, tiny_llm, hf_model,
                                                          ids_by_bytes):
    request = dict(messages=MESSAGES, temperature=0, max_tokens=16, logprobs=True,
                   top_logprobs=2)
    whole = post(tiny_served, "/v1/chat/completions", **request)["choices"][0]
    chunks = stream(tiny_served, "/v1/chat/completions", **request)
    entries = [e for c in chunks for ch in c["choices"] if ch["logprobs"]
               for e in ch["logprobs"]["content"]]
    assert [e["token"] for e in entries] == [e["token"] for e in whole["logprobs"]["content"]]
    prompt = tiny_llm.tokenizer.encode_chat(MESSAGES)
    check_chat_entries(entries, 2, prompt, hf_model, ids_by_bytes)
    text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    assert text == whole["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] is not None


def test_text_completion_logprobs_in_the_legacy_shape(tiny_served, tiny_llm, hf_model,
                                                      ids_by_bytes):
    request = dict(prompt="Once upon a time", temperature=0, max_tokens=10, logprobs=3,
                   ignore_eos=True)
    whole = post(tiny_served, "/v1/completions", **request)["choices"][0]
    logprobs = whole["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    tokens, values = logprobs["tokens"], logprobs["token_logprobs"]
    assert len(tokens) == len(values) == len(logprobs["top_logprobs"]) == 10
    for token, value, top in zip(tokens, values, logprobs["top_logprobs"], strict=True):
        # The chosen token is always among them: up to logprobs + 1 entries.
        assert top[token] == value and 3 <= len(top) <= 4
        assert max(top.values()) == value  # greedy: the chosen one is the most probable
    offsets = logprobs["text_offset"]
    raw = [bytes(ids_by_bytes_inverse(ids_by_bytes)[t]) for t in tokens]
    assert b"".join(raw).decode("utf-8", "replace") == whole["text"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] <= len(whole["text"])
    streamed = stream(tiny_served, "/v1/completions", **request)
    parts = [ch["logprobs"] for c in streamed for ch in c["choices"] if ch["logprobs"]]
    assert [t for p in parts for t in p["tokens"]] == tokens
    assert [o for p in parts for o in p["text_offset"]] == offsets  # runs on across chunks
    assert [v for p in parts for v in p["token_logprobs"]] == pytest.approx(values, abs=ATOL)


def test_no_logprobs_unless_asked(tiny_served):
    chat = post(tiny_served, "/v1/chat/completions", messages=MESSAGES, max_tokens=4)
    assert chat["choices"][0]["logprobs"] is None
    off = post(tiny_served, "/v1/chat/completions", messages=MESSAGES, max_tokens=4,
               logprobs=False, top_logprobs=0)
    assert off["choices"][0]["logprobs"] is None
    only_chosen = post(tiny_served, "/v1/chat/completions", messages=MESSAGES, max_tokens=4,
                       logprobs=True)
    assert all(e["top_logprobs"] == [] for e in only_chosen["choices"][0]["logprobs"][
        "content"])
    chunks = stream(tiny_served, "/v1/completions", prompt="hi", max_tokens=4)
    assert all(ch["logprobs"] is None for c in chunks for ch in c["choices"])


@pytest.mark.parametrize(("path", "fields", "name"), [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
])
def test_out_of_range_logprobs_are_422_naming_the_field(tiny_served, path, fields, name):
    body = {"model": tiny_served.model, "max_tokens": 2, **fields,
            **({"messages": MESSAGES} if "chat" in path else {"prompt": "hi"})}
    response = httpx.post(tiny_served.url + path, json=body, timeout=60)
    assert response.status_code == 422, response.text
    assert name in response.json()["error"]["message"]


class _Texts:
    """Hand-made token texts: 1 "A", 2 and 3 the two halves of "é" (c3 a9), 4 " b"."""

    RAW = {1: b"A", 2: b"\xc3", 3: b"\xa9", 4: b" b"}

    def __call__(self, token_id):
        raw = self.RAW[token_id]
        try:
            return raw.decode(), list(raw)
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)


def test_text_offsets_count_characters_across_chunks_and_split_characters():
    from engine.outputs import TokenLogprobs
    from engine.serve.logprobs import LogprobsFormat

    shape = LogprobsFormat("text", _Texts())
    entry = lambda t: TokenLogprobs(t, -1.0, ((2, -0.5), (3, -0.7)))  # noqa: E731
    first = shape(0, [entry(1), entry(2)])
    second = shape(0, [entry(3), entry(4)])  # the next chunk of the same candidate
    other = shape(1, [entry(4)])  # another candidate starts at 0
    assert first["tokens"] == ["A", "bytes:\\xc3"]
    assert second["tokens"] == ["bytes:\\xa9", " b"]
    # "Aé b": A at 0, both halves of é at 1 (where the character starts), " b" at 2.
    assert first["text_offset"] + second["text_offset"] == [0, 1, 1, 2]
    assert other["text_offset"] == [0]
    assert set(first["top_logprobs"][0]) == {"bytes:\\xc3", "bytes:\\xa9", "A"}
