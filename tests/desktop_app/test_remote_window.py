"""A remote server as a model source in the real window, against the stub server (fast):
add it from the model manager, chat with two candidates, the memory panel, Stop, and the
server going down mid-reply. tests/e2e/test_remote_app.py does this over a real
``folio serve`` with the starter model."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLineEdit, QPushButton

from desktop_app.data.pacing_note import METRIC, NOTE
from desktop_app.data.settings import AppSettings, ChatSettings, settings_path
from desktop_app.services.engine_bridge import EngineBridge
from desktop_app.widgets.candidates import CandidateColumn
from tests.desktop_app.services.openai_stub import StubServer

KEY = "sk-window-key-42"


def send(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=20000):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)


def add_and_load(qtbot, window, url: str, key: str) -> str:
    window.open_model_manager()
    manager = window.model_manager
    manager.findChild(QPushButton, "addServerButton").click()
    dialog = manager.server_dialog
    dialog.findChild(QLineEdit, "serverUrl").setText(url)
    dialog.findChild(QLineEdit, "serverKey").setText(key)
    dialog.findChild(QPushButton, "connectServer").click()
    qtbot.waitUntil(dialog.add_button.isEnabled, timeout=20000)
    dialog.add_button.click()
    with qtbot.waitSignal(window.bridge.modelLoaded, timeout=20000):
        manager.load_button.click()
    manager.close()
    return window.settings.servers[0].source


def test_chat_with_a_remote_server(qtbot, make_window, store, captured_errors):
    stub = StubServer(api_key=KEY, words=6, delay_s=0.002)
    bridge = EngineBridge()
    settings = AppSettings(chat_defaults=ChatSettings(num_candidates=2, max_tokens=64))
    window = make_window(bridge, settings)
    try:
        source = add_and_load(qtbot, window, stub.url, KEY)
        assert bridge.is_remote and bridge.source == source
        assert bridge.max_model_len == 4096 and bridge.kv_stats() is None
        assert window.model_picker.currentText() == f"stub-model @ 127.0.0.1:{stub.port}"
        assert window.settings.last_model == source and window.settings.model_paths == []
        assert KEY not in settings_path().read_text()

        # Two candidates: both columns fill.
        send(qtbot, window, "Hello, server")
        columns = window.findChildren(CandidateColumn, "candidateColumn")
        assert [c.text() for c in columns] == ["c0w0 c0w1 c0w2 c0w3 c0w4 c0w5",
                                               "c1w0 c1w1 c1w2 c1w3 c1w4 c1w5"]
        reply = store.get_message(store.active_leaf(window.controller.chat_id))
        assert reply.model == "stub-model" and reply.token_ids is None
        assert reply.metrics["num_prompt_tokens"] == 11

        # The memory panel: where the model runs and the server's vLLM figures.
        window.vram_action.trigger()  # the dock starts closed on a first run
        panel = window.vram_panel

        def panel_shows_metrics() -> bool:
            panel.refresh()
            return panel.remote_view.value("kv_usage") == "25.0%"

        qtbot.waitUntil(panel_shows_metrics, timeout=10000)
        assert panel.remote_view.value("where") == (
            f"The model runs remotely on 127.0.0.1:{stub.port}")
        assert panel.remote_view.value("requests") == "2 running, 1 waiting"
        assert panel.remote_view.isVisible() and not panel.local_view.isVisible()

        # Stop mid-reply: the partial text stays.
        window.candidates_spin.setValue(1)
        stub.forever, stub.delay_s = True, 0.02
        window.conversation.composer.setPlainText("Go on forever")
        window.conversation.send_button.click()
        [stream] = window.controller.current.streams.values()
        qtbot.waitUntil(lambda: len(stream.texts[0]) > 15, timeout=20000)
        with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
            window.conversation.stop_button.click()
        stopped = store.get_message(stream.message_ids[0])
        assert stopped.metrics["finish_reason"] == "abort"
        assert stopped.content.startswith("c0w0 c0w1") and stopped.status == "complete"
        assert stub.disconnected.wait(5)

        # The server goes down mid-reply: a clear error, the partial text kept.
        stub.forever, stub.words, stub.die_after = False, 100, 4
        window.conversation.composer.setPlainText("And now?")
        window.conversation.send_button.click()
        [stream] = window.controller.current.streams.values()
        qtbot.waitUntil(lambda: captured_errors != [], timeout=20000)
        [(title, text)] = captured_errors
        assert title == "The reply failed"
        assert text.startswith(f"The server at {stub.url} could not be reached")
        assert "Check that the server is running" in text
        cut = store.get_message(stream.message_ids[0])
        assert (cut.status, cut.content) == ("interrupted", "c0w0 c0w1 c0w2 c0w3")
        assert window.conversation.rows()[-1].text() == cut.content
        assert not window.controller.generating

        # The key is in no export.
        chat_id = window.controller.chat_id
        assert KEY not in store.export_json(chat_id)
        assert KEY not in store.export_markdown(chat_id)
        assert all(KEY not in b["messages"][0]["content"] for b in stub.bodies)
    finally:
        bridge.shutdown()
        stub.stop()


def test_a_server_that_runs_one_request_at_a_time_says_so_once(qtbot, make_window, store,
                                                                captured_errors):
    # llama-cpp-python's server: n ignored, and a second request cuts the first short.
    stub = StubServer(max_choices=1, one_at_a_time=True, words=120, delay_s=0.01)
    bridge = EngineBridge()
    settings = AppSettings(chat_defaults=ChatSettings(num_candidates=2, max_tokens=200))
    window = make_window(bridge, settings)
    full = " ".join(f"c0w{i}" for i in range(120))
    try:
        add_and_load(qtbot, window, stub.url, "")
        send(qtbot, window, "Two candidates, please")
        columns = window.findChildren(CandidateColumn, "candidateColumn")
        assert [c.text() for c in columns] == [full, full] and stub.cuts == 1
        assert all(c.metrics_label.text().endswith(NOTE + " · Cut off at the max tokens "
                                                   "setting") for c in columns)
        assert store.get_message(columns[0].message_id).metrics[METRIC] is True
        send(qtbot, window, "Two more")  # the server is known now: no cut, no note
        later = [c for c in window.findChildren(CandidateColumn, "candidateColumn")
                 if c not in columns]
        assert [c.text() for c in later] == [full, full] and stub.cuts == 1
        assert not any(NOTE in c.metrics_label.text() for c in later)
        assert captured_errors == []
    finally:
        bridge.shutdown()
        stub.stop()


def test_a_remembered_key_loads_the_server_next_time(qtbot, make_window, folio_dirs):
    stub = StubServer(api_key=KEY)
    first = EngineBridge()
    window = make_window(first, AppSettings())
    try:
        window.open_model_manager()
        window.model_manager.findChild(QPushButton, "addServerButton").click()
        dialog = window.model_manager.server_dialog
        dialog.url_edit.setText(stub.url)
        dialog.key_edit.setText(KEY)
        dialog.remember.setChecked(True)
        dialog.connect_button.click()
        qtbot.waitUntil(dialog.add_button.isEnabled, timeout=20000)
        dialog.add_button.click()
        window.model_manager.close()
        assert KEY in settings_path().read_text()
        second = EngineBridge()
        again = make_window(second, window.settings)
        with qtbot.waitSignal(second.modelLoaded, timeout=20000):
            again.load_model(again.settings.servers[0].source)
        assert second.model_name == "stub-model"
        second.shutdown()
    finally:
        first.shutdown()
        stub.stop()


def test_a_server_that_is_down_fails_to_load_with_advice(qtbot, make_window, captured_errors):
    from engine.serve.server import free_port

    bridge = EngineBridge()
    window = make_window(bridge, AppSettings())
    source = f"remote:http://127.0.0.1:{free_port()}/v1#gone"
    with qtbot.waitSignal(bridge.modelLoadFailed, timeout=20000):
        window.load_model(source)
    [(title, text)] = captured_errors
    assert title == "Could not load the model"
    assert text.startswith("gone @ 127.0.0.1:")
    assert "could not be reached" in text and "Check that the server is running" in text
    assert not bridge.is_loaded
