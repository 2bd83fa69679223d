"""Disk loads off the step loop, through the engine: a reopened chat's history is read by
the background reader while another request keeps decoding (its steps never wait: the
step order shows it), an abort while loading frees everything and drops the late reads,
and the reply equals the one with the tier off."""

from __future__ import annotations

import threading

import pytest

from engine import SamplingParams
from engine.core.sequence import SequenceStatus
from engine.disk.group import GroupDisk
from engine.outputs import FinishedEvent
from tests.engine import test_disk_tier_engine as disk_tests
from tests.engine.test_disk_tier_engine import GREEDY, chat, new_llm, next_turn

cache, tiny = disk_tests.cache, disk_tests.tiny

pytestmark = pytest.mark.usefixtures("single_torch_thread")

LONG = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


@pytest.fixture
def gate(monkeypatch):
    """Disk reads wait until the gate opens (a slow disk, held as long as a test needs)."""
    opened = threading.Event()
    load = GroupDisk.load

    def held_load(self, block_hash, token_ids):
        opened.wait(30)
        return load(self, block_hash, token_ids)

    monkeypatch.setattr(GroupDisk, "load", held_load)
    yield opened
    opened.set()


@pytest.fixture
def closed_chat(tiny, cache):
    first = new_llm(tiny)
    messages, _ = chat(first, 5)
    first.close()
    return messages


def run_until_done(engine, order: list[str]) -> dict:
    outputs = {}
    while engine.has_unfinished_requests():
        events = engine.step()
        order.append(",".join(sorted(engine.last_step_tokens)))
        for event in events:
            if isinstance(event, FinishedEvent):
                outputs[event.request_id] = event.output
    return outputs


def test_a_running_request_decodes_while_another_loads(tiny, closed_chat, gate):
    messages = closed_chat
    engine = new_llm(tiny).engine
    engine.add_request("a reply that streams while the chat loads", LONG, "a")
    order: list[str] = []
    while "a" not in engine.last_step_tokens:
        engine.step()
    engine.add_request(next_turn(messages), GREEDY, "b")
    for _ in range(4):  # the reads are held: b waits, a keeps its steps
        engine.step()
        order.append(",".join(sorted(engine.last_step_tokens)))
    b = engine.scheduler.requests["b"]
    assert order == ["a"] * 4
    assert engine.scheduler.loading == [b] and b.seqs[0].status is SequenceStatus.LOADING
    gate.set()
    outputs = run_until_done(engine, order)
    # b's first token comes after its reads, while a was still decoding.
    assert "a,b" in order and outputs["b"].metrics.num_disk_tokens > 0
    assert outputs["b"].metrics.num_disk_tokens == outputs["b"].metrics.num_cached_tokens
    tier_off = new_llm(tiny, kv_disk_bytes=0).chat(next_turn(messages), GREEDY)
    assert outputs["b"].outputs[0].token_ids == tier_off.outputs[0].token_ids
    assert engine.kv_stats(with_blocks=False).num_used == 0


def test_abort_while_loading_frees_the_blocks_and_drops_the_reads(tiny, closed_chat, gate):
    messages = closed_chat
    engine = new_llm(tiny).engine
    engine.add_request(next_turn(messages), GREEDY, "b")
    engine.step()
    held = engine.kv_stats(with_blocks=False).num_used
    assert engine.scheduler.loading and held > 0
    assert engine.abort("b") is not None
    stats = engine.kv_stats(with_blocks=False)
    assert stats.num_used == 0 and stats.num_cached == 0
    gate.set()
    assert not engine.kv_cache.loads.pending and not engine.has_unfinished_requests()
    # The chat still reopens from disk (the cancelled reads dropped as they finish),
    # with the tier-off reply.
    engine.add_request(next_turn(messages), GREEDY, "again")
    out = run_until_done(engine, [])["again"]
    assert out.metrics.num_disk_tokens > 0
    tier_off = new_llm(tiny, kv_disk_bytes=0).chat(next_turn(messages), GREEDY)
    assert out.outputs[0].token_ids == tier_off.outputs[0].token_ids
