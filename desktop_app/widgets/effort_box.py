"""The composer's "Reasoning effort" choice: how long a reasoning model whose template
reads ``reasoning_effort`` (gpt-oss's harmony) thinks in this chat, or the template's own
default. desktop_app/controllers/thinking.py shows it for such a model and keeps the
choice with the chat."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QWidget

from engine.text.reasoning.options import REASONING_EFFORTS


class ReasoningEffortBox(QComboBox):
    """"Effort: default" (None: the template decides), then each level."""

    effortChosen = Signal(object)  # str | None, a choice the user made

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("reasoningEffortBox")
        self.setAccessibleName("Reasoning effort")
        self.setToolTip("Reasoning effort: how long the model thinks before it answers "
                        "(this chat)")
        self.addItem("Effort: default", None)
        for level in REASONING_EFFORTS:
            self.addItem(f"Effort: {level}", level)
        self.setVisible(False)
        self.activated.connect(lambda index: self.effortChosen.emit(self.itemData(index)))

    def effort(self) -> str | None:
        return self.currentData()

    def show_effort(self, effort: str | None) -> None:
        """Show the chat's choice (no effortChosen: only the user's choices emit it)."""
        self.setCurrentIndex(max(self.findData(effort), 0))
