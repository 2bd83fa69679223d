"""Light/dark looks, themed icons and the assets they come from."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QPalette

from desktop_app.widgets import theme

ICONS = ("new-chat", "settings", "send", "stop", "regenerate", "copy", "keep", "delete",
         "rename", "search", "memory", "model", "download", "folder", "file", "edit",
         "chevron-left", "chevron-right")


@pytest.mark.parametrize("forced, expected", [("dark", theme.DARK), ("light", theme.LIGHT)])
def test_forced_scheme_sets_palette_and_colors(qapp, monkeypatch, forced, expected):
    monkeypatch.setenv("FOLIO_THEME", forced)
    try:
        assert theme.apply_theme(qapp) is expected
        assert theme.current() is expected
        window = qapp.palette().color(QPalette.ColorRole.Window).name()
        assert window == expected.window
        assert f"background: {expected.accent}" in qapp.styleSheet()
    finally:
        monkeypatch.setenv("FOLIO_THEME", "light")
        theme.apply_theme(qapp)


@pytest.mark.parametrize("name", ICONS)
def test_every_icon_renders(qapp, name):
    icon = theme.icon(name, "#ff0000")
    pixmap = icon.pixmap(24, 24)
    assert not pixmap.isNull()
    image = pixmap.toImage()
    inked = {image.pixelColor(x, y).name() for x in range(24) for y in range(24)
             if image.pixelColor(x, y).alpha() == 255}
    assert inked == {"#ff0000"}  # the placeholder ink was replaced by the asked color


def test_unknown_icon_raises(qapp):
    with pytest.raises(FileNotFoundError, match="no icon named 'nope'"):
        theme.icon("nope")


def test_app_icon_and_desktop_entry_exist(qapp):
    assert not theme.app_icon().pixmap(64, 64).isNull()
    entry = (theme.ASSETS_DIR.parent / "packaging" / "folio.desktop").read_text()
    assert "Exec=folio-app" in entry.splitlines()
