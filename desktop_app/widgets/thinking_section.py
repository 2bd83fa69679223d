"""The "Thinking" section above a reply's answer: a reasoning model's thinking, open while
it streams and folded once the answer comes (a click opens it again), its tokens and time
in the header. Hidden for a reply without thinking."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QToolButton, QVBoxLayout, QWidget

from desktop_app.data.metric_values import count, measure
from desktop_app.widgets.markdown import MarkdownView


def thinking_summary(metrics: dict | None) -> str:
    """"Thought for 3.2 s · 120 tokens", from a reply's metrics; "" without thinking (or
    without a usable count of it)."""
    tokens = count(metrics, "thinking_tokens")
    if not tokens:
        return ""
    seconds = measure(metrics, "thinking_s")
    return f"Thought · {tokens} tokens" if seconds is None else (
        f"Thought for {seconds:.1f} s · {tokens} tokens")


class ThinkingSection(QFrame):
    def __init__(self, text: str = "", metrics: dict | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("thinkingSection")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        self.toggle = QToolButton()
        self.toggle.setObjectName("thinkingToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        self.toggle.setAccessibleName("Thinking")
        self.toggle.toggled.connect(self._set_open)
        layout.addWidget(self.toggle)
        self.body = MarkdownView(text)
        self.body.setObjectName("thinkingBody")
        self.body.setAccessibleName("Thinking text")
        layout.addWidget(self.body)
        self._summary = ""
        self.finish(text, metrics)

    @property
    def is_open(self) -> bool:
        return self.toggle.isChecked()

    def text(self) -> str:
        return self.body.markdown()

    def append(self, delta: str) -> None:
        """More thinking while it streams: shown, open."""
        if not delta:
            return
        if self.isHidden():
            self._show(True)
            self.toggle.setChecked(True)
        self.body.append(delta)

    def answer_started(self) -> None:
        """The answer began: the thinking folds away."""
        if not self.isHidden():
            self.toggle.setChecked(False)

    def finish(self, text: str, metrics: dict | None) -> None:
        self.body.set_markdown(text)
        self._summary = thinking_summary(metrics)
        self._show(bool(text))
        self.toggle.setChecked(False)
        self._label()

    def _show(self, visible: bool) -> None:
        self.setVisible(visible)
        self._label()

    def _set_open(self, open_: bool) -> None:
        self.body.setVisible(open_)
        self._label()

    def _label(self) -> None:
        arrow = Qt.ArrowType.DownArrow if self.toggle.isChecked() else Qt.ArrowType.RightArrow
        self.toggle.setArrowType(arrow)
        self.toggle.setText(self._summary or "Thinking")
        self.toggle.setToolTip("Hide the model's thinking" if self.toggle.isChecked()
                               else "Show the model's thinking")
