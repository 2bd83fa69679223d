""""Add a server…": connect, pick a model, add it; errors say why and save nothing."""

from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QCheckBox, QComboBox, QLabel, QLineEdit, QPushButton

from desktop_app.data.settings import AppSettings, load_settings, save_settings, settings_path
from desktop_app.dialogs.model_manager import COLUMNS, ModelManagerDialog, source_for
from desktop_app.dialogs.server_dialog import AddServerDialog
from engine.serve.server import free_port
from tests.desktop_app.services.openai_stub import StubServer


@pytest.fixture
def stub():
    server = StubServer(api_key="sk-test-key")
    yield server
    server.stop()


@pytest.fixture
def manager(qtbot, fake_bridge, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    settings = AppSettings()
    dlg = ModelManagerDialog(fake_bridge, settings, save_settings)
    qtbot.addWidget(dlg)
    return dlg


def connect(qtbot, dialog, url: str, key: str = "") -> None:
    dialog.findChild(QLineEdit, "serverUrl").setText(url)
    dialog.findChild(QLineEdit, "serverKey").setText(key)
    dialog.findChild(QPushButton, "connectServer").click()
    qtbot.waitUntil(lambda: not dialog.connecting, timeout=20000)


def test_widgets_have_names(qtbot):
    dialog = AddServerDialog()
    qtbot.addWidget(dialog)
    for cls, name in ((QLineEdit, "serverUrl"), (QLineEdit, "serverKey"),
                      (QCheckBox, "rememberKey"), (QPushButton, "connectServer"),
                      (QComboBox, "serverModel"), (QLabel, "serverStatus")):
        widget = dialog.findChild(cls, name)
        assert widget is not None, name
    assert dialog.findChild(QLineEdit, "serverKey").echoMode() == QLineEdit.EchoMode.Password
    assert not dialog.add_button.isEnabled()


def test_a_server_that_is_down_says_so_and_saves_nothing(qtbot, manager):
    manager.findChild(QPushButton, "addServerButton").click()
    dialog = manager.server_dialog
    url = f"http://127.0.0.1:{free_port()}/v1"
    connect(qtbot, dialog, url)
    status = dialog.findChild(QLabel, "serverStatus").text()
    assert status.startswith(f"⚠ The server at {url} could not be reached")
    assert status.endswith("Nothing was saved.")
    assert not dialog.add_button.isEnabled()
    dialog.accept()  # nothing to add: stays open, saves nothing
    assert dialog.entry is None and manager.settings.servers == []
    assert not settings_path().exists()
    connect(qtbot, dialog, "ftp://somewhere")
    assert "is not an http(s) URL" in dialog.status.text()


def test_a_wrong_key_is_explained(qtbot, stub):
    dialog = AddServerDialog()
    qtbot.addWidget(dialog)
    connect(qtbot, dialog, stub.url, "nope")
    assert "answered 401: invalid API key. Check the API key." in dialog.status.text()


def test_adding_a_server_lists_it_and_keeps_the_key_in_memory_only(qtbot, manager, stub):
    manager.findChild(QPushButton, "addServerButton").click()
    dialog = manager.server_dialog
    connect(qtbot, dialog, stub.url.removesuffix("/v1"), "sk-test-key")  # /v1 is added
    box = dialog.findChild(QComboBox, "serverModel")
    assert [box.itemText(i) for i in range(box.count())] == ["stub-model (4096 tokens)"]
    assert dialog.status.text().startswith(f"Connected: {stub.url} serves 1 model.")
    assert dialog.add_button.isEnabled()
    dialog.add_button.click()
    [entry] = manager.settings.servers
    assert (entry.base_url, entry.model, entry.api_key, entry.max_model_len) == (
        stub.url, "stub-model", "", 4096)
    assert "sk-test-key" not in settings_path().read_text()
    assert manager.bridge._server_keys[entry.source] == "sk-test-key"
    row = manager.table.currentRow()
    cells = {name: manager.table.item(row, col).text() for col, name in enumerate(COLUMNS)}
    assert (cells["Name"], cells["Format"], cells["Architecture"], cells["Context"]) == (
        "stub-model", "remote", f"127.0.0.1:{stub.port}", "4096")
    assert source_for(manager.infos[row]) == entry.source
    with qtbot.waitSignal(manager.loadRequested) as requested:
        manager.load_button.click()
    assert requested.args == [entry.source]


def test_remember_the_key_keeps_it_in_the_settings(qtbot, manager, stub):
    manager.findChild(QPushButton, "addServerButton").click()
    dialog = manager.server_dialog
    connect(qtbot, dialog, stub.url, "sk-test-key")
    dialog.findChild(QCheckBox, "rememberKey").setChecked(True)
    dialog.add_button.click()
    data = json.loads(settings_path().read_text())
    assert data["servers"][0]["api_key"] == "sk-test-key"
    assert load_settings().servers[0].api_key == "sk-test-key"


def test_editing_the_url_after_connecting_forgets_the_models(qtbot, stub):
    dialog = AddServerDialog()
    qtbot.addWidget(dialog)
    connect(qtbot, dialog, stub.url, "sk-test-key")
    assert dialog.add_button.isEnabled()
    dialog.url_edit.textEdited.emit("http://elsewhere:8000/v1")
    assert not dialog.add_button.isEnabled() and dialog.model_box.count() == 0
