"""The Memory dock on the real window and the fake engine: its chat look-ups kept between
refreshes (no database work while nothing changed), the headroom line counting the
tokens the open chat holds, and a layout that stays put when the model loads."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from desktop_app.controllers.context_window import branch_tokens
from desktop_app.data.settings import load_settings
from desktop_app.services.engine_bridge import EngineBridge


class CountingStore:
    """The chat store, counting every call the dock (or anything else) makes."""

    def __init__(self, store) -> None:
        self._store, self.calls = store, 0

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls += 1
            return attr(*args, **kwargs)

        return counted


def _refreshed(panel, key: str, text: str) -> bool:
    panel.refresh()
    return text in panel.value(key)


def test_a_refresh_reads_no_chat_from_the_store_while_nothing_changed(
        qtbot, fake_bridge, make_window, store):
    counting = CountingStore(store)
    window = make_window(fake_bridge, load_settings(), store_=counting)
    window.vram_action.trigger()
    panel, worker = window.vram_panel, fake_bridge.fake_workers[-1]
    worker.gate.clear()  # the reply holds its block until the gate opens
    window.conversation.composer.setPlainText("Hello there")
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: _refreshed(panel, "per_chat", "Hello there: 1 block"),
                    timeout=5000)
    kv = fake_bridge.kv_stats()
    counting.calls = 0
    for _ in range(3):
        panel.refresh()
    assert counting.calls == 0
    # The turn in flight holds a block of 4 tokens: the headroom counts them although
    # the chat's last reply (there is none yet) counted nothing.
    assert panel.value("headroom") == (
        f"This chat holds about 4 tokens; it can grow about {kv.headroom_tokens():,} more")
    chat_id = window.controller.chat_id
    window.chat_list.renameRequested.emit(chat_id, "Renamed")  # the sidebar's rename
    panel.refresh()
    assert panel.value("per_chat") == "Renamed: 1 block"
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        worker.gate.set()
    qtbot.waitUntil(lambda: not fake_bridge.active, timeout=5000)
    panel.refresh()
    held = branch_tokens(store, chat_id)  # the reply's prompt and its tokens
    assert held > 4
    assert panel.value("headroom").startswith(f"This chat holds about {held:,} tokens;")
    assert panel.value("per_chat") == "No chat holds blocks now"


def _layout(panel) -> dict[str, tuple]:
    body = panel.widget()
    return {w.objectName() or type(w).__name__ + str(i): (w.geometry().getRect())
            for i, w in enumerate(body.findChildren(QWidget)) if w.isVisible()}


def test_the_dock_keeps_its_layout_when_the_model_loads(qtbot, qapp, make_window,
                                                        fake_engine):
    fake_llm, fake_worker = fake_engine
    bridge = EngineBridge(llm_factory=lambda src, config=None, progress=None: fake_llm(),
                          worker_factory=fake_worker)
    window = make_window(bridge, load_settings())  # no model yet
    window.vram_action.trigger()
    panel = window.vram_panel
    qapp.processEvents()
    assert panel.value("blocks_used") == "–"
    before, hint = _layout(panel), panel.widget().sizeHint()
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        window.load_model("starter")
    panel.refresh()
    qapp.processEvents()
    assert panel.value("blocks_used") == "0 / 32"
    after = _layout(panel)
    assert {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys()
            if before.get(k) != after.get(k)} == {}
    assert panel.widget().sizeHint() == hint
    bridge.shutdown()
