"""EngineWorker: requests from other threads, batched together, cancelled mid-stream."""

from __future__ import annotations

import threading
import time

import pytest

from engine import LLM, EngineWorker, ResponseFormat, SamplingParams
from engine.grammar import compiler
from engine.outputs import ActivityEvent, ErrorEvent, FinishedEvent, TokenEvent
from engine.worker import MEMORY_INTERVAL_S
from tests.engine.tiny_models import random_prompt, save_tiny_model


class Collector:
    def __init__(self) -> None:
        self.events = []
        self.done = threading.Event()
        self.first_token = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, TokenEvent):
            self.first_token.set()
        if isinstance(event, FinishedEvent | ErrorEvent):
            self.done.set()

    @property
    def finished(self) -> FinishedEvent:
        return next(e for e in self.events if isinstance(e, FinishedEvent))


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
    w = EngineWorker(LLM(str(path), num_gpu_blocks=128)).start()
    yield w
    w.shutdown()


def test_streamed_deltas_add_up_to_the_final_text(worker):
    c = Collector()
    worker.submit([1, 2, 3, 4, 5], SamplingParams(max_tokens=20, temperature=0,
                                                  ignore_eos=True), c)
    assert c.done.wait(60)
    out = c.finished.output
    deltas = "".join(e.text for e in c.events if isinstance(e, TokenEvent))
    assert deltas == out.outputs[0].text
    assert len(out.outputs[0].token_ids) == 20


def test_concurrent_requests_run_in_the_same_steps(worker):
    engine = worker.llm.engine
    batch_sizes = []
    schedule = engine.scheduler.schedule

    def spy():
        out = schedule()
        batch_sizes.append(len(out.scheduled))
        return out

    engine.scheduler.schedule = spy
    try:
        collectors = [Collector() for _ in range(4)]
        params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
        for i, c in enumerate(collectors):
            worker.submit([10 + i, 20, 30], params, c)
        assert all(c.done.wait(60) for c in collectors)
    finally:
        engine.scheduler.schedule = schedule
    assert max(batch_sizes) == 4


def test_cancel_mid_stream_frees_the_blocks(worker):
    before = worker.kv_stats().num_used
    c = Collector()
    handle = worker.submit([7] * 40, SamplingParams(max_tokens=900, temperature=0,
                                                    ignore_eos=True), c)
    assert c.first_token.wait(60)
    handle.cancel()
    assert c.done.wait(60)
    assert c.finished.output.outputs[0].finish_reason == "abort"
    assert 0 < len(c.finished.output.outputs[0].token_ids) < 900
    assert worker.kv_stats().num_used == before


def test_a_bad_request_reports_an_error_and_the_worker_keeps_serving(worker):
    bad = Collector()
    worker.submit([5] * 5000, SamplingParams(max_tokens=4), bad)
    assert bad.done.wait(60)
    [error] = [e for e in bad.events if isinstance(e, ErrorEvent)]
    assert "prompt has 5000 tokens" in error.message
    good = Collector()
    worker.submit([1, 2, 3], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), good)
    assert good.done.wait(60)
    assert len(good.finished.output.outputs[0].token_ids) == 4


def test_a_failing_step_ends_its_requests_with_an_error_and_frees_their_blocks(worker):
    runner = worker.llm.engine.runner
    before = worker.kv_stats()

    def broken(out):
        raise RuntimeError("out of device memory")

    c = Collector()
    runner.execute = broken
    try:
        worker.submit([3] * 40, SamplingParams(max_tokens=4), c)
        assert c.done.wait(60)
    finally:
        del runner.execute  # back to the class's method
    [error] = [e for e in c.events if isinstance(e, ErrorEvent)]
    assert error.message == "generation failed: out of device memory"
    after = worker.kv_stats()  # the snapshot already shows the failed request come and go
    assert after.num_used == before.num_used
    assert after.prefix_query_tokens == before.prefix_query_tokens + 40
    good = Collector()
    worker.submit([1, 2, 3], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), good)
    assert good.done.wait(60)


def test_activity_events_frame_a_run_and_the_idle_snapshot_is_fresh(worker, monkeypatch):
    seen: list = []  # activity events and "measured" for each memory measurement, in order
    idle = threading.Event()

    def listen(event: ActivityEvent) -> None:
        seen.append(event)
        if not event.busy and ActivityEvent(True) in seen:
            idle.set()

    engine = worker.llm.engine
    measure = engine.memory_stats
    monkeypatch.setattr(engine, "memory_stats", lambda: seen.append("measured") or measure())
    worker.set_activity_listener(listen)

    def run(prompt_seed: int, reader: bool) -> tuple[list, float]:
        seen.clear()
        idle.clear()
        c = Collector()
        start = time.monotonic()
        # A prompt no other test sent: it writes blocks no snapshot has seen yet.
        worker.submit(random_prompt(prompt_seed, 300),
                      SamplingParams(max_tokens=60, ignore_eos=True), c)
        while reader and not c.done.is_set():  # a memory panel polling the snapshot
            worker.memory_stats()
            time.sleep(0.05)
        assert c.done.wait(60) and idle.wait(10)
        # (The worker may still have been falling idle after the previous test.)
        return seen[seen.index(ActivityEvent(True)):], time.monotonic() - start

    try:
        unread, _ = run(98, reader=False)
        read, elapsed = run(99, reader=True)
    finally:
        worker.set_activity_listener(None)
    for events in (unread, read):
        assert [e for e in events if e != "measured"] == [ActivityEvent(True),
                                                          ActivityEvent(False)]
        assert events[-2:] == ["measured", ActivityEvent(False)]  # once as it fell idle
    # While running: never when nobody reads, else at most every MEMORY_INTERVAL_S.
    assert unread.count("measured") == 1
    assert read.count("measured") <= elapsed / MEMORY_INTERVAL_S + 1
    fresh = measure()
    assert worker.memory_stats().kv_pool_resident_bytes == fresh.kv_pool_resident_bytes > 0


class HeldCompile:
    """xgrammar's compile held until released, noting the thread each compile ran on."""

    def __init__(self, real) -> None:
        self.real, self.threads = real, []
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, *args):
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.release.wait(60)
        return self.real(*args)


@pytest.fixture
def held(monkeypatch):
    held = HeldCompile(compiler._compile)
    monkeypatch.setattr(compiler, "_compile", held)
    yield held
    held.release.set()


def constrained(title: str, **fields) -> SamplingParams:
    schema = {"title": title, "type": "object", "properties": {"a": {"type": "integer"}}}
    return SamplingParams(max_tokens=8, temperature=0,
                          response_format=ResponseFormat("json_schema", schema), **fields)


def test_a_schema_compiles_off_the_worker_thread_while_others_decode(worker, held):
    slow = Collector()
    worker.submit([1, 2, 3], constrained("worker-slow"), slow)
    assert held.started.wait(60)
    plain = Collector()
    worker.submit([4, 5, 6], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                  plain)
    assert plain.done.wait(10) and not slow.done.is_set()  # it did not wait for the compile
    held.release.set()
    assert slow.done.wait(60)
    assert slow.finished.output.outputs[0].token_ids
    assert held.threads and "folio-engine" not in held.threads
    assert worker.kv_stats().num_used == 0


def test_a_request_cancelled_while_its_schema_compiles_ends_once_it_is_compiled(worker,
                                                                                 held):
    c = Collector()
    handle = worker.submit([1, 2, 3], constrained("worker-cancelled", ignore_eos=True), c)
    assert held.started.wait(60)
    handle.cancel()
    held.release.set()
    assert c.done.wait(60)
    assert c.finished.output.outputs[0].finish_reason == "abort"
    assert worker.kv_stats().num_used == 0


def test_a_schema_the_worker_cannot_compile_is_a_rejected_request(worker):
    c = Collector()
    fmt = ResponseFormat("json_schema", {"type": "array", "uniqueItems": True})
    worker.submit([1, 2, 3], SamplingParams(max_tokens=4, response_format=fmt), c)
    assert c.done.wait(60)
    [error] = [e for e in c.events if isinstance(e, ErrorEvent)]
    assert error.rejected and "'uniqueItems'" in error.message
