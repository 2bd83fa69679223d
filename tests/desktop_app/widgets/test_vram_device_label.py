"""The memory panel names the device the engine resolved, as the engine labels it."""

from __future__ import annotations

import torch

from desktop_app.widgets.vram_panel import VramPanel
from engine.core.kv_stats import KVStats
from engine.runner.memory import MemoryStats, memory_stats


class Source:
    max_model_len, busy = 8192, False

    def __init__(self, mem):
        self.mem = mem

    def kv_stats(self):
        return KVStats(block_size=16, num_blocks=8, bytes_per_block=1024, num_free=8,
                       num_used=0, num_cached=0, num_shared=0, bytes_saved_by_sharing=0,
                       allocated_slots=0, used_slots=0, prefix_hit_tokens=0,
                       prefix_query_tokens=0, blocks=[], blocks_per_owner={})

    def memory_stats(self):
        return self.mem

    def remote_status(self):
        return None  # a local model

    def clear_disk(self):
        pass


def test_the_panel_shows_the_resolved_label(qtbot):
    gib = 2**30
    mem = MemoryStats("CUDA 0: NVIDIA H200", gib, 2 * gib, 140 * gib, 5 * gib, 135 * gib, gib)
    panel = VramPanel(Source(mem))
    qtbot.addWidget(panel)
    panel.refresh()
    assert panel.value("device") == "CUDA 0: NVIDIA H200"


def test_memory_stats_carry_the_label():
    pool = [torch.zeros(4)]
    assert memory_stats(torch.device("cpu"), 1, pool, "CPU").device == "CPU"
    assert memory_stats(torch.device("cpu"), 1, pool).device == "cpu"  # without one, torch's
