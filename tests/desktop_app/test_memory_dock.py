"""The Memory dock on the real window and the starter model: the KV pool's reserved and
resident bytes apart, its precision and bytes per token, and no timer firing in the panel
while the engine is idle."""

from __future__ import annotations

import sys

from PySide6.QtCore import QEvent, QObject

from desktop_app.widgets.memory_rows import format_bytes, resident_text
from desktop_app.widgets.refresh_schedule import BUSY_INTERVAL_MS
from tests.cpu_pool import CPU_KV_ITEM_BYTES
from tests.desktop_app.test_main_window import send, settings
from tests.engine.runner.test_resident import kernel_resident

IDLE_WATCH_MS = 1700  # longer than any poll the panel ever ran while idle (1.5 s)


class PanelTimers(QObject):
    """Counts the timer events delivered to the panel or anything inside it."""

    def __init__(self, panel) -> None:
        super().__init__()
        self.panel, self.count = panel, 0

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.Timer:
            while obj is not None and obj is not self.panel:
                obj = obj.parent()
            self.count += obj is self.panel
        return False


def test_the_dock_shows_the_pool_reserved_and_resident(qtbot, make_starter_bridge,
                                                       make_window):
    bridge = make_starter_bridge()
    window = make_window(bridge, settings(max_tokens=24))
    window.vram_action.trigger()  # the dock starts closed on a first run
    send(qtbot, window, "Name three colors.")  # returns once the engine is idle
    panel, mem, kv = window.vram_panel, bridge.memory_stats(), bridge.kv_stats()
    # The worker measured the pool as it fell idle: every block written so far (this
    # chat's and earlier tests' on the shared model), as the kernel counts them.
    resident = mem.kv_pool_resident_bytes
    assert kv.num_cached * kv.bytes_per_block <= resident < mem.kv_pool_bytes
    if sys.platform.startswith("linux"):
        [pool] = bridge.worker.llm.engine.runner.kv_caches
        storage = pool.untyped_storage()
        assert resident == kernel_resident(storage.data_ptr(), storage.nbytes())
    # Reserved: all 384 blocks and the pool's null block (core/block_pool.py).
    assert mem.kv_pool_bytes == (kv.num_blocks + 1) * kv.bytes_per_block
    # 385 blocks of 16 tokens x 30 layers x K, V x 3 heads x 64 (float16 on the native kernels)
    assert panel.value("kv_pool") == ("135.4 MiB" if CPU_KV_ITEM_BYTES == 2 else "270.7 MiB")
    assert panel.value("kv_resident") == resident_text(mem)
    # The pool's precision, as the engine resolved it, and what a token costs in it.
    assert mem.kv_dtype == ("float16" if CPU_KV_ITEM_BYTES == 2 else "float32")
    assert (panel.value("kv_precision"), panel.value("kv_per_token")) == (
        ("16-bit (float16)", "22.5 KiB") if CPU_KV_ITEM_BYTES == 2
        else ("32-bit (float32)", "45.0 KiB"))
    other = mem.process_rss_bytes - mem.weights_bytes - resident
    assert mem.other_bytes == other > 0
    assert panel.value("other") == format_bytes(other)  # MiB or GiB, with the RSS


def test_no_timer_fires_in_the_panel_while_the_engine_is_idle(qtbot, qapp,
                                                              make_starter_bridge,
                                                              make_window):
    bridge = make_starter_bridge()
    window = make_window(bridge, settings(max_tokens=8))
    window.vram_action.trigger()  # the dock starts closed on a first run
    panel = window.vram_panel
    timers = PanelTimers(panel)
    qapp.installEventFilter(timers)
    try:
        send(qtbot, window, "Hi!")  # returns once the engine is idle
        assert panel.isVisible() and not panel.timer.isActive()
        timers.count = 0
        qtbot.wait(IDLE_WATCH_MS)
        assert timers.count == 0
        panel.set_busy(True)  # what the bridge's activityChanged does when a reply starts
        qtbot.wait(3 * BUSY_INTERVAL_MS)
        assert timers.count >= 2  # the counter sees the panel's poll when there is one
        panel.set_busy(False)
    finally:
        qapp.removeEventFilter(timers)
