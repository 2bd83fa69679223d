"""The one error dialog of the app.

It lives in its own module, below both the main window and the model manager, so that
neither has to import the other to report an error. Callers look it up as a module
attribute (`error_dialog.show_error(...)`), never with `from ... import show_error`: a test
then replaces it in one place and catches every error the app would show.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from desktop_app.widgets import message_box


def show_error(parent: QWidget | None, title: str, text: str) -> QMessageBox:
    """Every error dialog goes through here (tests monkeypatch it). Window-modal but
    opened with open(), so the event loop, and any stream in flight, keep running. It
    carries the app's warning icon (widgets.message_box), not the style's stock one."""
    box = message_box.message_box(parent, message_box.WARNING, title, text)
    box.setObjectName("errorDialog")
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.setWindowModality(Qt.WindowModality.WindowModal)
    box.open()
    return box
