"""Settings ▸ Theme: System / Light / Dark, applied at once and kept in the settings."""

from __future__ import annotations

import json

import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QComboBox

from desktop_app.data.settings import AppSettings, ChatSettings, load_settings, settings_path
from desktop_app.dialogs.settings_dialog import SettingsDialog
from desktop_app.widgets import theme


@pytest.fixture(autouse=True)
def back_to_system(qapp):
    yield
    theme.apply_theme(qapp, "system")


def test_dialog_offers_the_three_themes(qtbot):
    dialog = SettingsDialog(None, ChatSettings(), theme="light")
    qtbot.addWidget(dialog)
    combo = dialog.findChild(QComboBox, "themeSetting")
    assert [combo.itemText(i) for i in range(combo.count())] == ["System", "Light", "Dark"]
    assert combo.currentData() == "light"
    combo.setCurrentIndex(combo.findData("dark"))
    dialog.accept()
    assert dialog.result_theme == "dark"


def test_choosing_dark_applies_at_once_and_persists(qtbot, qapp, make_window, fake_bridge):
    window = make_window(fake_bridge)
    assert theme.current() is theme.LIGHT  # FOLIO_THEME=light in the tests
    dialog = window.open_settings()
    combo = dialog.findChild(QComboBox, "themeSetting")
    assert combo.currentData() == "system"
    combo.setCurrentIndex(combo.findData("dark"))
    dialog.accept()
    assert theme.current() is theme.DARK
    assert qapp.palette().color(QPalette.ColorRole.Window).name() == theme.DARK.window
    assert f"background: {theme.DARK.accent}" in qapp.styleSheet()
    assert window.settings.theme == "dark"
    assert load_settings().theme == "dark"
    assert json.loads(settings_path().read_text())["theme"] == "dark"

    # Back to System: FOLIO_THEME (light) decides again.
    dialog = window.open_settings()
    combo = dialog.findChild(QComboBox, "themeSetting")
    assert combo.currentData() == "dark"
    combo.setCurrentIndex(combo.findData("system"))
    dialog.accept()
    assert theme.current() is theme.LIGHT
    assert load_settings().theme == "system"


def test_saved_theme_is_applied_at_startup_and_a_bad_one_ignored(qapp, folio_dirs):
    from desktop_app.__main__ import create_app
    from desktop_app.data.settings import save_settings

    save_settings(AppSettings(theme="dark"))
    assert create_app(theme_choice=load_settings().theme) is qapp
    assert theme.current() is theme.DARK
    settings_path().write_text(json.dumps({"theme": "purple", "serve_port": 9000}))
    loaded = load_settings()
    assert (loaded.theme, loaded.serve_port) == ("system", 9000)
