"""Message boxes with Folio's own icons.

QMessageBox's standard icons are the style's stock pixmaps (Fusion's dated bitmaps on
Linux, whatever the platform style draws elsewhere); these boxes carry the app's SVG icons
instead, tinted for the theme like every other icon, and the app's window icon."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QWidget

from desktop_app.widgets import theme

ICON_PX = 40
WARNING, INFO, QUESTION = "warning", "info", "question"
_ASSET = {WARNING: "warning", INFO: "info", QUESTION: "help"}


def kind_color(kind: str) -> str:
    c = theme.current()
    return c.error if kind == WARNING else c.accent


def message_box(parent: QWidget | None, kind: str, title: str, text: str,
                buttons: QMessageBox.StandardButton = QMessageBox.StandardButton.Ok
                ) -> QMessageBox:
    """A box of `kind` (WARNING, INFO, QUESTION), not shown yet."""
    if kind not in _ASSET:
        raise ValueError(f"kind must be one of {', '.join(_ASSET)}, got {kind!r}")
    box = QMessageBox(parent)
    box.setWindowTitle(title)
    box.setText(text)
    box.setStandardButtons(buttons)
    box.setIconPixmap(theme.icon(_ASSET[kind], kind_color(kind)).pixmap(ICON_PX, ICON_PX))
    box.setWindowIcon(theme.app_icon())
    box.setProperty("folioIcon", kind)
    return box


def ask(parent: QWidget | None, title: str, text: str) -> bool:
    """Yes / No, No by default; True for Yes."""
    yes, no = QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.No
    box = message_box(parent, QUESTION, title, text, yes | no)
    box.setDefaultButton(no)
    return box.exec() == yes
