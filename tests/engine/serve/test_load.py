"""Many clients at once: 32 concurrent streams each equal to its request run alone, and
clients that leave mid-stream leave no block behind."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx2 as httpx
import pytest

from tests.engine.serve.conftest import Served, tiny_llm_at

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def load_served(tiny_path):
    # The default queue bound (64 waiting) lets all 32 clients in at once.
    served = Served(tiny_llm_at(tiny_path))
    yield served
    served.stop()


PROMPTS = [f"Request {i}: tell me about the number {i * 7}." for i in range(32)]


def wait_for_free_pool(served, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while served.worker.kv_stats().num_used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.worker.kv_stats().num_used == 0


def test_32_concurrent_streams_equal_their_runs_alone(load_served):
    client = load_served.client()

    def alone(prompt: str) -> str:
        reply = client.chat.completions.create(
            model=load_served.model, messages=[{"role": "user", "content": prompt}],
            temperature=0, max_tokens=12)
        return reply.choices[0].message.content

    expected = [alone(p) for p in PROMPTS]

    async def streamed(aclient, prompt: str) -> str:
        stream = await aclient.chat.completions.create(
            model=load_served.model, messages=[{"role": "user", "content": prompt}],
            temperature=0, max_tokens=12, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def all_at_once() -> list[str]:
        async with load_served.async_client() as aclient:
            return await asyncio.gather(*(streamed(aclient, p) for p in PROMPTS))

    got = asyncio.run(all_at_once())
    assert got == expected
    wait_for_free_pool(load_served)


def test_clients_leaving_mid_stream_free_their_blocks(load_served):
    body = {"model": load_served.model, "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": "Go on forever."}], "stream": True}

    def leave_after_a_few_chunks() -> None:
        with httpx.stream("POST", load_served.url + "/v1/chat/completions", json=body,
                          timeout=60) as response:
            assert response.status_code == 200
            for count, _line in enumerate(response.iter_lines()):
                if count >= 6:
                    break  # closing the response drops the connection

    threads = [threading.Thread(target=leave_after_a_few_chunks) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    wait_for_free_pool(load_served)
    # A stream the server finishes before it notices the client left frees its blocks
    # before its response ends (and counts it out of `running`): wait for both.
    metrics = load_served.metrics
    deadline = time.monotonic() + 30
    while (metrics.running or metrics.waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (metrics.running, metrics.waiting) == (0, 0)
