"""The engine reports a long prompt's reading chunk by chunk (engine.outputs.PromptProgress);
the API has no such chunk, so a stream over a prompt read in many chunks is exactly the
usual one: a delta per token, the last chunk, the usage, [DONE]."""

from __future__ import annotations

import asyncio
import json

import httpx2 as httpx
import pytest

from engine import LLM, SamplingParams
from engine.outputs import FinishedEvent, PromptProgress, TokenEvent
from engine.serve.streaming import RequestStream
from tests.engine.serve.conftest import Served

CHUNK = 16
TOKENS = 12
# The tiny models' tokenizer is byte-level: 300 characters, 300 tokens, 19 chunks.
PROMPT = "".join(chr(97 + (i * 7) % 26) for i in range(300))


@pytest.fixture(scope="module")
def chunked_served(tiny_path):
    served = Served(LLM(str(tiny_path), num_gpu_blocks=256, max_model_len=512,
                        kv_cache_dtype="float32", max_num_batched_tokens=CHUNK))
    yield served
    served.stop()


def stream_lines(served, path: str, **body) -> list[str]:
    with httpx.stream("POST", served.url + path, json={"model": served.model, "stream": True,
                                                       **body}, timeout=60) as response:
        assert response.status_code == 200
        return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def comparable(lines: list[str]) -> list:
    """The stream's chunks without what differs between two requests (id, time)."""
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    return [{k: v for k, v in c.items() if k not in ("id", "created")} for c in chunks]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", dict(prompt=PROMPT)),
    ("/v1/chat/completions", dict(messages=[{"role": "user", "content": PROMPT}])),
])
def test_a_prompt_read_in_chunks_streams_exactly_the_usual_chunks(chunked_served, tiny_served,
                                                                   path, body):
    """The same request to a server that reads the prompt in one step (no progress to
    report) and to one that reads it in 19 chunks: the same chunks, in the same order."""
    body = dict(body, max_tokens=TOKENS, temperature=0, ignore_eos=True,
                stream_options={"include_usage": True})
    chunked = comparable(stream_lines(chunked_served, path, **body))
    whole = comparable(stream_lines(tiny_served, path, **body))
    assert chunked == whole
    assert chunked[-1]["usage"]["completion_tokens"] == TOKENS
    assert chunked[-1]["usage"]["prompt_tokens"] >= len(PROMPT)


def test_the_request_stream_hands_on_no_progress(chunked_served):
    """What the handlers read: the engine's progress events never reach them."""

    async def events():
        stream = RequestStream(chunked_served.worker, [97 + i % 26 for i in range(200)],
                               SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        async with stream:
            return [event async for event in stream.events()]

    seen = asyncio.run(events())
    assert not any(isinstance(e, PromptProgress) for e in seen)
    *tokens, finished = seen
    assert tokens and all(isinstance(e, TokenEvent) for e in tokens)
    assert isinstance(finished, FinishedEvent)
    assert len(finished.output.outputs[0].token_ids) == 3
