"""The toolbar's "Compare with" button: for the open chat, the local models that answer each
turn beside the picker's model, a column each (controllers.compare_turns).

It shows what it is handed (``set_models``: every local model the picker offers, and the
chat's choice) and reports the new choice (``changed``); the choice itself lives in the
chat's settings (ChatSettings.compare_models), kept by the main window.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QMenu, QToolButton, QWidget


class CompareButton(QToolButton):
    changed = Signal(list)  # the chosen sources, in the menu's order

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("compareButton")
        self.setAccessibleName("Models this chat compares")
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu_ = QMenu(self)
        self.menu_.setObjectName("compareMenu")
        self.setMenu(self.menu_)
        self.set_models([], [], None)

    def set_models(self, models: list[tuple[str, str]], chosen: list[str],
                   main: str | None) -> None:
        """``models``: (label, source) of each local model; ``chosen``: the chat's
        compared sources; ``main``: the picker's model (it answers anyway: not offered)."""
        self.menu_.clear()
        offered = [(label, source) for label, source in models if source != main]
        if not offered:
            self.menu_.addAction("Add another model in Models… to compare").setEnabled(False)
        for label, source in offered:
            action = self.menu_.addAction(label)
            action.setCheckable(True)
            action.setChecked(source in chosen)
            action.setData(source)
            action.setObjectName(f"compare:{source}")
            action.toggled.connect(lambda _on: self.changed.emit(self.chosen()))
        count = len(self.chosen())
        self.setText(f"Compare ({count})" if count else "Compare with…")
        self.setToolTip(f"{count + 1} models answer each message side by side" if count else
                        "Let other models answer each message beside this one")

    def chosen(self) -> list[str]:
        return [a.data() for a in self.menu_.actions() if a.isCheckable() and a.isChecked()]

    def action(self, source: str):
        return next((a for a in self.menu_.actions() if a.data() == source), None)
