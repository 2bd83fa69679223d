"""The VRAM panel's line per KV group: shown for a model with several, hidden otherwise."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

from desktop_app.widgets.vram_panel import VramPanel, group_rows
from engine.core.kv_stats import KVGroupStats, KVStats
from engine.runner.memory import MemoryStats

CPU = MemoryStats("cpu", 538 * 2**20, 100 * 2**20, None, None, None, 900 * 2**20)
GROUPS = [KVGroupStats("global", 1, 130, 12, 3, 118, 4096),
          KVGroupStats("sliding (window 64)", 3, 64, 5, 2, 59, 3 * 4096)]


def _kv(groups) -> KVStats:
    used = sum(g.num_used for g in groups) or 3
    total = sum(g.num_blocks for g in groups) or 8
    return KVStats(block_size=16, num_blocks=total, bytes_per_block=4096,
                   num_free=total - used, num_used=used, num_cached=2, num_shared=0,
                   bytes_saved_by_sharing=0, allocated_slots=0, used_slots=0,
                   prefix_hit_tokens=0, prefix_query_tokens=0, groups=list(groups))


class Source:
    def __init__(self, kv):
        self.kv, self.max_model_len, self.busy = kv, 8192, False

    def kv_stats(self):
        return self.kv

    def memory_stats(self):
        return CPU

    def remote_status(self):
        return None  # a local model

    def clear_disk(self):
        pass


def test_group_rows_and_totals():
    kv = _kv(GROUPS)
    assert group_rows(kv) == [
        "global: 1 layer, 12 / 130 blocks used (3 cached, 118 free), 48.0 KiB of 520.0 KiB",
        "sliding (window 64): 3 layers, 5 / 64 blocks used (2 cached, 59 free), "
        "60.0 KiB of 768.0 KiB"]
    # Totals keep their meaning: bytes add up each group's own block size.
    assert kv.used_bytes == 12 * 4096 + 5 * 3 * 4096
    assert kv.pool_bytes == 130 * 4096 + 64 * 3 * 4096
    assert kv.headroom_tokens() == 118 * 16  # the global group holds every token
    assert group_rows(_kv([])) == [] and group_rows(_kv(GROUPS[:1])) == []


def test_panel_shows_a_line_per_group_only_with_several(qtbot):
    source = Source(_kv(GROUPS))
    panel = VramPanel(source)
    qtbot.addWidget(panel)
    panel.refresh()
    assert panel.group_lines() == group_rows(source.kv)
    assert panel.findChild(QLabel, "vram_group_1").text().startswith("sliding (window 64)")
    source.kv = _kv([])
    panel.refresh()
    assert panel.group_lines() == []
    assert panel.findChild(QLabel, "vram_group_0").isHidden()
