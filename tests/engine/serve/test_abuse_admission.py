"""Requests the engine must refuse without harming anyone else's: out-of-range seeds, a
failure at any stage of admission. Each case: the server keeps answering, the replies
streaming beside it finish whole, and the pool's used blocks return to idle."""

from __future__ import annotations

import threading
import time

import pytest

import engine.requests as requests_module
from tests.engine.serve.test_errors import assert_error, chat, post

STREAM_TOKENS = 200


def wait_idle(served, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while served.worker.kv_stats().num_used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.worker.kv_stats().num_used == 0


class Streams:
    """Three chats streaming while the test sends its bad requests."""

    def __init__(self, served) -> None:
        self.served, self.texts, self.errors = served, {}, []
        self.started = threading.Barrier(4)
        self.threads = [threading.Thread(target=self._stream, args=(i,)) for i in range(3)]

    def _stream(self, i: int) -> None:
        try:
            stream = self.served.client(timeout=60).chat.completions.create(
                model=self.served.model, messages=[{"role": "user", "content": f"go {i}"}],
                max_tokens=STREAM_TOKENS, temperature=0, stream=True,
                extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
            chunks = iter(stream)
            first = next(chunks)  # streaming before the bad requests arrive
            self.started.wait(timeout=60)
            usage = None
            for chunk in [first, *chunks]:
                usage = chunk.usage or usage
            self.texts[i] = usage.completion_tokens
        except Exception as exc:  # noqa: BLE001 - reported by finish()
            self.errors.append(exc)
            self.started.abort()

    def __enter__(self) -> Streams:
        for thread in self.threads:
            thread.start()
        self.started.wait(timeout=60)
        return self

    def __exit__(self, *exc) -> None:
        for thread in self.threads:
            thread.join(timeout=120)
        assert self.errors == []
        # Every stream ran to its whole length: none was failed by the bad requests.
        assert self.texts == {i: STREAM_TOKENS for i in range(3)}


@pytest.mark.parametrize(("seed", "n"), [(2**64, 1), (2**64 - 1, 2), (-(2**63) - 1, 1)])
def test_an_out_of_range_seed_is_refused_by_name_and_harms_no_stream(tiny_served, seed, n):
    with Streams(tiny_served):
        for _ in range(3):
            assert_error(post(tiny_served, "/v1/chat/completions",
                              chat(tiny_served, seed=seed, n=n)), 422, "seed")
    wait_idle(tiny_served)


def test_long_prompts_with_bad_seeds_leave_no_block_in_use(tiny_served):
    prompt = [1 + i % 250 for i in range(400)]  # most of the context, many blocks
    for _ in range(4):
        assert_error(post(tiny_served, "/v1/completions",
                          {"model": tiny_served.model, "prompt": prompt, "max_tokens": 4,
                           "seed": 2**64}), 422, "seed")
    assert tiny_served.worker.kv_stats().num_used == 0
    reply = post(tiny_served, "/v1/completions",
                 {"model": tiny_served.model, "prompt": prompt, "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    wait_idle(tiny_served)


def test_seeds_at_the_ends_of_the_range_give_every_candidate(tiny_served):
    for seed in (2**63 - 1, -(2**63)):
        reply = post(tiny_served, "/v1/chat/completions",
                     chat(tiny_served, seed=seed, n=2, temperature=1.0))
        assert reply.status_code == 200, reply.text
        assert [c["index"] for c in reply.json()["choices"]] == [0, 1]
    wait_idle(tiny_served)


def test_a_failure_inside_admission_is_that_request_alone(tiny_served, monkeypatch):
    """A candidate's generator that cannot be made (any admission stage would do): the
    request is refused, nothing of it stays, the streams beside it finish."""
    real = requests_module.make_generator

    def make_generator(seed, index):
        if seed == 4242 and index == 1:
            raise ValueError("no generator for candidate 1")
        return real(seed, index)

    monkeypatch.setattr(requests_module, "make_generator", make_generator)
    with Streams(tiny_served):
        for _ in range(3):
            assert_error(post(tiny_served, "/v1/chat/completions",
                              chat(tiny_served, seed=4242, n=2)), 400, "generator")
    wait_idle(tiny_served)
    assert post(tiny_served, "/v1/chat/completions", chat(tiny_served)).status_code == 200
