"""The app on a remote server, end to end: ``folio serve --model starter`` in a subprocess,
added in the real window as a remote server; two candidates, Stop, and the server killed
mid-reply (a clear error, the partial text kept)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from PySide6.QtWidgets import QLineEdit, QPushButton

from desktop_app.data.settings import AppSettings, ChatSettings

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 300  # the starter loads slowly on a busy 2-core machine
TURN_TIMEOUT_MS = 180_000
LONG = "Write a very long story about a lighthouse keeper and her cat."


@pytest.fixture
def app_env(tmp_path, monkeypatch):
    """Own data and config folders; error dialogs recorded instead of shown."""
    from desktop_app.dialogs import error_dialog

    monkeypatch.setenv("FOLIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FOLIO_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("FOLIO_THEME", "light")
    errors: list[tuple[str, str]] = []
    monkeypatch.setattr(error_dialog, "show_error",
                        lambda parent, title, text: errors.append((title, text)))
    return errors


def _get(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def _start_server(port: int, log) -> subprocess.Popen:
    folio = Path(sys.executable).parent / "folio"
    command = [str(folio)] if folio.exists() else [sys.executable, "-m", "engine.cli"]
    proc = subprocess.Popen(command + ["serve", "--model", "starter", "--port", str(port)],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"folio serve exited early: {_tail(log)}")
        try:
            if json.loads(_get(f"http://127.0.0.1:{port}/health"))["status"] == "ok":
                return proc
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"folio serve did not answer /health: {_tail(log)}")


def _used_blocks(port: int) -> float:
    for line in _get(f"http://127.0.0.1:{port}/metrics").splitlines():
        if line.startswith('folio_kv_blocks{state="used"}'):
            return float(line.split()[-1])
    raise AssertionError("no folio_kv_blocks in /metrics")


def _tail(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-3000:]


def test_app_on_a_remote_folio_serve(qtbot, tmp_path, app_env):
    from engine.serve.server import free_port

    errors = app_env
    port = free_port()
    log = (tmp_path / "serve.log").open("w+")
    proc = _start_server(port, log)
    from desktop_app.__main__ import build_window
    from desktop_app.data.chat_store import ChatStore
    from desktop_app.services.engine_bridge import EngineBridge
    from desktop_app.widgets.candidates import CandidateColumn

    store, bridge = ChatStore(), EngineBridge()
    settings = AppSettings(chat_defaults=ChatSettings(
        num_candidates=2, max_tokens=24, temperature=0.8, seed=11))
    window = build_window(store, settings, bridge)
    qtbot.addWidget(window)
    window.show()
    try:
        # Add the server from the model manager, as a user does, and load it.
        window.open_model_manager()
        manager = window.model_manager
        manager.findChild(QPushButton, "addServerButton").click()
        dialog = manager.server_dialog
        dialog.findChild(QLineEdit, "serverUrl").setText(f"http://127.0.0.1:{port}/v1")
        dialog.findChild(QPushButton, "connectServer").click()
        qtbot.waitUntil(dialog.add_button.isEnabled, timeout=30000)
        dialog.add_button.click()
        with qtbot.waitSignal(bridge.modelLoaded, timeout=30000):
            manager.load_button.click()
        manager.close()
        assert bridge.is_remote and bridge.max_model_len == 8192  # the starter's context

        # Two candidates: both columns fill.
        window.conversation.composer.setPlainText("What is the capital of France?")
        with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
            window.conversation.send_button.click()
        columns = window.findChildren(CandidateColumn, "candidateColumn")
        assert len(columns) == 2 and all(c.text() for c in columns)
        chat_id = window.controller.chat_id

        # Stop mid-reply: the partial text stays and the server frees the blocks.
        store.update_chat_settings(chat_id, ChatSettings(max_tokens=400, temperature=0.8))
        window.conversation.composer.setPlainText(LONG)
        window.conversation.send_button.click()
        [stream] = window.controller.current.streams.values()
        qtbot.waitUntil(lambda: len(stream.texts[0]) > 20, timeout=TURN_TIMEOUT_MS)
        with qtbot.waitSignal(window.controller.turnFinished, timeout=10000):
            window.conversation.stop_button.click()
        stopped = store.get_message(stream.message_ids[0])
        assert stopped.metrics["finish_reason"] == "abort"
        assert stopped.content.startswith(stream.texts[0][:20])
        qtbot.waitUntil(lambda: _used_blocks(port) == 0, timeout=30000)

        # The server dies mid-reply: a clear error, the chat keeps the partial text.
        window.conversation.composer.setPlainText(LONG + " Make it longer still.")
        window.conversation.send_button.click()
        [stream] = window.controller.current.streams.values()
        qtbot.waitUntil(lambda: len(stream.texts[0]) > 20, timeout=TURN_TIMEOUT_MS)
        seen = stream.texts[0]
        proc.kill()
        proc.wait(10)
        qtbot.waitUntil(lambda: errors != [], timeout=60000)
        [(title, text)] = errors
        assert title == "The reply failed"
        assert f"The server at http://127.0.0.1:{port}/v1 could not be reached" in text
        assert "Your chat is saved" in text
        cut = store.get_message(stream.message_ids[0])
        assert cut.status == "interrupted" and cut.content.startswith(seen)
        assert window.conversation.rows()[-1].text() == cut.content
        assert not window.controller.generating
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        window.vram_panel.timer.stop()
        bridge.shutdown()
        store.close()
        log.close()
