"""File ▸ Quit (Ctrl+Q) and Help ▸ Documentation / About, through the real window on the
fake engine."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QDesktopServices, QKeySequence
from PySide6.QtWidgets import QMenu

from desktop_app.data.settings import load_settings
from desktop_app.dialogs import about_dialog
from desktop_app.services import sources
from desktop_app.window_menus import quit_keys


def test_ctrl_q_closes_the_window_through_close_event(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    assert load_settings().window_geometry == ""  # nothing saved before closing
    worker = fake_bridge.fake_workers[0]
    qtbot.keyClick(window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=2000)
    saved = load_settings()
    assert saved.window_geometry and saved.dock_state  # closeEvent persisted the layout
    assert not fake_bridge.is_loaded and worker._stop.is_set()  # the engine shut down


def test_quit_keys_always_include_ctrl_q():
    assert QKeySequence("Ctrl+Q") in quit_keys()


def test_quit_action_sits_in_the_file_menu(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    file_menu = window.menuBar().actions()[0].menu()
    assert window.menus.quit_action in file_menu.actions()
    assert QKeySequence("Ctrl+Q") in window.menus.quit_action.shortcuts()


def test_about_names_version_model_device_and_where_data_lives(qtbot, fake_bridge,
                                                                make_window, folio_dirs):
    window = make_window(fake_bridge)
    help_menu = window.menuBar().findChild(QMenu, "helpMenu")
    assert [a.text() for a in help_menu.actions()] == ["&Documentation", "&About Folio"]
    window.menus.about_action.trigger()
    dialog = window.findChild(about_dialog.AboutDialog, "aboutDialog")
    assert dialog is not None and dialog.isVisible()
    text = dialog.text.text()
    assert "Version</b>&nbsp;&nbsp;</td><td>0.1.0" in text
    assert sources.display_name(sources.STARTER) in text  # the fake bridge loaded "starter"
    assert "<td>cpu</td>" in text  # the worker's device
    assert str(folio_dirs[1]) in text  # settings
    assert str(folio_dirs[0] / "chats.sqlite3") in text  # the chats database
    dialog.close()


def test_about_without_a_model(qtbot, make_window):
    from desktop_app.services.engine_bridge import EngineBridge

    window = make_window(EngineBridge(llm_factory=lambda *a, **k: None))
    facts = about_dialog.about_facts(window.bridge, window.store)
    assert (facts.model, facts.device) == ("none loaded", "none (no model loaded)")


def test_documentation_opens_the_readme(qtbot, fake_bridge, make_window, monkeypatch):
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl",
                        staticmethod(lambda url: opened.append(url) or True))
    window = make_window(fake_bridge)
    window.menus.docs_action.trigger()
    [url] = opened
    path = Path(url.toLocalFile())
    assert path.name == "README.md" and path.read_text(encoding="utf-8").startswith("# Folio")


def test_installed_docs_come_from_the_package_description(tmp_path):
    path = about_dialog.docs_path(checkout=tmp_path / "no-checkout", folder=tmp_path / "cfg")
    assert path == tmp_path / "cfg" / "README.md"
    assert path.read_text(encoding="utf-8").startswith("# Folio")


def test_no_docs_tells_the_user(qtbot, fake_bridge, make_window, monkeypatch, captured_errors):
    monkeypatch.setattr(about_dialog, "docs_path", lambda: None)
    window = make_window(fake_bridge)
    window.menus.docs_action.trigger()
    assert [title for title, _ in captured_errors] == ["Documentation not found"]
