"""The chat template choice in the real models dialog: a GGUF without a template shows its
family's format in the list; a pasted template that fails to render is refused with its
error and nothing is kept; ChatML is kept for that model, persisted, and shown."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QLabel, QPlainTextEdit, QPushButton

from desktop_app.data.model_templates import CHATML, PASTED
from desktop_app.data.settings import AppSettings
from desktop_app.dialogs.model_manager import COLUMNS, ModelManagerDialog, source_for
from engine.config import EngineConfig
from tests.engine.text.test_turn_formats import write_without_template

TEMPLATE_COLUMN = COLUMNS.index("Chat template")


@pytest.fixture
def dialog(qtbot, fake_bridge, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    fake_bridge.engine_config = EngineConfig(max_model_len=2048)
    path = write_without_template(tmp_path / "gemma3-no-template.gguf", "gemma3")
    settings = AppSettings(model_paths=[str(path)])
    saved = []
    dlg = ModelManagerDialog(fake_bridge, settings, saved.append)
    dlg.saved, dlg.gguf = saved, str(path)
    qtbot.addWidget(dlg)
    return dlg


def _template_cells(dlg) -> dict[str, str]:
    return {source_for(info): dlg.table.item(row, TEMPLATE_COLUMN).text()
            for row, info in enumerate(dlg.infos)}


def test_the_list_says_which_template_each_model_runs(dialog):
    cells = _template_cells(dialog)
    assert cells[dialog.gguf] == "Gemma (the file has none)"
    assert cells["starter"] == "the file's"


def test_a_failing_template_is_refused_then_chatml_is_kept(dialog, qtbot):
    dialog.select_source(dialog.gguf)
    qtbot.mouseClick(dialog.findChild(QPushButton, "templateButton"),
                     Qt.MouseButton.LeftButton)
    settings_dialog = dialog.template_dialog
    qtbot.waitUntil(settings_dialog.isVisible)
    choice = settings_dialog.findChild(QComboBox, "templateChoice")
    text = settings_dialog.findChild(QPlainTextEdit, "templateText")
    error = settings_dialog.findChild(QLabel, "templateError")
    save = settings_dialog.findChild(QPushButton, "templateSave")

    choice.setCurrentIndex(choice.findData(PASTED))
    assert text.isEnabled()
    text.setPlainText("{% for m in messages %}{{ m.content }}")
    save.click()
    assert settings_dialog.isVisible()  # refused: the dialog stays, showing why
    assert "chat_template:" in error.text() and "endfor" in error.text()
    assert dialog.saved == [] and dialog.settings.model_templates == {}

    choice.setCurrentIndex(choice.findData(CHATML))
    assert not text.isEnabled()
    save.click()
    qtbot.waitUntil(lambda: not settings_dialog.isVisible())
    assert dialog.settings.model_templates[dialog.gguf].kind == CHATML
    assert dialog.saved == [dialog.settings]
    assert _template_cells(dialog)[dialog.gguf] == "ChatML (chosen)"


def test_a_gpt_oss_file_without_a_template_says_it_runs_harmony(tmp_path):
    from desktop_app.dialogs.model_rows import template_cell
    from engine.loaders.catalog import model_info
    from tests.engine.harmony_gguf import write_harmony_gguf

    info = model_info(write_harmony_gguf(tmp_path / "gpt-oss.gguf"))
    assert template_cell(info, None) == "Harmony (the file has none)"
