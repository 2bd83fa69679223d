"""A user message with long pasted text: the typed words as written, the paste folded
into "▸ Pasted text · 5,839 tokens", which a click opens and closes.

The fold is derived from the stored text (data.pasted_text.split_message), so the
message looks the same after a restart and the model is always sent all of it.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from desktop_app.data.pasted_text import fold_label, split_message
from desktop_app.widgets.markdown import MarkdownView, wrapped_text_policy

TokenCounter = Callable[[str], "int | None"]


class PastedBlock(QFrame):
    """The folded paste: a toggle with its size, and the text (plain, as pasted) shown
    only while open. The text widget is made on first opening."""

    def __init__(self, text: str, label: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("pastedBlock")
        self.pasted = text
        self.toggle = QToolButton()
        self.toggle.setObjectName("pastedToggle")
        self.toggle.setText(label)
        self.toggle.setCheckable(True)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setAccessibleName(f"{label}: show or hide")
        self.toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        self.toggle.toggled.connect(self.set_open)
        self.content: QLabel | None = None
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        self.setSizePolicy(wrapped_text_policy(QSizePolicy.Policy.Expanding))

    def is_open(self) -> bool:
        return self.content is not None and not self.content.isHidden()

    def set_open(self, open_: bool) -> None:
        if open_ and self.content is None:
            self.content = QLabel(self.pasted)
            self.content.setObjectName("pastedText")
            self.content.setTextFormat(Qt.TextFormat.PlainText)
            self.content.setWordWrap(True)
            self.content.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.content.setSizePolicy(wrapped_text_policy(QSizePolicy.Policy.Expanding))
            self._layout.addWidget(self.content)
        if self.content is not None:
            self.content.setVisible(open_)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if open_ else Qt.ArrowType.RightArrow)
        if self.toggle.isChecked() != open_:
            self.toggle.setChecked(open_)


class FoldedBody(QWidget):
    """A message body (what MessageWidget shows as `body`) whose paste is folded; it
    answers `markdown()` with the whole text, as a MarkdownView does."""

    def __init__(self, text: str, count_tokens: TokenCounter,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("foldedBody")
        self._text = text
        split = split_message(text)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        self.lead = MarkdownView(split.lead) if split.lead else None
        if self.lead is not None:
            layout.addWidget(self.lead)
        self.block = PastedBlock(split.pasted, fold_label(split.pasted,
                                                          count_tokens(split.pasted)))
        layout.addWidget(self.block)
        self.setSizePolicy(wrapped_text_policy(QSizePolicy.Policy.Expanding))

    def markdown(self) -> str:
        return self._text

    def flush(self) -> None:
        """Nothing streams into a user message; kept for MarkdownView's interface."""
