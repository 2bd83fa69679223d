"""The memory panel's expert bytes: a row under Weights for a mixture of experts, hidden
for a dense model."""

from __future__ import annotations

from desktop_app.widgets.memory_rows import memory_rows
from desktop_app.widgets.vram_panel import VramPanel
from engine.core.kv_stats import KVStats
from engine.runner.memory import MemoryStats

MOE = MemoryStats("cpu", 4 * 2**30, 2**28, None, None, None, 5 * 2**30,
                  expert_bytes=3 * 2**30)
DENSE = MemoryStats("cpu", 2**30, 2**28, None, None, None, 2 * 2**30)
KV = KVStats(block_size=16, num_blocks=8, bytes_per_block=4096, num_free=8, num_used=0,
             num_cached=0, num_shared=0, bytes_saved_by_sharing=0, allocated_slots=0,
             used_slots=0, prefix_hit_tokens=0, prefix_query_tokens=0, blocks=[],
             blocks_per_owner={})


class Source:
    def __init__(self, mem):
        self.mem, self.max_model_len, self.busy = mem, 8192, False

    def kv_stats(self):
        return KV

    def memory_stats(self):
        return self.mem

    def remote_status(self):
        return None  # a local model

    def clear_disk(self):
        pass


def test_rows_name_the_experts_share_of_the_weights():
    rows = memory_rows(MOE)
    assert (rows["weights"], rows["experts"]) == ("4.0 GiB", "3.0 GiB")
    assert "experts" not in memory_rows(DENSE)


def test_the_panel_shows_the_row_only_for_a_mixture_of_experts(qtbot):
    panel = VramPanel(Source(MOE))
    qtbot.addWidget(panel)
    panel.refresh()
    label = panel.findChild(type(panel._values["experts"]), "vram_experts")
    assert label.text() == "3.0 GiB"
    assert panel._memory_form.isRowVisible(label)
    panel.source = Source(DENSE)
    panel.refresh()
    assert not panel._memory_form.isRowVisible(label)
