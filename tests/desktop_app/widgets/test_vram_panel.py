"""The VRAM panel's numbers, block map and chart, against snapshots; when it polls."""

from __future__ import annotations

from PySide6.QtCore import QPoint

from desktop_app.services.remote_metrics import RemoteStatus
from desktop_app.widgets.block_map import BlockMap
from desktop_app.widgets.memory_rows import memory_rows
from desktop_app.widgets.refresh_schedule import BUSY_INTERVAL_MS, REMOTE_INTERVAL_MS
from desktop_app.widgets.vram_panel import (
    Sparkline,
    VramPanel,
    blocks_per_chat,
    disk_row,
    headroom_tokens,
    kv_rows,
)
from engine.core.kv_stats import BlockInfo, DiskTierStats, KVStats
from engine.runner.memory import MemoryStats


def _kv(blocks=None, **kw) -> KVStats:
    fields = dict(block_size=16, num_blocks=8, bytes_per_block=737280, num_free=5, num_used=3,
                  num_cached=2, num_shared=1, bytes_saved_by_sharing=737280,
                  allocated_slots=48, used_slots=36, prefix_hit_tokens=30,
                  prefix_query_tokens=120, blocks=blocks or [], blocks_per_owner={})
    fields.update(kw)
    return KVStats(**fields)


class Source:
    def __init__(self, kv, mem, max_model_len=8192):
        self.kv, self.mem, self.max_model_len, self.busy = kv, mem, max_model_len, False
        self.reads = 0
        self.cleared = 0

    def clear_disk(self):
        self.cleared += 1

    def kv_stats(self):
        self.reads += 1
        return self.kv

    def memory_stats(self):
        return self.mem

    def remote_status(self):
        return None  # a local model


CPU = MemoryStats("cpu", 538 * 2**20, 2**30, None, None, None, 900 * 2**20, 100 * 2**20)


def test_kv_rows():
    assert kv_rows(_kv()) == {
        "blocks_used": "3 / 8", "blocks_shared": "1", "blocks_cached": "2", "blocks_free": "5",
        "block_size": "16 tokens, 720.0 KiB", "saved_by_sharing": "720.0 KiB",
        "waste": "25.0%", "hit_rate": "25.0% (30 / 120 tokens)",
        "rolled_back": "0 blocks since start"}


def test_blocks_per_chat_counts_shared_blocks_once():
    blocks = [BlockInfo(0, "shared", 2, ("r1:0", "r1:1")), BlockInfo(1, "used", 1, ("r1:0",)),
              BlockInfo(2, "used", 1, ("r2:0",)), BlockInfo(3, "cached", 0, ()),
              BlockInfo(4, "used", 1, ("gone:0",))]
    chats = {"r1": "Chat A", "r2": "Chat B"}
    assert blocks_per_chat(_kv(blocks), lambda o: chats.get(o.split(":")[0])) == {
        "Chat A": 2, "Chat B": 1}


def test_headroom_is_bounded_by_pool_and_context():
    kv = _kv(num_free=5)  # 80 tokens fit in the free blocks
    assert headroom_tokens(kv, 8192, 100) == 80
    assert headroom_tokens(kv, 150, 100) == 50
    assert headroom_tokens(kv, 150, 400) == 0
    assert headroom_tokens(kv, None, 10**6) == 80


def test_panel_labels_match_the_snapshot(qtbot):
    blocks = [BlockInfo(i, s, r, o) for i, (s, r, o) in enumerate(
        [("shared", 2, ("q:0", "q:1")), ("used", 1, ("q:0",)), ("used", 1, ("q:1",)),
         ("cached", 0, ()), ("cached", 0, ()), ("free", 0, ()), ("free", 0, ()),
         ("free", 0, ())])]
    panel = VramPanel(Source(_kv(blocks), CPU),
                      chat_of_owner=lambda owner: "Trip plans" if owner.startswith("q:")
                      else None, chat_tokens=lambda: 8150)
    qtbot.addWidget(panel)
    panel.refresh()
    expected = {**memory_rows(CPU), **kv_rows(_kv())}
    for key, text in expected.items():
        assert panel.value(key) == text
    assert panel.value("headroom") == (
        "This chat holds about 8,150 tokens; it can grow about 42 more")
    assert panel.value("per_chat") == "Trip plans: 3 blocks"
    assert panel.block_map.blocks == blocks
    assert panel.sparkline.samples[-1][1] == 3 / 8


def test_the_disk_tier_line_and_its_clear_button(qtbot):
    disk = DiskTierStats(True, 120, 90 * 2**20, 4 << 30, 30, 0, 120, 480)
    assert disk_row(_kv(disk=disk)) == (
        "120 blocks, 90.0 MiB of 4.0 GiB; 30 blocks (480 tokens) read back since start, "
        "480 tokens of them used by replies")
    assert disk_row(_kv()).startswith("Off (Settings")
    off = DiskTierStats(False, 0, 0, 4 << 30, 0, 0, 0)
    assert disk_row(_kv(disk=off)).startswith("Turned off")
    source = Source(_kv(disk=disk), CPU)
    panel = VramPanel(source)
    qtbot.addWidget(panel)
    panel.refresh()
    assert panel.value("disk") == disk_row(_kv(disk=disk))
    button = panel.findChild(type(panel.clear_disk), "clearDiskButton")
    assert button is not None and button.isEnabled()
    button.click()
    assert source.cleared == 1
    source.kv = _kv()
    panel.refresh()
    assert not panel.clear_disk.isEnabled()


def test_panel_without_model(qtbot):
    panel = VramPanel(Source(None, None))
    qtbot.addWidget(panel)
    panel.refresh()
    assert panel.value("blocks_used") == "–"
    assert panel.value("kv_resident") == "–"


def test_panel_polls_only_while_the_engine_runs_and_it_is_visible(qtbot):
    source = Source(_kv(), CPU)
    panel = VramPanel(source)
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    assert source.reads == 1  # shown: read once
    qtbot.wait(3 * BUSY_INTERVAL_MS)
    assert source.reads == 1 and not panel.timer.isActive()  # idle: nothing polls
    panel.set_busy(True)
    assert panel.timer.isActive() and panel.timer.interval() == BUSY_INTERVAL_MS <= 500
    qtbot.waitUntil(lambda: source.reads >= 4, timeout=5 * BUSY_INTERVAL_MS)
    panel.hide()  # the dock closed mid-reply: no polling for a hidden panel
    assert not panel.timer.isActive()
    reads = source.reads
    panel.show()
    assert panel.timer.isActive() and source.reads == reads + 1
    panel.set_busy(False)  # the run ended: its last figures, then nothing
    assert not panel.timer.isActive() and source.reads == reads + 2


def test_panel_polls_a_remote_server_while_visible(qtbot):
    class Remote(Source):
        def remote_status(self):
            self.reads += 1
            return None if self.gone else RemoteStatus("gpu-box", "http://gpu-box/v1", "m")

    source = Remote(None, None)
    source.gone = False
    panel = VramPanel(source)
    qtbot.addWidget(panel)
    panel.show()
    assert panel.timer.isActive() and panel.timer.interval() == REMOTE_INTERVAL_MS
    source.gone = True  # unloaded
    panel.refresh()
    assert not panel.timer.isActive()


def test_block_map_cells_and_tooltips(qtbot):
    block_map = BlockMap()
    qtbot.addWidget(block_map)
    block_map.resize(150, 100)
    block_map.describe_owner = lambda owner: f"Chat X ({owner})"
    blocks = [BlockInfo(i, "used", 1, (f"r:{i}",)) for i in range(30)]
    block_map.set_blocks(blocks)
    # 150 px wide: cells of 14 px plus a 1 px gap, 10 to a row.
    assert block_map.cell_rect(11).topLeft() == QPoint(15, 15)
    assert block_map.block_at(QPoint(16, 16)) is blocks[11]
    assert block_map.block_at(QPoint(149, 100)) is None
    assert block_map.grid_height(150) == 45
    assert block_map.tooltip_for(blocks[3]) == (
        "Block 3: used, ref count 1\nOwners:\n  Chat X (r:3)")
    assert block_map.tooltip_for(BlockInfo(9, "cached", 0, ())) == (
        "Block 9: cached, ref count 0\nHolds a reusable prefix; free to evict")
    many = [BlockInfo(i, "free", 0, ()) for i in range(2048)]
    block_map.set_blocks(many)
    # Cells shrink for big pools: the map keeps its height.
    assert block_map.grid_height(150) <= block_map.height() == block_map.sizeHint().height()


def test_sparkline_keeps_five_minutes(qtbot):
    line = Sparkline()
    qtbot.addWidget(line)
    for t in range(0, 400 * 4, 2):  # a sample each 0.5 s
        line.add(t / 1600, now=t / 4)
    assert line.samples[0] == (99.5, 398 / 1600)
    assert line.samples[-1] == (399.5, 1598 / 1600)
    assert line.scale() == 1.0
    line.samples.clear()
    line.add(0.02, now=1.0)
    assert line.scale() == 0.05  # small usage is drawn against a 5% scale, not 100%
    line.add(0.2, now=1.5)
    assert line.scale() == 0.25
    assert not line.grab().isNull()


def test_sparkline_steps_over_an_idle_gap(qtbot):
    line = Sparkline()
    qtbot.addWidget(line)
    line.add(0.1, now=10.0)
    line.add(0.1, now=10.4)
    line.add(0.3, now=70.0)  # the engine was idle for a minute: usage stayed at 0.1
    assert list(line.samples) == [(10.0, 0.1), (10.4, 0.1), (70.0, 0.1), (70.0, 0.3)]
