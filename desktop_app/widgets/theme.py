"""Light and dark looks that follow the system palette, the style sheet, and themed icons.

The app uses the Fusion style everywhere so that the palette we pick is the palette the
user sees, whatever the platform's native style would do. The user's choice in Settings
(AppSettings.theme: "system", "light" or "dark", see set_preference) wins; with "system",
`FOLIO_THEME=light|dark` forces a look (screenshots, tests), and otherwise the system's
color scheme decides and a change of it at run time re-applies the theme.

Icons and the desktop entry are package data, `desktop_app/assets/`, read through
importlib.resources, so an installed wheel finds them as well as a source checkout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from PySide6.QtCore import QByteArray, QRectF, QSize, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QGuiApplication,
    QIcon,
    QPainter,
    QPalette,
    QPixmap,
)
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

from desktop_app.data.settings import THEMES

# desktop_app/assets/, wherever the package is installed (package data in pyproject.toml).
ASSETS: Traversable = resources.files("desktop_app").joinpath("assets")
# The same as a path on disk (a wheel or checkout installs the package as plain files).
ASSETS_DIR = Path(str(ASSETS))
# The color our SVGs are drawn in; icon() swaps it for the palette's text color.
_SVG_INK = "#1f2430"
_ICON_SIZES = (16, 20, 24, 32, 48, 64)


@dataclass(slots=True, frozen=True)
class Colors:
    dark: bool
    window: str
    base: str
    surface: str  # sidebar, panels
    text: str
    muted: str
    border: str
    accent: str
    accent_text: str
    user_bubble: str
    assistant_bubble: str
    code_bg: str
    error: str
    # Block map states: free, cached (free but holding a reusable prefix), used, shared.
    block_free: str
    block_cached: str
    block_used: str
    block_shared: str


LIGHT = Colors(
    dark=False, window="#f6f7f9", base="#ffffff", surface="#eef0f4", text="#1f2430",
    muted="#667085", border="#d5d9e0", accent="#3b6fd8", accent_text="#ffffff",
    user_bubble="#e4ecfb", assistant_bubble="#ffffff", code_bg="#f0f2f5", error="#c2372f",
    block_free="#e3e6eb", block_cached="#9cc3f0", block_used="#3b6fd8", block_shared="#e08a2c",
)
DARK = Colors(
    dark=True, window="#1c1f26", base="#23272f", surface="#191b21", text="#e6e8ee",
    muted="#9aa3b2", border="#353a45", accent="#6b9bf2", accent_text="#0e1320",
    user_bubble="#2c3950", assistant_bubble="#262a33", code_bg="#161920", error="#ef6b63",
    block_free="#30353f", block_cached="#3f5f8c", block_used="#6b9bf2", block_shared="#f0a04b",
)

_current: Colors = LIGHT
_preference = "system"


def current() -> Colors:
    """The colors in use now (light until apply_theme has run)."""
    return _current


def set_preference(choice: str) -> None:
    """The user's theme: "system" (FOLIO_THEME, else the desktop), "light" or "dark".
    apply_theme uses it from then on."""
    global _preference
    if choice not in THEMES:
        raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {choice!r}")
    _preference = choice


def preference() -> str:
    return _preference


def wants_dark() -> bool:
    """Dark or light, from the user's choice, else FOLIO_THEME, else the system."""
    if _preference != "system":
        return _preference == "dark"
    return system_prefers_dark()


def system_prefers_dark() -> bool:
    forced = os.environ.get("FOLIO_THEME", "").strip().lower()
    if forced in ("dark", "light"):
        return forced == "dark"
    hints = QGuiApplication.styleHints()
    scheme = hints.colorScheme()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    # Unknown scheme (some desktops, offscreen): judge by the platform palette.
    return QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128


def palette_for(colors: Colors) -> QPalette:
    pal = QPalette()
    role = QPalette.ColorRole
    pairs = {
        role.Window: colors.window, role.WindowText: colors.text, role.Base: colors.base,
        role.AlternateBase: colors.surface, role.Text: colors.text, role.Button: colors.base,
        role.ButtonText: colors.text, role.Highlight: colors.accent,
        role.HighlightedText: colors.accent_text, role.ToolTipBase: colors.base,
        role.ToolTipText: colors.text, role.PlaceholderText: colors.muted,
        role.Link: colors.accent, role.Mid: colors.border, role.Dark: colors.border,
        role.Light: colors.base, role.Midlight: colors.surface,
    }
    for r, c in pairs.items():
        pal.setColor(r, QColor(c))
    disabled = QColor(colors.muted)
    for r in (role.Text, role.WindowText, role.ButtonText):
        pal.setColor(QPalette.ColorGroup.Disabled, r, disabled)
    return pal


def style_sheet(c: Colors) -> str:
    return f"""
QToolBar {{ background: {c.window}; border: none; border-bottom: 1px solid {c.border};
    spacing: 6px; padding: 4px 8px; }}
QToolButton {{ border: none; border-radius: 6px; padding: 4px 6px; }}
QToolButton:hover {{ background: {c.surface}; }}
QToolButton:checked {{ background: {c.user_bubble}; }}
#sidebar {{ background: {c.surface}; border-right: 1px solid {c.border}; }}
#chatList {{ background: transparent; border: none; outline: none; }}
#chatList::item {{ padding: 7px 8px; border-radius: 6px; margin: 1px 4px; }}
#chatList::item:selected {{ background: {c.user_bubble}; color: {c.text}; }}
#chatList::item:hover:!selected {{ background: {c.border}; }}
#chatSearch, #composer {{ background: {c.base}; border: 1px solid {c.border};
    border-radius: 8px; padding: 6px 8px; }}
#composer:focus, #chatSearch:focus {{ border: 1px solid {c.accent}; }}
#messageBubble[role="user"] {{ background: {c.user_bubble}; border-radius: 10px; }}
#messageBubble[role="assistant"] {{ background: {c.assistant_bubble};
    border: 1px solid {c.border}; border-radius: 10px; }}
#messageBubble[role="system"] {{ background: transparent; border: 1px dashed {c.border};
    border-radius: 10px; }}
#candidateColumn {{ background: {c.assistant_bubble}; border: 1px solid {c.border};
    border-radius: 10px; }}
#roleLabel {{ color: {c.muted}; font-weight: 600; }}
#promptProgress {{ color: {c.muted}; font-style: italic; }}
#metricsLabel, #mutedLabel, #branchLabel {{ color: {c.muted}; }}
#conversationArea {{ background: {c.window}; border: none; }}
#conversationArea > QWidget > QWidget {{ background: {c.window}; }}
#pasteChip, #pastedBlock, #attachmentChip {{ background: {c.surface}; border: 1px solid {c.border};
    border-radius: 8px; }}
#pastedText {{ padding: 4px 8px; }}
#composerNote {{ color: {c.muted}; }}
QPushButton#examplePrompt {{ background: {c.base}; border: 1px solid {c.border};
    border-radius: 8px; padding: 7px 14px; }}
QPushButton#examplePrompt:hover {{ border: 1px solid {c.accent}; }}
QPushButton#sendButton, QPushButton#keepButton {{ background: {c.accent}; color: {c.accent_text};
    border: none; border-radius: 8px; padding: 6px 14px; font-weight: 600; }}
QPushButton#sendButton:disabled, QPushButton#keepButton:disabled {{ background: {c.border};
    color: {c.muted}; }}
QPushButton#stopButton {{ background: {c.error}; color: #ffffff; border: none;
    border-radius: 8px; padding: 6px 14px; font-weight: 600; }}
QPushButton#flatButton, QToolButton#flatButton {{ background: transparent; border: none;
    color: {c.muted}; padding: 2px 6px; }}
QPushButton#flatButton:hover, QToolButton#flatButton:hover {{ color: {c.text};
    background: {c.surface}; border-radius: 5px; }}
#vramPanel {{ background: {c.surface}; }}
#vramSection {{ color: {c.muted}; font-weight: 600; padding-top: 6px; }}
QDockWidget::title {{ padding: 6px; background: {c.surface}; }}
QProgressBar {{ border: 1px solid {c.border}; border-radius: 4px; background: {c.base};
    text-align: center; max-height: 14px; }}
QProgressBar::chunk {{ background: {c.accent}; border-radius: 3px; }}
QSplitter::handle {{ background: {c.border}; }}
QScrollBar:vertical {{ background: transparent; width: 10px; margin: 0; }}
QScrollBar:horizontal {{ background: transparent; height: 10px; margin: 0; }}
QScrollBar::handle {{ background: {c.border}; border-radius: 3px; margin: 2px; }}
QScrollBar::handle:vertical {{ min-height: 28px; }}
QScrollBar::handle:horizontal {{ min-width: 28px; }}
QScrollBar::handle:hover {{ background: {c.muted}; }}
QScrollBar::add-line, QScrollBar::sub-line {{ width: 0; height: 0; }}
QScrollBar::add-page, QScrollBar::sub-page {{ background: none; }}
"""


def apply_theme(app: QApplication | None = None, choice: str | None = None) -> Colors:
    """Set style, palette and style sheet; returns the colors. choice (optional) is first
    stored with set_preference; see wants_dark for what decides."""
    global _current
    app = app or QApplication.instance()
    if app is None:
        raise RuntimeError("apply_theme needs a QApplication")
    if choice is not None:
        set_preference(choice)
    app.setStyle("Fusion")
    _current = DARK if wants_dark() else LIGHT
    app.setPalette(palette_for(_current))
    app.setStyleSheet(style_sheet(_current))
    _icon_cache.clear()
    return _current


def follow_system_scheme(app: QApplication, on_change=None) -> None:
    """Re-apply the theme when the desktop switches between light and dark."""

    def changed(_scheme) -> None:
        apply_theme(app)
        if on_change is not None:
            on_change()

    app.styleHints().colorSchemeChanged.connect(changed)


def monospace_font(point_size: float | None = None) -> QFont:
    font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    if point_size is not None:
        font.setPointSizeF(point_size)
    return font


_icon_cache: dict[tuple[str, str], QIcon] = {}


def icon(name: str, color: str | None = None) -> QIcon:
    """A themed icon from desktop_app/assets/<name>.svg, drawn in `color` (default: the
    text color)."""
    ink = color or _current.text
    key = (name, ink)
    cached = _icon_cache.get(key)
    if cached is not None:
        return cached
    svg = asset_text(f"{name}.svg", f"no icon named {name!r}").replace(_SVG_INK, ink)
    renderer = QSvgRenderer(QByteArray(svg.encode("utf-8")))
    result = QIcon()
    for size in _ICON_SIZES:
        result.addPixmap(_render(renderer, size))
    _icon_cache[key] = result
    return result


def app_icon() -> QIcon:
    """The application icon, in its own colors."""
    renderer = QSvgRenderer(QByteArray(asset_text("folio.svg").encode("utf-8")))
    result = QIcon()
    for size in (*_ICON_SIZES, 128, 256):
        result.addPixmap(_render(renderer, size))
    return result


def asset_text(filename: str, missing: str | None = None) -> str:
    """The text of desktop_app/assets/<filename>; FileNotFoundError names the folder."""
    item = ASSETS.joinpath(filename)
    if not item.is_file():
        raise FileNotFoundError(f"{missing or f'no asset {filename!r}'} in {ASSETS}")
    return item.read_text(encoding="utf-8")


def icon_names() -> list[str]:
    """Every icon the assets hold (the app icon included), sorted."""
    return sorted(item.name[:-4] for item in ASSETS.iterdir() if item.name.endswith(".svg"))


def check_assets() -> list[tuple[str, str, bool]]:
    """(name, where it was read from, whether it rendered) for every icon: what
    `folio-app --check-assets` prints."""
    out = []
    for name in icon_names():
        renderer = QSvgRenderer(QByteArray(asset_text(f"{name}.svg").encode("utf-8")))
        image = _render(renderer, 24).toImage()
        inked = renderer.isValid() and any(image.pixelColor(x, y).alpha() > 0
                                           for x in range(24) for y in range(24))
        out.append((name, str(ASSETS.joinpath(f"{name}.svg")), inked))
    return out


def _render(renderer: QSvgRenderer, size: int) -> QPixmap:
    pixmap = QPixmap(QSize(size, size))
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    return pixmap
