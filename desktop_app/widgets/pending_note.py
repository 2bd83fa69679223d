"""The line above the composer while a message waits for the model to load.

It says how far the load is ("Loading the model… 42%") with a "Don't send" button, or,
once a load failed, why the message was not sent (it stays in the composer).
controllers.pending_send drives it.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget


class PendingNote(QWidget):
    cancelRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("pendingNote")
        self.label = QLabel()
        self.label.setObjectName("pendingNoteText")
        self.label.setWordWrap(True)
        self.label.setAccessibleName("Message status")
        self.cancel_button = QPushButton("Don't send")
        self.cancel_button.setObjectName("cancelPendingButton")
        self.cancel_button.setToolTip("Keep the message in the composer instead of sending "
                                      "it when the model is ready (Esc)")
        self.cancel_button.clicked.connect(self.cancelRequested)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.cancel_button)
        self.clear()

    def text(self) -> str:
        return self.label.text()

    def show_waiting(self, text: str) -> None:
        """A message waits: `text` with the "Don't send" button."""
        self._show(text, waiting=True)

    def show_notice(self, text: str) -> None:
        """The message was not sent: `text` says why."""
        self._show(text, waiting=False)

    def clear(self) -> None:
        self.label.clear()
        self.setVisible(False)

    def _show(self, text: str, waiting: bool) -> None:
        self.label.setText(text)
        self.cancel_button.setVisible(waiting)
        self.setVisible(True)
