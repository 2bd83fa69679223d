"""Side-by-side candidate replies: one column per candidate of a turn, each with "Keep"."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.data.durations import latency
from desktop_app.data.metric_values import count, label, measure
from desktop_app.data.pacing_note import pacing_note
from desktop_app.widgets import theme
from desktop_app.widgets.markdown import MarkdownView
from desktop_app.widgets.prompt_progress import PromptProgressLine
from desktop_app.widgets.thinking_section import ThinkingSection


def format_metrics(metrics: dict | None) -> str:
    """The line under a reply: speed, time to first token, and where the prompt came from.
    A figure that is missing or unusable (a row of another version) is left out."""
    if not isinstance(metrics, dict) or "num_prompt_tokens" not in metrics:
        return ""
    parts = []
    width = count(metrics, "beam_width")  # data.beam_choice.METRIC
    if width:
        # A beam search: no token streamed, so no speed or first token; its whole time.
        total = measure(metrics, "total_s")
        parts.append(f"beam search, width {width}"
                     + ("" if total is None else f" in {total:.1f} s"))
    speed, ttft = measure(metrics, "decode_tok_s"), measure(metrics, "ttft_s")
    if speed is not None and not width:
        parts.append(f"{speed:.1f} tok/s")
    if ttft is not None and not width:
        parts.append(f"first token {latency(ttft)}")
    drafted = count(metrics, "num_draft_tokens")
    if drafted:
        # Speculative decoding: the share of drafted tokens the model kept.
        kept = min(count(metrics, "num_accepted_draft_tokens") or 0, drafted)
        parts.append(f"drafts {kept / drafted:.0%} accepted")
    prompt = count(metrics, "num_prompt_tokens")
    if prompt is not None:
        # Older rows lack the disk count; clamped, so that "computed" is never negative.
        cached = min(count(metrics, "num_cached_tokens") or 0, prompt)
        disk = min(count(metrics, "num_disk_tokens") or 0, cached)
        source = f"{cached} cached, {disk} from disk" if disk else f"{cached} cached"
        parts.append(f"{prompt} prompt tokens ({source}, {prompt - cached} computed)")
    thought = count(metrics, "thinking_tokens")
    if thought:
        seconds = measure(metrics, "thinking_s")
        parts.append(f"thinking {thought} tokens"
                     + ("" if seconds is None else f" in {seconds:.1f} s"))
    continued = count(metrics, "continued_tokens")
    if continued:
        # The figures above are the continuation's: its prompt held the reply so far.
        parts.append(f"continued after {continued} tokens")
    dropped = count(metrics, "thinking_dropped_tokens")
    if dropped:
        # The template shows earlier replies without their thinking: what was cached of
        # them after it is computed again.
        parts.append(f"{dropped} tokens recomputed: earlier thinking left out of the history")
    return " · ".join(parts)


def footer_line(metrics: dict | None, status: str) -> str:
    """The metrics, then notes on how the candidates ran and how the reply ended, for any
    finished reply."""
    note = status_note(status, label(metrics, "finish_reason"))
    return " · ".join(p for p in (format_metrics(metrics), pacing_note(metrics), note) if p)


def status_note(status: str, finish_reason: str | None) -> str:
    if status == "interrupted":
        return "Interrupted: the app closed while this reply was streaming"
    if finish_reason == "abort":
        return "Stopped"
    if finish_reason == "length":
        return "Cut off at the max tokens setting"
    if finish_reason == "context":
        return "Context full"
    return ""


class CandidateColumn(QFrame):
    """One candidate: title and copy button, the reply, its metrics line, "Keep".

    Side by side in a row, a column's height comes from its size hint, which ignores
    word wrapping; the column therefore asks its layout for the height its wrapped text
    needs at its width (heightForWidth), and the metrics line, a label that wraps too,
    sits in that layout under the reply, so it is never drawn over the text.
    """

    keepClicked = Signal(int)  # message id

    def __init__(self, message_id: int, index: int, text: str = "",
                 parent: QWidget | None = None, thinking: str = "", model: str = "") -> None:
        super().__init__(parent)
        self.setObjectName("candidateColumn")
        # A compare turn's column is titled with its model (``model``), and its metrics
        # line counts the tokens it wrote: the models are compared by that line.
        name = model or f"Candidate {index + 1}"
        self.setAccessibleName(name)
        self.message_id = message_id
        self.index = index
        self.model = model
        self.finished = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        layout.setSpacing(6)
        header = QHBoxLayout()
        header.setSpacing(4)
        title = QLabel(name)
        title.setObjectName("roleLabel")
        self.title = title
        header.addWidget(title)
        header.addStretch(1)
        self.copy_button = QToolButton()
        self.copy_button.setObjectName("candidateCopyButton")
        self.copy_button.setIcon(theme.icon("copy", theme.current().muted))
        self.copy_button.setToolTip("Copy this candidate as Markdown")
        self.copy_button.setAccessibleName(f"Copy candidate {index + 1}")
        self.copy_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.copy_button.clicked.connect(self.copy_to_clipboard)
        header.addWidget(self.copy_button)
        layout.addLayout(header)
        self.thinking = ThinkingSection(thinking)
        layout.addWidget(self.thinking)
        self.prompt_progress = PromptProgressLine()  # shown by the controller, till a token
        layout.addWidget(self.prompt_progress)
        self.body = MarkdownView(text)
        layout.addWidget(self.body)
        layout.addStretch(1)
        self.metrics_label = QLabel("")
        self.metrics_label.setObjectName("metricsLabel")
        self.metrics_label.setWordWrap(True)
        self.metrics_label.setSizePolicy(QSizePolicy.Policy.Preferred,
                                         QSizePolicy.Policy.Minimum)
        self.metrics_label.setVisible(False)
        layout.addWidget(self.metrics_label)
        self.keep_button = QPushButton(theme.icon("keep", theme.current().accent_text), "Keep")
        self.keep_button.setObjectName("keepButton")
        self.keep_button.setToolTip("Make this the reply and continue the chat from it")
        self.keep_button.setAccessibleName(f"Keep candidate {index + 1}")
        self.keep_button.setEnabled(False)
        self.keep_button.clicked.connect(lambda: self.keepClicked.emit(self.message_id))
        layout.addWidget(self.keep_button, 0, Qt.AlignmentFlag.AlignRight)
        policy = QSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)

    def text(self) -> str:
        return self.body.markdown()

    def append(self, delta: str) -> None:
        if delta:
            self.thinking.answer_started()
        self.body.append(delta)

    def append_thinking(self, delta: str) -> None:
        self.thinking.append(delta)

    def copy_to_clipboard(self) -> None:
        QGuiApplication.clipboard().setText(self.text())

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        # totalHeightForWidth, not heightForWidth: it counts the column's own frame too
        # (the style sheet's 1px border), else the last line of a wrapped label is clipped.
        return self.layout().totalHeightForWidth(width)

    def event(self, event: QEvent) -> bool:
        handled = super().event(event)
        if event.type() in (QEvent.Type.LayoutRequest, QEvent.Type.Resize):
            self._fit_height()
        return handled

    def _fit_height(self) -> None:
        """A box layout of columns side by side gives them all the row's height, the
        tallest one's heightForWidth; a minimum height of its own at its current width
        keeps a column whole when its container does not ask for heightForWidth."""
        height = self.heightForWidth(self.width())
        if height > 0 and height != self.minimumHeight():
            self.setMinimumHeight(height)

    def finish(self, text: str, metrics: dict | None, status: str = "complete",
               thinking: str = "") -> None:
        self.finished = True
        self.prompt_progress.finish()
        self.body.set_markdown(text)
        self.thinking.finish(thinking, metrics)
        line = footer_line(metrics, status)
        generated = count(metrics, "num_generated_tokens") if self.model else None
        if generated is not None and line:
            line = f"{generated} tokens · {line}"
        self.metrics_label.setText(line)
        self.metrics_label.setVisible(bool(line))
        self.keep_button.setEnabled(True)


def column_models(messages: Sequence) -> list[str]:
    """Each column's model title in a compare turn (replies of more than one model): the
    model, numbered where it wrote several; empty titles (numbered candidates) otherwise."""
    models = [m.model or "" for m in messages]
    if len(set(models)) < 2:
        return [""] * len(models)
    titles, seen = [], {}
    for model in models:
        seen[model] = seen.get(model, 0) + 1
        titles.append(f"{model} · {seen[model]}" if models.count(model) > 1 else model)
    return titles


class CandidateGroup(QWidget):
    """The n columns of one turn; they stream at once and each can be kept."""

    keepRequested = Signal(int)  # message id

    def __init__(self, messages: Sequence, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("candidateGroup")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(10)
        self.columns: list[CandidateColumn] = []
        for i, (msg, model) in enumerate(zip(messages, column_models(messages), strict=True)):
            column = CandidateColumn(msg.id, i, msg.content, thinking=msg.thinking,
                                     model=model)
            column.keepClicked.connect(self.keepRequested)
            if msg.status != "streaming":
                column.finish(msg.content, msg.metrics, msg.status, msg.thinking)
            layout.addWidget(column, 1)
            self.columns.append(column)

    def column_for(self, message_id: int) -> CandidateColumn | None:
        return next((c for c in self.columns if c.message_id == message_id), None)

    def message_ids(self) -> list[int]:
        return [c.message_id for c in self.columns]
