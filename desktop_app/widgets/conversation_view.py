"""The conversation in the middle of the window: the active branch, the composer, streaming.

The view holds no chat logic: it shows what the controller hands it (store Messages, and
candidate groups still waiting for a "Keep") and reports user intent through signals.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from desktop_app.data.pasted_text import join_draft
from desktop_app.widgets import drops, theme
from desktop_app.widgets.attachment_view import AttachBar
from desktop_app.widgets.candidates import CandidateGroup
from desktop_app.widgets.composer import (
    HINT_MS,
    Composer,
    ComposerNote,
    DropForwarder,
    PasteChips,
)
from desktop_app.widgets.effort_box import ReasoningEffortBox
from desktop_app.widgets.json_mode import JsonModeButton
from desktop_app.widgets.message_widget import MessageWidget
from desktop_app.widgets.paste_fold import TokenCounter
from desktop_app.widgets.pending_note import PendingNote
from desktop_app.widgets.welcome import WelcomePanel

MAX_COLUMN_WIDTH = 980
_STICK_THRESHOLD_PX = 24
GAUGE_WARN_FRACTION = 0.85  # the context gauge turns amber from here


@dataclass(slots=True)
class GroupItem:
    """n candidates of one turn shown side by side until one is kept."""

    messages: list


class ConversationView(QWidget):
    sendRequested = Signal(str)
    stopRequested = Signal()
    regenerateRequested = Signal(int)  # assistant message id; 0 = the last reply
    continueRequested = Signal(int)  # a cut-off reply's message id
    switchRequested = Signal(int, int)
    editSubmitted = Signal(int, str)
    keepRequested = Signal(int)
    # drops.Dropped: files or images dropped or pasted, for the attach controls
    # (controllers/attach.py) to read and attach, or to say why not on the composer note.
    attachmentsOffered = Signal(object)
    draftChanged = Signal()  # the typed text, the folded pastes or the attachments changed

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("conversationView")
        self._rows: dict[int, QWidget] = {}  # message id -> MessageWidget / CandidateGroup
        self.stick_to_bottom = True
        self._count_tokens: TokenCounter = lambda _text: None

        self.scroll = QScrollArea()
        self.scroll.setObjectName("conversationArea")
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        canvas = QWidget()
        centered = QHBoxLayout(canvas)
        centered.setContentsMargins(20, 16, 20, 16)
        self.column = QWidget()
        self.column.setMaximumWidth(MAX_COLUMN_WIDTH)
        self.column.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.rows_layout = QVBoxLayout(self.column)
        self.rows_layout.setContentsMargins(0, 0, 0, 0)
        self.rows_layout.setSpacing(12)
        centered.addWidget(self.column)
        self.scroll.setWidget(canvas)
        bar = self.scroll.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range_changed)

        # An empty chat's guide (the window feeds it the model and picks up its choices).
        self.welcome = WelcomePanel()
        # Layout: the welcome, then the rows, then a stretch that keeps a short
        # conversation at the top.
        self.rows_layout.addWidget(self.welcome)
        self.rows_layout.addStretch(1)

        self.composer = Composer()
        self.composer.submitted.connect(self._send)
        self._chat_drops = DropForwarder(self.composer, self.scroll.viewport())
        self.paste_chips = PasteChips(self.composer)
        self.composer_note = ComposerNote()  # "Type a message first", a drop not taken
        self.composer.pasteFolded.connect(self.paste_chips.add)
        self.composer.dropped.connect(self._on_dropped)
        self.composer.textChanged.connect(self.draftChanged)
        self.paste_chips.changed.connect(self.draftChanged)
        # The draft's images and documents, and the buttons that attach them
        # (controllers/attach.py drives them).
        self.attach_bar = AttachBar()
        self.attachment_chips = self.attach_bar.chips
        self.attach_button, self.image_button = (self.attach_bar.attach_button,
                                                 self.attach_bar.image_button)
        self.attachment_chips.changed.connect(self.draftChanged)
        self.pending_note = PendingNote()  # a message waiting for the model to load
        self.composer.textChanged.connect(self.composer_note.on_typing)
        self.send_button = QPushButton(theme.icon("send", theme.current().accent_text), "Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.setAccessibleName("Send the message")
        self.send_button.clicked.connect(self._send)
        self.stop_button = QPushButton(theme.icon("stop", "#ffffff"), "Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.clicked.connect(self.stopRequested)
        self.stop_button.setVisible(False)
        self.regenerate_button = QPushButton(theme.icon("regenerate"), "Regenerate")
        self.regenerate_button.setObjectName("regenerateButton")
        self.regenerate_button.setToolTip("Add alternates to the last reply (Ctrl+R)")
        self.regenerate_button.clicked.connect(lambda: self.regenerateRequested.emit(0))
        self.context_gauge = QProgressBar()
        self.context_gauge.setObjectName("contextGauge")
        self.context_gauge.setAccessibleName("Context used")
        self.context_gauge.setFixedHeight(12)
        self.context_gauge.setVisible(False)
        self.context_gauge.setProperty("nearFull", False)
        self._style_gauge()

        bottom = QHBoxLayout()
        bottom.setContentsMargins(20, 8, 20, 16)
        bottom.setSpacing(8)
        composer_column = QVBoxLayout()
        composer_column.setSpacing(4)
        composer_column.addWidget(self.pending_note)
        composer_column.addWidget(self.composer_note)
        composer_column.addWidget(self.paste_chips)
        composer_column.addWidget(self.attach_bar)
        composer_column.addWidget(self.composer)
        composer_column.addWidget(self.context_gauge)
        bottom.addLayout(composer_column, 1)
        buttons = QVBoxLayout()
        buttons.setSpacing(6)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.regenerate_button)
        self.json_button = JsonModeButton()  # desktop_app/controllers/json_mode.py drives it
        buttons.addWidget(self.json_button)
        # A reasoning model's switch (desktop_app/controllers/thinking.py shows and drives it).
        self.think_button = QPushButton("Think")
        self.think_button.setObjectName("thinkButton")
        self.think_button.setCheckable(True)
        self.think_button.setToolTip("Think before answering (this chat)")
        self.think_button.setAccessibleName("Think before answering")
        self.think_button.setVisible(False)
        buttons.addWidget(self.think_button)
        self.effort_box = ReasoningEffortBox()  # shown and driven by thinking.py too
        buttons.addWidget(self.effort_box)
        buttons.addStretch(1)
        bottom.addLayout(buttons)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.scroll, 1)
        layout.addLayout(bottom)
        self.set_generating(False)

    def retheme(self) -> None:
        self.send_button.setIcon(theme.icon("send", theme.current().accent_text))
        self.regenerate_button.setIcon(theme.icon("regenerate"))
        self._style_gauge()

    # -- the context gauge -----------------------------------------------------------------
    def set_context(self, used: int, total: int | None, detail: str = "") -> None:
        """Show `used` of `total` context tokens ("1,234 / 8,192 tokens"); total None (no
        model) hides the gauge. Amber (the "nearFull" property) from 85 %."""
        gauge = self.context_gauge
        if not total:
            gauge.setVisible(False)
            return
        used = max(0, int(used))
        gauge.setRange(0, int(total))
        gauge.setValue(min(used, int(total)))
        gauge.setFormat(f"{used:,} / {int(total):,} tokens")
        near = used >= GAUGE_WARN_FRACTION * total
        if bool(gauge.property("nearFull")) != near:
            gauge.setProperty("nearFull", near)
            gauge.style().unpolish(gauge)
            gauge.style().polish(gauge)
        tip = f"Context used: {used:,} of {int(total):,} tokens"
        gauge.setToolTip(f"{tip}\n{detail}" if detail else tip)
        gauge.setVisible(True)

    def _style_gauge(self) -> None:
        # Local to the gauge, on top of the theme's QProgressBar rules: amber near the end.
        c = theme.current()
        self.context_gauge.setStyleSheet(
            "QProgressBar#contextGauge { font-size: 10px; max-height: 12px; }"
            f"QProgressBar#contextGauge[nearFull=\"true\"]::chunk "
            f"{{ background: {c.block_shared}; }}")

    # -- showing a branch --------------------------------------------------------------------
    def show_items(self, items: list) -> None:
        """Replace the rows with `items` (TurnItem / GroupItem), scrolled to the end."""
        for row in self.rows():
            self.rows_layout.removeWidget(row)
            # Detach now (so lookups no longer find it); delete once the event that got
            # here (often a click inside this very row) has returned.
            row.hide()
            row.setParent(None)
            row.deleteLater()
        self._rows.clear()
        for item in items:
            self._add_row(item)
        self.welcome.setVisible(not items)
        self.stick_to_bottom = True
        self.scroll_to_bottom()

    def add_item(self, item) -> None:
        self.welcome.setVisible(False)
        self._add_row(item)

    def _add_row(self, item) -> None:
        if isinstance(item, QWidget):  # a row built by its controller (a tool call card)
            self.rows_layout.insertWidget(self.rows_layout.count() - 1, item)
            self._rows[item.message_id] = item
            return
        if isinstance(item, GroupItem):
            row = CandidateGroup(item.messages)
            row.keepRequested.connect(self.keepRequested)
            ids = row.message_ids()
        else:
            row = MessageWidget(item, count_tokens=self._count_tokens)
            row.switchRequested.connect(self.switchRequested)
            row.editSubmitted.connect(self.editSubmitted)
            row.regenerateRequested.connect(self.regenerateRequested)
            row.continueRequested.connect(self.continueRequested)
            ids = [item.message.id]
        self.rows_layout.insertWidget(self.rows_layout.count() - 1, row)  # before the stretch
        for mid in ids:
            self._rows[mid] = row

    def rows(self) -> list[QWidget]:
        out = []
        for i in range(self.rows_layout.count()):
            w = self.rows_layout.itemAt(i).widget()
            if w is not None and w is not self.welcome:
                out.append(w)
        return out

    def widget_for(self, message_id: int):
        """The MessageWidget or CandidateColumn showing a message, or None."""
        row = self._rows.get(message_id)
        if isinstance(row, CandidateGroup):
            return row.column_for(message_id)
        return row

    # -- streaming -----------------------------------------------------------------------
    def append_text(self, message_id: int, delta: str) -> None:
        target = self.widget_for(message_id)
        if target is not None:
            target.append(delta)

    def append_thinking(self, message_id: int, delta: str) -> None:
        target = self.widget_for(message_id)
        if target is not None and hasattr(target, "append_thinking"):
            target.append_thinking(delta)

    def finish_message(self, message) -> None:
        target = self.widget_for(message.id)
        if target is not None:
            target.finish(message.content, message.metrics, message.status, message.thinking)

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self.stop_button.setVisible(generating)
        self.send_button.setVisible(not generating)
        for row in set(self._rows.values()):
            if isinstance(row, MessageWidget):
                row.set_locked(generating)

    # -- composer and scrolling ------------------------------------------------------------
    def _send(self) -> None:
        if self.generating:
            return  # Enter does not queue a second turn while one streams
        text = self.draft()
        if text or self.attachments():
            self.sendRequested.emit(text)
        else:
            self.composer_note.show_note("Type a message first", HINT_MS, until_typing=True)
            self.composer.setFocus()

    def set_can_regenerate(self, enabled: bool) -> None:
        """The controller says whether there is a reply to regenerate now."""
        self.regenerate_button.setEnabled(enabled)

    def draft(self) -> str:
        """The message Send would send: the typed text, then the folded pastes."""
        return join_draft(self.composer.toPlainText(), self.paste_chips.texts()).strip()

    def attachments(self) -> list:
        """The draft's attachments (data.attachments.Attachment, with their bytes)."""
        return self.attachment_chips.attachments()

    def set_images_allowed(self, allowed: bool, tip: str) -> None:
        """Whether images may be attached (the model sees them); ``tip`` says why not."""
        self.image_button.setEnabled(allowed)
        self.image_button.setToolTip(tip)

    def set_token_counter(self, count_tokens: TokenCounter) -> None:
        """How pasted text is measured ("Pasted text · 5,839 tokens"): the loaded model's
        tokenizer, or None where there is none (the size is then given in characters)."""
        self._count_tokens = count_tokens
        self.paste_chips.count_tokens = count_tokens

    def clear_composer(self) -> None:
        self.composer.clear()
        self.paste_chips.clear()
        self.attachment_chips.clear()
        self.composer_note.dismiss()

    def set_pending(self, waiting: bool) -> None:
        """A message waits for the model (controllers.pending_send): the composer keeps
        it, read-only, until it is sent or taken back."""
        self.composer.setReadOnly(waiting)
        self.paste_chips.set_locked(waiting)
        self.attachment_chips.set_locked(waiting)
        for button in (self.send_button, self.attach_button):
            button.setEnabled(not waiting)

    # -- drops and pastes ------------------------------------------------------------------
    def _on_dropped(self, dropped: drops.Dropped) -> None:
        if not self.composer.isReadOnly():
            self.attachmentsOffered.emit(dropped)

    def scroll_to_bottom(self) -> None:
        bar = self.scroll.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _on_scrolled(self, value: int) -> None:
        bar = self.scroll.verticalScrollBar()
        # Scrolling up pauses auto-scroll; coming back to the end resumes it.
        self.stick_to_bottom = value >= bar.maximum() - _STICK_THRESHOLD_PX

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self.stick_to_bottom:
            self.scroll.verticalScrollBar().setValue(maximum)
