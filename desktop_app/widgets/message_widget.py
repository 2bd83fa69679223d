"""One message bubble of the conversation: role, alternates navigator ("‹ 2/3 ›"), a
reply's "Thinking" section, Markdown body, copy / edit / regenerate buttons (copy takes the
answer only), the metrics line under a reply, and "Continue" under the branch's last reply
when it was cut off (max tokens) or stopped."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
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

from desktop_app.data.json_mode import reply_label
from desktop_app.data.pasted_text import should_fold
from desktop_app.widgets import theme
from desktop_app.widgets.attachment_view import SentAttachments
from desktop_app.widgets.candidates import footer_line
from desktop_app.widgets.markdown import MarkdownView
from desktop_app.widgets.paste_fold import FoldedBody, TokenCounter
from desktop_app.widgets.prompt_progress import PromptProgressLine
from desktop_app.widgets.thinking_section import ThinkingSection


@dataclass(slots=True)
class TurnItem:
    """One row of the branch: a message with its place among its alternates."""

    message: object  # chat_store.Message
    position: int = 0
    count: int = 1
    last: bool = False  # the end of the branch: a cut-off reply there can be continued
    # An attachment's bytes by sha256 (ChatStore.attachment_data), for its thumbnail.
    attachment_data: Callable[[str], bytes] | None = None


# How a reply ended that "Continue" can extend: max tokens reached, or Stop.
CONTINUABLE = ("length", "abort")


def can_continue(role: str, metrics: dict | None, status: str, has_text: bool) -> bool:
    reason = metrics.get("finish_reason") if isinstance(metrics, dict) else None
    return role == "assistant" and status == "complete" and reason in CONTINUABLE \
        and has_text


def _flat_button(icon_name: str, tip: str, object_name: str = "flatButton") -> QToolButton:
    button = QToolButton()
    button.setObjectName(object_name)
    button.setIcon(theme.icon(icon_name, theme.current().muted))
    button.setToolTip(tip)
    button.setAccessibleName(tip.split(":")[0])
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    return button


class MessageWidget(QFrame):
    """A bubble: role, alternates navigator, Markdown body, copy/edit/regenerate, metrics."""

    switchRequested = Signal(int, int)  # message id, step -1 / +1
    editSubmitted = Signal(int, str)
    regenerateRequested = Signal(int)
    continueRequested = Signal(int)  # message id

    def __init__(self, item: TurnItem, parent: QWidget | None = None,
                 count_tokens: TokenCounter | None = None) -> None:
        super().__init__(parent)
        msg = item.message
        self.message_id = msg.id
        self.role = msg.role
        self.last = item.last
        self.position, self.count = item.position, item.count
        self.setObjectName("messageBubble")
        self.setProperty("role", msg.role)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(14, 10, 14, 10)
        outer.setSpacing(6)

        header = QHBoxLayout()
        header.setSpacing(4)
        role = QLabel("You" if msg.role == "user" else (msg.model or "Assistant"))
        role.setObjectName("roleLabel")
        header.addWidget(role)
        header.addStretch(1)
        self.branch_label = QLabel(f"{item.position + 1}/{item.count}")
        self.branch_label.setObjectName("branchLabel")
        self.prev_button = _flat_button("chevron-left", "Previous alternate")
        self.next_button = _flat_button("chevron-right", "Next alternate")
        self.prev_button.clicked.connect(lambda: self.switchRequested.emit(self.message_id, -1))
        self.next_button.clicked.connect(lambda: self.switchRequested.emit(self.message_id, 1))
        for w in (self.prev_button, self.branch_label, self.next_button):
            w.setVisible(item.count > 1)
            header.addWidget(w)
        self.copy_button = _flat_button("copy", "Copy this message as Markdown")
        self.copy_button.clicked.connect(self.copy_to_clipboard)
        header.addWidget(self.copy_button)
        if msg.role == "user":
            self.edit_button = _flat_button("edit", "Edit: starts a new branch from here")
            self.edit_button.clicked.connect(self.start_edit)
            header.addWidget(self.edit_button)
        elif msg.role == "assistant":
            self.regen_button = _flat_button("regenerate", "Regenerate: adds alternates",
                                             "messageRegenerate")
            self.regen_button.clicked.connect(
                lambda: self.regenerateRequested.emit(self.message_id))
            header.addWidget(self.regen_button)
        outer.addLayout(header)

        attached = getattr(msg, "attachments", None) or []
        self.attachments = SentAttachments(attached, item.attachment_data) if attached \
            else None
        if self.attachments is not None:
            outer.addWidget(self.attachments)
        self.thinking = ThinkingSection(msg.thinking, msg.metrics)
        outer.addWidget(self.thinking)
        self.prompt_progress = PromptProgressLine()  # shown by the controller, till a token
        outer.addWidget(self.prompt_progress)
        if msg.role == "user" and should_fold(msg.content):  # a long paste shows folded
            self.body = FoldedBody(msg.content, count_tokens or (lambda _text: None))
        else:
            self.body = MarkdownView(msg.content)
        outer.addWidget(self.body)
        self.editor: QPlainTextEdit | None = None
        self._edit_row: QWidget | None = None

        self.metrics_label = QLabel("")
        self.metrics_label.setObjectName("metricsLabel")
        self.metrics_label.setWordWrap(True)
        outer.addWidget(self.metrics_label)
        self.continue_button = QPushButton(theme.icon("chevron-right", theme.current().muted),
                                           "Continue")
        self.continue_button.setObjectName("continueButton")
        self.continue_button.setToolTip("Go on writing this reply where it stopped")
        self.continue_button.setAccessibleName("Continue this reply")
        self.continue_button.clicked.connect(
            lambda: self.continueRequested.emit(self.message_id))
        outer.addWidget(self.continue_button, 0, Qt.AlignmentFlag.AlignLeft)
        self.set_footer(msg.metrics, msg.status, bool(msg.content or msg.thinking))
        self.set_locked(False)

    def set_locked(self, locked: bool) -> None:
        """While a reply streams, branch switches and new branches wait."""
        self.prev_button.setEnabled(not locked and self.position > 0)
        self.next_button.setEnabled(not locked and self.position < self.count - 1)
        for name in ("regen_button", "edit_button", "continue_button"):
            button = getattr(self, name, None)
            if button is not None:
                button.setEnabled(not locked)

    # -- content -----------------------------------------------------------------------
    def text(self) -> str:
        return self.body.markdown()

    def append(self, delta: str) -> None:
        if delta:
            self.thinking.answer_started()
        self.body.append(delta)

    def append_thinking(self, delta: str) -> None:
        self.thinking.append(delta)

    def finish(self, text: str, metrics: dict | None, status: str, thinking: str = "") -> None:
        self.prompt_progress.finish()
        self.body.set_markdown(text)
        self.thinking.finish(thinking, metrics)
        self.set_footer(metrics, status, bool(text or thinking))

    def set_footer(self, metrics: dict | None, status: str, has_text: bool = True) -> None:
        self.continue_button.setVisible(
            self.last and can_continue(self.role, metrics, status, has_text))
        if self.role != "assistant":
            self.metrics_label.setVisible(False)
            return
        line = " · ".join(p for p in (reply_label(metrics), footer_line(metrics, status)) if p)
        self.metrics_label.setText(line)
        self.metrics_label.setVisible(bool(line))

    def copy_to_clipboard(self) -> None:
        QGuiApplication.clipboard().setText(self.text())

    # -- editing a past user message ------------------------------------------------------
    def start_edit(self) -> None:
        if self.editor is not None:
            return
        self.editor = QPlainTextEdit(self.text())
        self.editor.setObjectName("messageEditor")
        self.editor.setFixedHeight(90)
        row = QWidget()
        buttons = QHBoxLayout(row)
        buttons.setContentsMargins(0, 0, 0, 0)
        buttons.addStretch(1)
        cancel = QPushButton("Cancel")
        cancel.clicked.connect(self.cancel_edit)
        save = QPushButton("Send as new branch")
        save.setObjectName("sendButton")
        save.clicked.connect(self._submit_edit)
        buttons.addWidget(cancel)
        buttons.addWidget(save)
        layout = self.layout()
        at = layout.indexOf(self.body)
        layout.insertWidget(at, self.editor)
        layout.insertWidget(at + 1, row)
        self._edit_row = row
        self.body.setVisible(False)
        self.editor.setFocus()

    def cancel_edit(self) -> None:
        for w in (self.editor, self._edit_row):
            if w is not None:
                w.deleteLater()
        self.editor = self._edit_row = None
        self.body.setVisible(True)

    def _submit_edit(self) -> None:
        text = self.editor.toPlainText().strip() if self.editor else ""
        if text:
            self.editSubmitted.emit(self.message_id, text)
