"""Light/dark looks, themed icons and the assets they come from."""

from __future__ import annotations

from pathlib import Path

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
    entry = theme.asset_text("folio.desktop")
    assert "Exec=folio-app" in entry.splitlines()
    assert "Icon=folio" in entry.splitlines()


def test_assets_are_package_data_read_through_importlib_resources(qapp):
    import desktop_app

    assert theme.ASSETS_DIR == Path(desktop_app.__file__).parent / "assets"
    assert set(ICONS) | {"folio"} <= set(theme.icon_names())
    checked = theme.check_assets()
    assert [name for name, _, _ in checked] == theme.icon_names()
    assert all(ok and Path(where).is_file() for _, where, ok in checked)


@pytest.mark.parametrize("choice, env, expected", [
    ("dark", "light", theme.DARK), ("light", "dark", theme.LIGHT),
    ("system", "dark", theme.DARK), ("system", "light", theme.LIGHT)])
def test_the_users_choice_wins_over_folio_theme(qapp, monkeypatch, choice, env, expected):
    monkeypatch.setenv("FOLIO_THEME", env)
    try:
        assert theme.apply_theme(qapp, choice) is expected
        assert theme.preference() == choice
    finally:
        monkeypatch.setenv("FOLIO_THEME", "light")
        theme.apply_theme(qapp, "system")
    with pytest.raises(ValueError, match="theme must be one of system, light, dark"):
        theme.set_preference("blue")
