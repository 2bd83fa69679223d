"""Load-ahead and the load-time warm-up: a chat opened after a restart has its history
loaded from disk before its next turn is sent, which then finds it in memory and replies
as the app kept open; the worker gives way to a real request; the warm-up forward leaves
nothing behind."""

from __future__ import annotations

import threading
import time

import pytest

from engine import EngineWorker, SamplingParams
from engine.outputs import ErrorEvent, FinishedEvent
from tests.engine import test_disk_tier_engine as disk_tests
from tests.engine.test_disk_tier_engine import GREEDY, chat, new_llm, next_turn

# The disk tier tests' fixtures: a cache folder per test, the tiny model.
cache, tiny = disk_tests.cache, disk_tests.tiny

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def history_blocks(llm, messages) -> int:
    """Tokens of the full blocks the next turn's prompt shares with the history's."""
    a, b = llm.engine.encode(messages), llm.engine.encode(next_turn(messages))
    n = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    bs = llm.engine.config.block_size
    return n // bs * bs


@pytest.fixture
def closed_chat(tiny, cache):
    first = new_llm(tiny)
    messages, _ = chat(first, 5)
    first.close()
    kept_open = first.chat(next_turn(messages), GREEDY)
    return messages, kept_open, history_blocks(first, messages)


def test_a_chat_opened_after_a_restart_is_in_memory_when_its_turn_is_sent(tiny,
                                                                           closed_chat):
    messages, kept_open, history = closed_chat
    reopened = new_llm(tiny)
    assert reopened.engine.preload(messages) == history > 0
    stats, bs = reopened.kv_stats(with_blocks=False), reopened.engine.config.block_size
    # Cached, held by nothing, and no prefix hit counted until a request uses them.
    assert stats.num_cached == history // bs and stats.num_used == 0
    assert stats.disk.hit_blocks == history // bs and stats.disk.hit_tokens == 0
    out = reopened.chat(next_turn(messages), GREEDY)
    # The reply says where its prompt came from: the disk, if ahead of the request.
    assert out.metrics.num_cached_tokens == out.metrics.num_disk_tokens == history
    assert out.outputs[0].token_ids == kept_open.outputs[0].token_ids
    assert reopened.kv_stats(with_blocks=False).disk.hit_blocks == history // bs


def test_preload_without_the_tier_or_room_loads_nothing(tiny, closed_chat):
    messages, _, _ = closed_chat
    assert new_llm(tiny, kv_disk_bytes=0).engine.preload(messages) == 0
    small = new_llm(tiny, num_gpu_blocks=4)  # the history needs more blocks than that
    assert small.engine.preload(messages) == 0
    assert small.kv_stats(with_blocks=False).num_cached == 0


class Ended:
    def __init__(self) -> None:
        self.output = None
        self.done = threading.Event()

    def __call__(self, event) -> None:
        if isinstance(event, FinishedEvent | ErrorEvent):
            self.output = getattr(event, "output", None)
            self.done.set()


def run_worker(llm, commands) -> Ended:
    """Queue ``commands`` (worker method, argument) before the worker starts, so they
    reach its loop as one batch; returns the last request's outcome."""
    worker = EngineWorker(llm)
    ended = Ended()
    for name, arg in commands:
        if name == "submit":
            worker.submit(arg, GREEDY, ended)
        else:
            getattr(worker, name)(arg)
    worker.start()
    try:
        assert ended.done.wait(60)
    finally:
        worker.shutdown()
    return ended


def spy_preloads(llm) -> list:
    calls: list = []
    real = llm.engine.preload
    llm.engine.preload = lambda prompt: calls.append(prompt) or real(prompt)
    return calls


def test_the_worker_drops_a_preload_queued_with_a_request(tiny, closed_chat):
    messages, _, history = closed_chat
    llm = new_llm(tiny)
    calls = spy_preloads(llm)
    ended = run_worker(llm, [("preload", messages), ("submit", next_turn(messages))])
    # The request ran instead and read the history from disk itself.
    assert calls == [] and ended.output.metrics.num_disk_tokens == history


def test_the_idle_worker_loads_an_opened_chat_ahead(tiny, closed_chat):
    messages, _, history = closed_chat
    llm = new_llm(tiny)
    calls = spy_preloads(llm)
    worker = EngineWorker(llm).start()
    try:
        worker.preload(messages)
        # The request is sent once the preload has run (the worker's stats show it).
        deadline = time.monotonic() + 60
        while not worker.kv_stats().num_cached and time.monotonic() < deadline:
            time.sleep(0.02)
        ended = Ended()
        worker.submit(next_turn(messages), GREEDY, ended)
        assert ended.done.wait(60)
    finally:
        worker.shutdown()
    assert calls == [messages]
    assert ended.output.metrics.num_cached_tokens == history


def test_the_warm_up_forward_leaves_nothing_behind(tiny, cache):
    warm, cold = new_llm(tiny, warm_up=True), new_llm(tiny)
    stats = warm.kv_stats(with_blocks=False)
    assert stats.num_used == stats.num_cached == stats.prefix_query_tokens == 0
    assert not warm.engine.has_unfinished_requests()
    warm.close()
    assert not any(cache.rglob("*.kvb"))
    prompt = list(range(40))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    assert (warm.generate(prompt, params)[0].outputs[0].token_ids
            == cold.generate(prompt, params)[0].outputs[0].token_ids)
