"""The overflow policy: a per-chat setting with an app-wide default, and its combo box."""

from __future__ import annotations

import json

import pytest

from desktop_app.data.context_policy import KEEP_LATEST, POLICIES, STOP, TRUNCATE_MIDDLE
from desktop_app.data.settings import AppSettings, ChatSettings, load_settings, save_settings
from desktop_app.dialogs.settings_dialog import SettingsDialog


def test_policy_is_validated_and_defaults_to_keep_latest(tmp_path):
    assert ChatSettings().overflow_policy == KEEP_LATEST
    with pytest.raises(ValueError, match="overflow_policy"):
        ChatSettings(overflow_policy="shrink")
    # An old settings file (no key) and a bad value both fall back to the default.
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"chat_defaults": {"overflow_policy": "shrink"}}))
    assert load_settings(path).chat_defaults.overflow_policy == KEEP_LATEST
    save_settings(AppSettings(chat_defaults=ChatSettings(overflow_policy=STOP)), path)
    assert load_settings(path).chat_defaults.overflow_policy == STOP
    assert ChatSettings.from_dict({"temperature": 0.5}).overflow_policy == KEEP_LATEST


def test_settings_dialog_edits_the_chat_policy_and_the_default(qtbot):
    dialog = SettingsDialog(ChatSettings(overflow_policy=TRUNCATE_MIDDLE),
                            ChatSettings())
    qtbot.addWidget(dialog)
    combo = dialog.chat_form.overflow_policy
    assert combo.objectName() == "overflowPolicy"
    assert [combo.itemData(i) for i in range(combo.count())] == list(POLICIES)
    assert combo.currentData() == TRUNCATE_MIDDLE
    assert combo.currentText() == "Truncate the middle"
    combo.setCurrentIndex(combo.findData(STOP))
    defaults = dialog.defaults_form.overflow_policy
    assert defaults.currentText() == "Keep the system prompt and the latest turns"
    defaults.setCurrentIndex(defaults.findData(TRUNCATE_MIDDLE))
    dialog.accept()
    assert dialog.result_chat.overflow_policy == STOP
    assert dialog.result_defaults.overflow_policy == TRUNCATE_MIDDLE


def test_a_stored_chat_keeps_its_policy(store):
    chat = store.create_chat("t", ChatSettings(overflow_policy=STOP))
    assert store.get_chat(chat.id).settings.overflow_policy == STOP
