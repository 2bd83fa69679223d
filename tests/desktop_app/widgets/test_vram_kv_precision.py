"""The Memory dock's KV precision rows: the pool's format and what a token costs in it."""

from __future__ import annotations

from dataclasses import replace

from desktop_app.widgets.kv_rows import bytes_per_token, precision_rows
from desktop_app.widgets.vram_panel import VramPanel
from engine.core.kv_stats import KVGroupStats, KVStats
from engine.runner.memory import MemoryStats

CPU = MemoryStats("cpu", 538 * 2**20, 100 * 2**20, None, None, None, 900 * 2**20)
# The starter in int8: 16 tokens x 30 layers x K, V x 3 heads x (64 + a 2-byte scale).
INT8_BLOCK = 16 * 30 * 2 * 3 * 66


def _kv(bytes_per_block: int, groups=()) -> KVStats:
    return KVStats(block_size=16, num_blocks=8, bytes_per_block=bytes_per_block, num_free=5,
                   num_used=3, num_cached=2, num_shared=0, bytes_saved_by_sharing=0,
                   allocated_slots=0, used_slots=0, prefix_hit_tokens=0,
                   prefix_query_tokens=0, groups=list(groups))


class Source:
    def __init__(self, kv, kv_format=None):
        self.kv, self.max_model_len = kv, 8192
        self.mem = CPU if kv_format is None else replace(CPU, kv_dtype=kv_format)

    def kv_stats(self):
        return self.kv

    def memory_stats(self):
        return self.mem

    def remote_status(self):
        return None

    def clear_disk(self):
        pass


def test_the_row_names_the_format_and_the_bytes_per_token():
    kv = _kv(INT8_BLOCK)
    assert bytes_per_token(kv) == 11880
    assert precision_rows(kv, "int8") == {"kv_precision": "8-bit (int8)",
                                          "kv_per_token": "11.6 KiB"}
    assert precision_rows(_kv(16 * 30 * 2 * 3 * 34), "int4") == {
        "kv_precision": "4-bit (int4)", "kv_per_token": "6.0 KiB"}
    # A source that does not say (a test's fake).
    assert precision_rows(kv, None) == {"kv_precision": "n/a", "kv_per_token": "11.6 KiB"}


def test_a_token_costs_in_every_kv_group():
    groups = [KVGroupStats("global", 1, 130, 12, 3, 118, 4096),
              KVGroupStats("sliding (window 64)", 3, 64, 5, 2, 59, 3 * 4096)]
    kv = _kv(4096, groups)
    assert bytes_per_token(kv) == 4 * 4096 // 16 == 1024
    assert precision_rows(kv, "float16")["kv_per_token"] == "1.0 KiB"


def test_the_panel_shows_the_row(qtbot):
    panel = VramPanel(Source(_kv(INT8_BLOCK), "int8"))
    qtbot.addWidget(panel)
    assert panel.value("kv_precision") == "–"  # no figures read yet
    panel.refresh()
    assert (panel.value("kv_precision"), panel.value("kv_per_token")) == ("8-bit (int8)",
                                                                          "11.6 KiB")
    bare = VramPanel(Source(_kv(INT8_BLOCK)))
    qtbot.addWidget(bare)
    bare.refresh()
    assert (bare.value("kv_precision"), bare.value("kv_per_token")) == ("n/a", "11.6 KiB")
