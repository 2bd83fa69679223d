"""Parts every Folio dialog with OK / Cancel shares."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel


def error_label(object_name: str) -> QLabel:
    """The hidden, wrapping label where a dialog says what is wrong with its input."""
    label = QLabel("")
    label.setObjectName(object_name)
    label.setWordWrap(True)
    label.setVisible(False)
    return label


def ok_cancel(dialog: QDialog) -> QDialogButtonBox:
    """OK and Cancel, wired to the dialog's accept and reject."""
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                               | QDialogButtonBox.StandardButton.Cancel)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    return buttons
