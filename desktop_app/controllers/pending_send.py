"""A message sent while a model loads: kept, and sent once the load finishes.

`folio-app --model FILE` starts loading at once, and the first message is often typed
before the model is ready. Instead of refusing it, the chat controller hands it here: it
stays in the composer (read-only) under "Loading the model into memory… 42%" (the load's
plain steps, widgets.load_steps), goes to the chat it was
typed in when the bridge says modelLoaded, and, when the load fails, stays in the
composer, editable again, with the reason on the note. "Don't send" (or Esc) takes it
back. Only a load with no model loaded holds messages: while a model is loaded, a load
of another one leaves it serving, and messages go to it as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject

from desktop_app.services.sources import display_name
from desktop_app.widgets.conversation_view import ConversationView
from desktop_app.widgets.load_steps import LoadSteps


@dataclass(slots=True)
class PendingMessage:
    chat_id: int | None  # None: no chat was open; a new one is made when it is sent
    text: str


def waiting_note(steps: LoadSteps) -> str:
    return f"{steps.text()}. Your message is sent as soon as it is ready."


class PendingSend(QObject):
    """`send(chat_id, text)` is called with the held message once a model is loaded."""

    def __init__(self, bridge, view: ConversationView,
                 send: Callable[[int | None, str], None], parent: QObject | None = None
                 ) -> None:
        super().__init__(parent)
        self.view, self._send = view, send
        self.message: PendingMessage | None = None
        self.load = LoadSteps()
        bridge.loadStarted.connect(self._on_load_started)
        bridge.loadProgress.connect(self._on_progress)
        bridge.modelLoaded.connect(self._on_loaded)
        bridge.modelLoadFailed.connect(self._on_failed)
        view.pending_note.cancelRequested.connect(self.cancel)
        # A notice (the load failed) is about the text it was shown with: editing ends it.
        view.composer.textChanged.connect(self._on_text_changed)

    @property
    def waiting(self) -> bool:
        return self.message is not None

    def hold(self, chat_id: int | None, text: str) -> None:
        self.message = PendingMessage(chat_id, text)
        self.view.set_pending(True)
        self.view.pending_note.show_waiting(waiting_note(self.load))

    def cancel(self) -> None:
        """Don't send: the message stays in the composer, editable."""
        if self.message is None:
            return
        self.message = None
        self.view.set_pending(False)
        self.view.pending_note.clear()
        self.view.composer.setFocus()

    def _on_load_started(self, _source: str) -> None:
        self.load = LoadSteps()
        self.load.reset()
        self._show_progress()

    def _on_progress(self, stage: str, fraction: float) -> None:
        self.load.update(stage, fraction)
        self._show_progress()

    def _show_progress(self) -> None:
        if self.message is not None:
            self.view.pending_note.show_waiting(waiting_note(self.load))
        else:
            self.view.pending_note.clear()  # a new load: an old notice no longer applies

    def _on_loaded(self, _name: str) -> None:
        message, self.message = self.message, None
        if message is None:
            return
        self.view.set_pending(False)
        self.view.pending_note.clear()
        self._send(message.chat_id, message.text)

    def _on_failed(self, source: str, message: str) -> None:
        if self.message is None:
            return
        self.message = None
        self.view.set_pending(False)
        self.view.pending_note.show_notice(
            f"Not sent: {display_name(source)} did not load ({message}). Your message is "
            "still here: load a model from the model picker, then send it again.")

    def _on_text_changed(self) -> None:
        if self.message is None:
            self.view.pending_note.clear()
