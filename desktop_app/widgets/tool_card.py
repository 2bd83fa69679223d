"""A tool call in the conversation: a collapsible card with the tool, its server, the
arguments the model wrote and, once it ran, its result. A pending call offers Run, Always
allow (this tool runs without asking from now on) and Deny; a failed one says why."""

from __future__ import annotations

import json
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

STATE_LABELS = {"pending": "waiting for you", "running": "running…", "done": "done",
                "error": "failed", "denied": "denied"}
MAX_SHOWN_LINES = 12


@dataclass(slots=True, frozen=True)
class ToolCallView:
    """What a card shows of one call (a tool message and whether it is running now)."""

    message_id: int
    name: str
    server: str
    arguments: str
    state: str  # a tool_records state, or "running"
    result: str = ""


def pretty_arguments(text: str) -> str:
    try:
        return json.dumps(json.loads(text or "{}"), indent=2, ensure_ascii=False)
    except json.JSONDecodeError:
        return text


def _text_box(name: str, text: str) -> QPlainTextEdit:
    box = QPlainTextEdit(text)
    box.setObjectName(name)
    box.setReadOnly(True)
    lines = min(MAX_SHOWN_LINES, max(1, text.count("\n") + 1))
    box.setFixedHeight(box.fontMetrics().lineSpacing() * lines + 14)
    return box


class ToolCallCard(QFrame):
    runRequested = Signal(int)  # tool message id
    alwaysRequested = Signal(int)
    denyRequested = Signal(int)

    def __init__(self, view: ToolCallView, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view = view
        self.message_id = view.message_id
        self.setObjectName("toolCallCard")
        self.setProperty("state", view.state)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName(f"Tool call {view.name}")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(6)

        self.toggle = QToolButton()
        self.toggle.setObjectName("toolCardToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow)
        self.toggle.setText(f"Tool  {view.name}  ·  {view.server}  ·  "
                            f"{STATE_LABELS.get(view.state, view.state)}")
        self.toggle.setToolTip("Show or hide the arguments and the result")
        self.toggle.toggled.connect(self.set_expanded)
        layout.addWidget(self.toggle)

        self.body = QWidget()
        body = QVBoxLayout(self.body)
        body.setContentsMargins(0, 0, 0, 0)
        body.addWidget(QLabel("Arguments"))
        self.arguments = _text_box("toolArguments", pretty_arguments(view.arguments))
        body.addWidget(self.arguments)
        self.result = _text_box("toolResult", view.result)
        self.result_label = QLabel("Error" if view.state == "error" else "Result")
        shown = view.state in ("done", "error", "denied")
        self.result_label.setVisible(shown)
        self.result.setVisible(shown)
        body.addWidget(self.result_label)
        body.addWidget(self.result)
        layout.addWidget(self.body)

        buttons = QHBoxLayout()
        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("toolRunButton")
        self.run_button.setToolTip(f"Run {view.name} on {view.server} with these arguments")
        self.always_button = QPushButton("Always allow")
        self.always_button.setObjectName("toolAlwaysButton")
        self.always_button.setToolTip(f"Run {view.name} now and from now on without asking")
        self.deny_button = QPushButton("Deny")
        self.deny_button.setObjectName("toolDenyButton")
        self.deny_button.setToolTip("Do not run it; the model is told you said no")
        self.run_button.clicked.connect(lambda: self.runRequested.emit(self.message_id))
        self.always_button.clicked.connect(lambda: self.alwaysRequested.emit(self.message_id))
        self.deny_button.clicked.connect(lambda: self.denyRequested.emit(self.message_id))
        for button in (self.run_button, self.always_button, self.deny_button):
            button.setVisible(view.state == "pending")
            buttons.addWidget(button)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        # Open while it needs the user; a finished call folds to its header.
        self.toggle.setChecked(view.state in ("pending", "running", "error"))
        self.set_expanded(self.toggle.isChecked())

    def set_expanded(self, on: bool) -> None:
        self.body.setVisible(on)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
