"""The Memory dock's block map during a beam search: the beams' shared blocks show as
shared, owned by every beam that holds them, and the search's blocks count once for its
chat, from a real engine's kv_stats."""

from __future__ import annotations

from collections import Counter

import pytest

from desktop_app.widgets.vram_panel import VramPanel
from engine.beam.params import BeamSearchParams
from engine.runner.memory import MemoryStats
from tests.engine.tiny_models import random_prompt, save_tiny_model

CPU = MemoryStats("cpu", 538 * 2**20, 2**30, None, None, None, 900 * 2**20, 100 * 2**20)


class EngineSource:
    """What the dock reads (the bridge's snapshots), straight from an engine."""

    busy = True

    def __init__(self, engine) -> None:
        self.engine = engine
        self.max_model_len = engine.max_model_len

    def kv_stats(self):
        return self.engine.kv_stats()

    def memory_stats(self):
        return CPU

    def remote_status(self):
        return None

    def clear_disk(self):
        pass


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from engine import LLM

    path = save_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
    return LLM(str(path), num_gpu_blocks=64, kv_cache_dtype="float32", block_size=8).engine


def test_block_map_shows_the_beams_sharing(qtbot, engine):
    request_id = engine.add_request(random_prompt(3, 20), BeamSearchParams(4, 12))
    for _ in range(5):  # the prompt, then a few beam steps: every beam still running
        engine.step()
    beams = engine.scheduler.requests[request_id].live_seqs
    assert len(beams) == 4
    null = engine.kv_cache.pools[0].null_id
    holders = Counter(b for s in beams for b in engine.kv_cache.block_tables(s)[0]
                      if b != null)
    shared = {b for b, n in holders.items() if n > 1}
    assert shared  # the prompt's full blocks at least

    panel = VramPanel(EngineSource(engine), chat_of_owner=lambda owner: "Beams"
                      if owner.startswith(request_id + ":") else None)
    qtbot.addWidget(panel)
    panel.refresh()
    assert panel.value("blocks_shared") == str(len(shared))
    assert panel.value("blocks_used").startswith(f"{len(holders)} / ")
    cells = {info.block_id: info for info in panel.block_map.blocks}
    for block_id, count in holders.items():
        assert cells[block_id].state == ("shared" if count > 1 else "used")
        assert len(cells[block_id].owners) == count
    # A block shared by four beams counts once for the chat.
    assert panel.value("per_chat") == f"Beams: {len(holders)} blocks"
    engine.abort(request_id)
    panel.refresh()
    assert panel.value("blocks_shared") == "0"
