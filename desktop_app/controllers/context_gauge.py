"""The composer's context gauge: what the chat in view holds, plus the draft being typed.

``show(held, note)`` is told what the engine counted for the chat (its last reply's prompt
and reply tokens, or the prompt of the reply streaming) and why less than the whole chat
was sent; the draft is counted with the loaded model's tokenizer (estimated for a remote
one), again once typing pauses rather than on every key.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer

from desktop_app.controllers import context_window
from desktop_app.widgets.conversation_view import ConversationView

GAUGE_DELAY_MS = 150


class ContextGauge(QObject):
    def __init__(self, bridge, view: ConversationView, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge, self.view = bridge, view
        self._held, self._note = 0, ""  # as last counted
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(GAUGE_DELAY_MS)
        self._timer.timeout.connect(self._draw)
        view.draftChanged.connect(self._timer.start)
        view.set_token_counter(self.count_tokens)

    def count_tokens(self, text: str) -> int | None:
        """`text`'s tokens by the loaded model's tokenizer; None where there is none."""
        tokenizer = self.bridge.tokenizer if self.bridge.is_loaded else None
        return None if tokenizer is None else context_window.text_tokens(tokenizer, text)

    def show(self, held: int, note: str = "") -> None:
        self._held, self._note = held, note
        self._draw()

    def _draw(self) -> None:
        total = self.bridge.max_model_len if self.bridge.is_loaded else None
        used, notes = self._held, [self._note] if self._note else []
        draft = self.view.draft() if total else ""
        if draft:
            extra = context_window.text_tokens(self.bridge.tokenizer, draft)
            used += extra
            notes.append(f"including about {extra:,} tokens of your draft")
        self.view.set_context(used, total, "\n".join(notes))
