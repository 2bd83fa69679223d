"""The memory panel's linear-attention state pool: its own line beside the KV pool for a
hybrid model (Qwen3.5), hidden for a model without linear layers."""

from __future__ import annotations

from desktop_app.widgets.memory_rows import memory_rows
from desktop_app.widgets.vram_panel import VramPanel
from engine.runner.memory import MemoryStats
from tests.desktop_app.widgets.test_vram_experts import DENSE, Source

HYBRID = MemoryStats("cpu", 2**30, 2**28, None, None, None, 2 * 2**30,
                     kv_pool_resident_bytes=2**20, state_pool_bytes=3 * 2**20)


def test_rows_show_the_state_pool_and_leave_it_out_of_everything_else():
    rows = memory_rows(HYBRID)
    assert rows["state_pool"] == "3.0 MiB"
    assert HYBRID.other_bytes == 2 * 2**30 - 2**30 - 2**20 - 3 * 2**20
    assert "state_pool" not in memory_rows(DENSE)


def test_the_panel_shows_the_line_only_for_a_hybrid_model(qtbot):
    panel = VramPanel(Source(HYBRID))
    qtbot.addWidget(panel)
    panel.refresh()
    label = panel.findChild(type(panel._values["state_pool"]), "vram_state_pool")
    assert label.text() == "3.0 MiB"
    assert panel._memory_form.isRowVisible(label)
    panel.source = Source(DENSE)
    panel.refresh()
    assert not panel._memory_form.isRowVisible(label)
