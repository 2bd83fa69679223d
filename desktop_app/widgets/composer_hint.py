"""The short line above the composer that answers a send Folio refuses ("Type a message
first"), instead of the Enter that did nothing. It goes away when the user types, or after
a few seconds."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QWidget

HINT_SHOWN_MS = 4000


class ComposerHint(QLabel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composerHint")
        self.setAccessibleName("Composer hint")
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(HINT_SHOWN_MS)
        self._timer.timeout.connect(self.dismiss)
        self.setVisible(False)

    def show_hint(self, text: str) -> None:
        self.setText(text)
        self.setVisible(True)
        self._timer.start()

    def dismiss(self) -> None:
        self._timer.stop()
        self.setVisible(False)
