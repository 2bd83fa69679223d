"""The settings dialog edits a chat's settings and the defaults for new chats."""

from __future__ import annotations

import pytest

from desktop_app.data.settings import ChatSettings
from desktop_app.dialogs.settings_dialog import NO_LIMIT, ChatSettingsForm, SettingsDialog

CUSTOM = ChatSettings(system_prompt="Be brief.", temperature=0.35, top_p=0.8, top_k=12,
                      min_p=0.1, repetition_penalty=1.25, max_tokens=77, seed=42,
                      num_candidates=3)


def test_form_round_trips_every_field(qtbot):
    form = ChatSettingsForm(CUSTOM)
    qtbot.addWidget(form)
    assert form.settings() == CUSTOM
    form.fixed_seed.setChecked(False)
    assert not form.seed.isEnabled()
    assert form.settings().seed is None


def test_dialog_returns_both_settings(qtbot):
    dialog = SettingsDialog(CUSTOM, ChatSettings())
    qtbot.addWidget(dialog)
    assert [dialog.tabs.tabText(i) for i in range(2)] == ["This chat", "Defaults for new chats"]
    dialog.chat_form.temperature.setValue(1.5)
    dialog.defaults_form.max_tokens.setValue(64)
    dialog.accept()
    assert dialog.result_chat.temperature == 1.5
    assert dialog.result_chat.system_prompt == "Be brief."
    assert dialog.result_defaults == ChatSettings(max_tokens=64)


def test_max_tokens_offers_up_to_the_context(qtbot):
    form = ChatSettingsForm(ChatSettings())
    qtbot.addWidget(form)
    assert form.max_tokens.value() == 0 and form.max_tokens.text() == NO_LIMIT
    form.max_tokens.setValue(300)
    assert form.settings().max_tokens == 300
    form.max_tokens.setValue(0)
    assert form.settings().max_tokens is None
    form.set_settings(ChatSettings(max_tokens=77))
    assert form.max_tokens.text() == "77"


def test_dialog_without_chat_has_only_defaults(qtbot):
    dialog = SettingsDialog(None, CUSTOM)
    qtbot.addWidget(dialog)
    assert [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())] == [
        "Defaults for new chats", "Serving"]
    assert dialog.chat_form is None
    dialog.accept()
    assert dialog.result_chat is None and dialog.result_defaults == CUSTOM


def test_bad_value_keeps_dialog_open_and_names_field(qtbot, monkeypatch):
    dialog = SettingsDialog(CUSTOM, ChatSettings())
    qtbot.addWidget(dialog)

    def bad():
        raise ValueError("ChatSettings.top_p must be a number in (0, 1], got 0")

    monkeypatch.setattr(dialog.chat_form, "settings", bad)
    dialog.accept()
    assert dialog.result_chat is None
    assert dialog.error_label.text() == "ChatSettings.top_p must be a number in (0, 1], got 0"


@pytest.mark.parametrize("value", [0.0, 5.0])
def test_spin_box_ranges_match_the_validation(qtbot, value):
    form = ChatSettingsForm(ChatSettings())
    qtbot.addWidget(form)
    form.temperature.setValue(value)
    assert form.settings().temperature == value
    form.temperature.setValue(9.0)  # clamped by the box to the valid range
    assert form.settings().temperature == 5.0


def test_serving_tab_returns_the_switch_and_port(qtbot):
    from PySide6.QtWidgets import QCheckBox, QSpinBox

    dialog = SettingsDialog(None, ChatSettings(), serve=(False, 8000))
    qtbot.addWidget(dialog)
    assert dialog.tabs.tabText(dialog.tabs.count() - 1) == "Serving"
    switch = dialog.findChild(QCheckBox, "serveSetting")
    port = dialog.findChild(QSpinBox, "servePort")
    assert not switch.isChecked() and port.value() == 8000
    assert switch.text() == "Serve the loaded model on localhost:8000"
    assert switch.accessibleName() and port.accessibleName()
    port.setValue(8123)
    assert switch.text() == "Serve the loaded model on localhost:8123"
    switch.setChecked(True)
    dialog.accept()
    assert dialog.result_serve == (True, 8123)
