"""RemoteLLM / RemoteWorker: a remote OpenAI-compatible server behind the engine's surface.

Against a real ``folio serve`` over a tiny model (events add up, candidates, usage) and
a stub server (servers that ignore or refuse n, servers that run one request at a time,
Stop, a server that dies mid-reply, keys).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict

import pytest

from desktop_app.data.pacing_note import NOTE, pacing_note
from desktop_app.services.remote import (
    DEFAULT_MAX_MODEL_LEN,
    ModelCard,
    RemoteError,
    RemoteLLM,
    RemoteWorker,
    list_models,
)
from desktop_app.services.remote_request import request_body
from engine.outputs import ErrorEvent, FinishedEvent, TokenEvent
from engine.sampling_params import SamplingParams
from engine.serve.server import free_port
from tests.desktop_app.services.openai_stub import StubServer

MESSAGES = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "token_ids": [1, 2, 3]},
            {"role": "user", "content": "Tell me more."}]


class Collector:
    """An on_event callback: every event, and the end."""

    def __init__(self) -> None:
        self.events: list = []
        self.ended = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, FinishedEvent | ErrorEvent):
            self.ended.set()

    def wait(self, timeout: float = 60.0):
        assert self.ended.wait(timeout), f"no end after {timeout} s: {self.events[-3:]}"
        return self.events[-1]

    def streamed(self, index: int) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TokenEvent)
                       and e.index == index)

    def wait_for_text(self, chars: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.streamed(0)) < chars:
            assert time.monotonic() < deadline, "no text streamed"
            time.sleep(0.01)


@pytest.fixture
def stubs():
    made: list[StubServer] = []

    def make(**kwargs) -> StubServer:
        made.append(StubServer(**kwargs))
        return made[-1]

    yield make
    for stub in made:
        stub.stop()


def worker_on(url: str, model: str = "stub-model", api_key: str = "") -> RemoteWorker:
    return RemoteWorker(RemoteLLM(url, model, api_key), metrics_interval_s=0.05).start()


def run(worker: RemoteWorker, params: SamplingParams, messages=MESSAGES) -> Collector:
    events = Collector()
    worker.submit(messages, params, events)
    events.wait()
    return events


# -- against a real folio serve ---------------------------------------------------------------
def test_connect_reads_the_model_card(tiny_served):
    assert list_models(tiny_served.url) == [ModelCard(tiny_served.model, 512)]
    llm = RemoteLLM.connect(tiny_served.url, tiny_served.model)
    assert (llm.model_name, llm.max_model_len, llm.tokenizer, llm.host) == (
        tiny_served.model, 512, None, tiny_served.url.split("/")[2])
    with pytest.raises(RemoteError, match="does not serve 'other'"):
        RemoteLLM.connect(tiny_served.url, "other")


def test_streamed_events_add_up_and_n_gives_candidates(tiny_served):
    worker = worker_on(tiny_served.url, tiny_served.model)
    try:
        events = run(worker, SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=12))
        end = events.events[-1]
        assert isinstance(end, FinishedEvent)
        assert [c.index for c in end.output.outputs] == [0, 1]
        for c in end.output.outputs:
            assert c.text == events.streamed(c.index)
            assert c.finish_reason in ("stop", "length") and c.token_ids == []
        assert any(c.text for c in end.output.outputs)
        metrics = end.output.metrics
        assert metrics.num_prompt_tokens > 0 and metrics.num_generated_tokens > 0
        assert metrics.total_s > 0
        assert worker.kv_stats() is None and worker.memory_stats() is None
        assert worker.in_flight() == []
    finally:
        worker.shutdown()


def test_folio_metrics_reach_the_remote_status(tiny_served):
    worker = worker_on(tiny_served.url, tiny_served.model)
    try:
        deadline = time.monotonic() + 10
        while not worker.remote_status().checked:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        status = worker.remote_status()
        assert status.host == tiny_served.url.split("/")[2]
        assert status.metrics.flavor == "Folio"
        assert status.metrics.blocks_total == 256
        assert status.metrics.blocks_used + status.metrics.blocks_free == 256
    finally:
        worker.shutdown()


# -- against the stub --------------------------------------------------------------------------
def test_the_request_carries_text_and_sampling_only(stubs):
    stub = stubs()
    worker = worker_on(stub.url)
    run(worker, SamplingParams(temperature=3.0, top_p=0.9, top_k=40, min_p=0.05,
                               repetition_penalty=1.1, max_tokens=7, seed=3, stop=["END"]))
    [body] = stub.bodies
    assert body["messages"] == [{k: v for k, v in m.items() if k != "token_ids"}
                                for m in MESSAGES]
    assert (body["model"], body["n"], body["temperature"], body["top_p"], body["max_tokens"],
            body["seed"], body["stop"]) == ("stub-model", 1, 2.0, 0.9, 7, 3, ["END"])
    assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (40, 0.05, 1.1)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    plain = request_body("m", [], SamplingParams(), 1, None)
    assert "extra_body" not in plain and "seed" not in plain and "stop" not in plain
    # No limit: the field is left out, which OpenAI's API reads as up to the context.
    assert "max_tokens" not in request_body("m", [], SamplingParams(max_tokens=None), 1, None)
    worker.shutdown()


def test_a_server_that_ignores_n_gets_the_missing_candidates_in_parallel(stubs):
    stub = stubs(max_choices=1)
    worker = worker_on(stub.url)
    events = run(worker, SamplingParams(n=3, seed=7, max_tokens=5))
    end = events.events[-1]
    assert isinstance(end, FinishedEvent)
    texts = [c.text for c in end.output.outputs]
    assert texts[0] == "c0w0s7 c0w1s7 c0w2s7 c0w3s7 c0w4s7"
    assert texts[1].startswith("c0w0s8") and texts[2].startswith("c0w0s9")  # seed + index
    assert [b["n"] for b in stub.bodies] == [3, 1, 1]
    assert [c.text for c in end.output.outputs] == [events.streamed(i) for i in range(3)]
    worker.shutdown()


def test_a_server_that_ignores_n_is_noticed_before_it_finishes(stubs):
    stub = stubs(max_choices=1, words=40, delay_s=0.005)
    worker = worker_on(stub.url)
    events = run(worker, SamplingParams(n=2, max_tokens=40))
    assert [len(c.text.split()) for c in events.events[-1].output.outputs] == [40, 40]
    assert [b["n"] for b in stub.bodies] == [2, 1]
    worker.shutdown()


def words(count: int, seed: int) -> str:
    """The stub's reply to a one-choice request with this seed."""
    return " ".join(f"c0w{i}s{seed}" for i in range(count))


def note_of(end) -> str:
    assert isinstance(end, FinishedEvent), end
    return pacing_note(asdict(end.output.metrics))


# A reply long enough that the second candidate's request starts while the first streams.
LONG = {"words": 120, "delay_s": 0.01}


def test_a_server_that_ignores_n_and_runs_requests_in_parallel_keeps_the_parallel_path(stubs):
    stub = stubs(max_choices=1, **LONG)
    worker = worker_on(stub.url)
    events = run(worker, SamplingParams(n=2, seed=7, max_tokens=120))
    end = events.events[-1]
    assert [c.text for c in end.output.outputs] == [words(120, 7), words(120, 8)]
    assert stub.most_running == 2 and [b["n"] for b in stub.bodies] == [2, 1]
    assert note_of(end) == ""
    worker.shutdown()


def test_a_server_that_cuts_the_running_request_gets_the_candidates_one_at_a_time(stubs):
    # llama-cpp-python's server: n ignored, and a second request cuts the first short.
    stub = stubs(max_choices=1, one_at_a_time=True, **LONG)
    worker = worker_on(stub.url)
    events = run(worker, SamplingParams(n=2, seed=7, max_tokens=120))
    end = events.events[-1]
    assert [c.text for c in end.output.outputs] == [words(120, 7), words(120, 8)]
    assert [c.finish_reason for c in end.output.outputs] == ["length", "length"]
    # What streamed adds up: the cut candidate's new run streamed only what was new.
    assert [events.streamed(i) for i in range(2)] == [words(120, 7), words(120, 8)]
    assert stub.cuts == 1
    assert [(b["n"], b["seed"]) for b in stub.bodies] == [(2, 7), (1, 8), (1, 7)]
    assert note_of(end) == NOTE
    # Remembered for the session: the next turn goes one at a time at once, and the
    # footer said so once.
    end = run(worker, SamplingParams(n=2, seed=3, max_tokens=120)).events[-1]
    assert [c.text for c in end.output.outputs] == [words(120, 3), words(120, 4)]
    assert stub.cuts == 1 and [b["n"] for b in stub.bodies[3:]] == [2, 1]
    assert note_of(end) == ""
    worker.shutdown()


def test_a_server_that_answers_busy_gets_the_candidates_one_at_a_time(stubs):
    stub = stubs(max_choices=1, busy=True, **LONG)
    worker = worker_on(stub.url)
    end = run(worker, SamplingParams(n=2, seed=7, max_tokens=120)).events[-1]
    assert [c.text for c in end.output.outputs] == [words(120, 7), words(120, 8)]
    assert [(b["n"], b["seed"]) for b in stub.bodies] == [(2, 7), (1, 8), (1, 8)]
    assert stub.most_running == 1 and note_of(end) == NOTE
    worker.shutdown()


def test_candidates_cut_while_they_all_ran_at_once_all_run_again(stubs):
    # A server that refuses n > 1 gets one request per candidate, all at once; each one
    # cuts the one before.
    stub = stubs(refuse_n=True, one_at_a_time=True, words=30, delay_s=0.01)
    worker = worker_on(stub.url)
    end = run(worker, SamplingParams(n=3, seed=7, max_tokens=30)).events[-1]
    assert [c.text for c in end.output.outputs] == [words(30, 7 + c) for c in range(3)]
    assert stub.cuts >= 1 and note_of(end) == NOTE
    worker.shutdown()


def test_a_server_that_refuses_n_gets_one_request_per_candidate(stubs):
    stub = stubs(refuse_n=True)
    worker = worker_on(stub.url)
    events = run(worker, SamplingParams(n=3, max_tokens=5))
    end = events.events[-1]
    assert isinstance(end, FinishedEvent) and all(c.text for c in end.output.outputs)
    assert sorted(b["n"] for b in stub.bodies) == [1, 1, 1, 3]
    worker.shutdown()


def test_n_candidates_in_one_stream_and_usage(stubs):
    stub = stubs()
    worker = worker_on(stub.url)
    end = run(worker, SamplingParams(n=2, max_tokens=5)).events[-1]
    assert [c.text for c in end.output.outputs] == ["c0w0 c0w1 c0w2 c0w3 c0w4",
                                                    "c1w0 c1w1 c1w2 c1w3 c1w4"]
    assert [c.finish_reason for c in end.output.outputs] == ["length", "length"]
    m = end.output.metrics
    assert (m.num_prompt_tokens, m.num_cached_tokens, m.num_generated_tokens) == (11, 3, 10)
    assert len(stub.bodies) == 1
    worker.shutdown()


def test_cancel_ends_at_once_and_closes_the_stream(stubs):
    stub = stubs(forever=True, delay_s=0.02)
    worker = worker_on(stub.url)
    events = Collector()
    handle = worker.submit(MESSAGES, SamplingParams(n=2, max_tokens=10_000), events)
    events.wait_for_text(12)
    handle.cancel()
    end = events.wait(timeout=1.0)  # at once, not when the server next writes
    assert isinstance(end, FinishedEvent)
    assert [c.finish_reason for c in end.output.outputs] == ["abort", "abort"]
    assert end.output.outputs[0].text.startswith("c0w0 c0w1")
    assert stub.disconnected.wait(5), "the server never saw the client leave"
    count = len(events.events)
    time.sleep(0.1)
    assert len(events.events) == count  # nothing after the end
    assert worker.in_flight() == []
    worker.shutdown()


def test_a_server_that_dies_mid_reply_ends_with_a_clear_error(stubs):
    stub = stubs(die_after=4, delay_s=0.01)
    worker = worker_on(stub.url)
    events = run(worker, SamplingParams(max_tokens=100))
    end = events.events[-1]
    assert isinstance(end, ErrorEvent)
    assert end.message.startswith(f"The server at {stub.url} could not be reached")
    assert "mid-reply" in end.message or "before the reply finished" in end.message
    assert events.streamed(0) == "c0w0 c0w1 c0w2 c0w3"  # what came stays with the caller
    worker.shutdown()


def test_a_refused_connection_gives_an_error_event(stubs):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    worker = worker_on(url)
    end = run(worker, SamplingParams(max_tokens=5)).events[-1]
    assert isinstance(end, ErrorEvent)
    assert end.message.startswith(f"The server at {url} could not be reached (no connection")
    assert "Check that the server is running" in end.message
    with pytest.raises(RemoteError, match="could not be reached"):
        list_models(url)
    worker.shutdown()


def test_api_key_is_sent_and_never_logged(stubs, caplog):
    stub = stubs(api_key="sk-secret-123")
    with pytest.raises(RemoteError) as refused:
        list_models(stub.url, "wrong-key")
    assert str(refused.value) == (f"The server at {stub.url} answered 401: invalid API key. "
                                  "Check the API key.")
    caplog.set_level(logging.DEBUG)
    assert list_models(stub.url, "sk-secret-123") == [ModelCard("stub-model", 4096)]
    worker = worker_on(stub.url, api_key="sk-secret-123")
    end = run(worker, SamplingParams(max_tokens=3)).events[-1]
    assert isinstance(end, FinishedEvent)
    sent = {k.lower(): v for k, v in stub.headers[-1].items()}
    assert sent["authorization"] == "Bearer sk-secret-123"
    assert "sk-secret-123" not in caplog.text
    assert "sk-secret-123" not in repr(worker.llm)
    bad = worker_on(stub.url, api_key="wrong")
    end = run(bad, SamplingParams(max_tokens=3)).events[-1]
    assert isinstance(end, ErrorEvent) and "answered 401" in end.message
    worker.shutdown()
    bad.shutdown()


def test_a_model_card_without_a_context_gets_the_default(stubs):
    stub = stubs(max_model_len=None)
    assert RemoteLLM.connect(stub.url, "stub-model").max_model_len == DEFAULT_MAX_MODEL_LEN


def test_shutdown_cancels_what_is_in_flight(stubs):
    stub = stubs(forever=True, delay_s=0.02)
    worker = worker_on(stub.url)
    events = Collector()
    worker.submit(MESSAGES, SamplingParams(max_tokens=10_000), events)
    events.wait_for_text(4)
    worker.shutdown()
    assert isinstance(events.wait(1.0), FinishedEvent)
    assert stub.disconnected.wait(5)
