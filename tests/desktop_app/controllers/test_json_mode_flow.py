"""A chat's "Answer in JSON" through the real window: the button opens the dialog, a schema
pasted or read from a file is kept per chat, a schema the engine cannot enforce is refused
in the dialog (nothing lost), replies say they were JSON; and the starter's reply is JSON
valid against the schema."""

from __future__ import annotations

import json

import jsonschema
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from desktop_app.widgets.json_mode import JsonModeDialog

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
          "required": ["answer"]}


def send(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=60000):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)


def open_dialog(qtbot, window) -> JsonModeDialog:
    button = window.findChild(type(window.conversation.json_button), "jsonModeButton")
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    dialog = window.json_mode.dialog
    assert dialog is not None and dialog.objectName() == "jsonModeDialog"
    return dialog


def press(dialog, which) -> None:
    dialog.findChild(QDialogButtonBox).button(which).click()


def json_on(qtbot, window, schema: str) -> None:
    """A chat with one turn, then its JSON mode turned on with ``schema``."""
    send(qtbot, window, "hello")
    dialog = open_dialog(qtbot, window)
    dialog.check.setChecked(True)
    dialog.schema_edit.setPlainText(schema)
    press(dialog, QDialogButtonBox.StandardButton.Ok)


def settings_of(window):
    return window.store.get_chat(window.controller.chat_id).settings


def test_a_schema_set_in_the_dialog_constrains_the_chat_s_replies(qtbot, fake_bridge,
                                                                   make_window, tmp_path):
    window = make_window(fake_bridge)
    send(qtbot, window, "first")  # a chat to set it on
    dialog = open_dialog(qtbot, window)
    dialog.findChild(type(dialog.check), "jsonModeCheck").setChecked(True)
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(SCHEMA))
    assert dialog.load_file(path)
    assert json.loads(dialog.findChild(type(dialog.schema_edit),
                                       "jsonSchemaEdit").toPlainText()) == SCHEMA
    press(dialog, QDialogButtonBox.StandardButton.Ok)
    assert settings_of(window).json_mode and json.loads(settings_of(window).json_schema) == SCHEMA
    assert window.conversation.json_button.isChecked()
    send(qtbot, window, "second")
    _, params = fake_bridge.fake_workers[0].submitted[-1]
    assert params.response_format.type == "json_schema"
    assert params.response_format.schema == SCHEMA
    reply = window.conversation.rows()[-1]
    assert reply.metrics_label.text().startswith("JSON (schema) · ")
    first = window.conversation.rows()[1]
    assert not first.metrics_label.text().startswith("JSON")
    leaf = window.store.get_message(window.store.active_leaf(window.controller.chat_id))
    assert leaf.metrics["response_format"] == "json_schema"


def test_a_schema_the_engine_cannot_enforce_is_refused_in_the_dialog(qtbot, fake_bridge,
                                                                     make_window):
    window = make_window(fake_bridge)
    send(qtbot, window, "hello")
    dialog = open_dialog(qtbot, window)
    dialog.check.setChecked(True)
    bad = '{"type": "array", "uniqueItems": true}'
    dialog.schema_edit.setPlainText(bad)
    press(dialog, QDialogButtonBox.StandardButton.Ok)
    assert dialog.isVisible()  # still open, the text kept
    error = dialog.findChild(type(dialog.error_label), "jsonModeError")
    assert error.isVisible() and "uniqueItems" in error.text()
    assert dialog.schema_edit.toPlainText() == bad
    assert not dialog.load_file("/nonexistent/schema.json")
    press(dialog, QDialogButtonBox.StandardButton.Cancel)
    assert not settings_of(window).json_mode
    assert not window.conversation.json_button.isChecked()


def test_json_mode_without_a_schema_asks_for_any_object(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    json_on(qtbot, window, "")
    send(qtbot, window, "again")
    _, params = fake_bridge.fake_workers[0].submitted[-1]
    assert params.response_format.type == "json_object"
    assert window.conversation.rows()[-1].metrics_label.text().startswith("JSON · ")


def test_the_starter_answers_in_json_valid_against_the_schema(qtbot, small_bridge,
                                                               make_window):
    window = make_window(small_bridge)
    json_on(qtbot, window, json.dumps(SCHEMA))
    send(qtbot, window, "Is grass green? Answer yes or no.")
    reply = window.store.get_message(window.store.active_leaf(window.controller.chat_id))
    jsonschema.validate(json.loads(reply.content), SCHEMA)
    assert reply.metrics["finish_reason"] == "stop"
