"""The chats and the view: which chat is open, and a ``ChatSession`` for each chat with a
reply in flight or open (controllers.chat_session), which owns that chat's turns.

Runs on the GUI thread only. The view's requests (send, stop, regenerate, edit, keep,
switch) go to the session of the chat they are about; the bridge's events go to the
session that owns their request id, and what a session emits reaches the view only while
its chat is the one open. Several chats may stream at once (the engine batches them): the
view shows the one open (its partial text keeps growing when you switch to it), and Stop
stops the chat in view only. A message sent while the first model loads waits for it
(controllers.pending_send). A session whose chat is out of view and holds nothing more (no
reply in flight, no candidates waiting for Keep, no overflow cut to start the next prompt
the same way) is let go.
"""

from __future__ import annotations

import sqlite3

from PySide6.QtCore import QObject, Signal

from desktop_app.controllers.attach import AttachControls
from desktop_app.controllers.chat_session import ChatSession
from desktop_app.controllers.context_gauge import ContextGauge
from desktop_app.controllers.pending_send import PendingSend
from desktop_app.controllers.prompt_reading import show_reading
from desktop_app.controllers.thinking import ThinkingControls
from desktop_app.controllers.tool_turns import ToolTurns
from desktop_app.data.chat_titles import DEFAULT_TITLE
from desktop_app.data.settings import AppSettings, ChatSettings
from desktop_app.widgets.conversation_view import ConversationView


class ChatController(QObject):
    chatOpened = Signal(int)  # chat id (0: none)
    chatShown = Signal(int)  # the chat in view was shown again (render), chat id (0: none)
    chatsChanged = Signal()  # titles or activity order changed
    streamsChanged = Signal()  # a chat started or stopped generating (generating_chats)
    errorRaised = Signal(str, str)  # title, text
    turnFinished = Signal(int)  # chat id
    regenerateChanged = Signal(bool)  # whether the chat in view has a reply to regenerate

    def __init__(self, store, bridge, view: ConversationView, app_settings: AppSettings,
                 tools: ToolTurns, thinking: ThinkingControls,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store, self.bridge, self.view = store, bridge, view
        self.app_settings = app_settings
        self.tools, self.thinking = tools, thinking
        self.chat_id: int | None = None
        self.sessions: dict[int, ChatSession] = {}  # chat id -> its session
        self.pending = PendingSend(bridge, view, self._send_to, self)
        self.gauge = ContextGauge(bridge, view, self)
        self.attach = AttachControls(bridge, view, self)
        view.sendRequested.connect(self.send)
        view.stopRequested.connect(self.stop)
        view.regenerateRequested.connect(self.regenerate)
        view.continueRequested.connect(self.continue_reply)
        view.switchRequested.connect(self.switch)
        view.editSubmitted.connect(self.edit)
        view.keepRequested.connect(self.keep)
        bridge.tokenArrived.connect(self._on_token)
        bridge.promptProgress.connect(self._on_prompt_progress)
        bridge.requestFinished.connect(self._on_finished)
        bridge.requestFailed.connect(self._on_failed)
        for signal in (bridge.modelLoaded, bridge.modelUnloaded):
            signal.connect(lambda *_: self.update_gauge())
            signal.connect(lambda *_: self._update_regenerate())
        bridge.modelLoaded.connect(lambda *_: self._load_ahead())
        bridge.companionReady.connect(self._on_companion_ready)
        bridge.companionFailed.connect(self._on_companion_failed)

    # -- sessions ----------------------------------------------------------------------
    @property
    def current(self) -> ChatSession | None:
        """The session of the chat in view."""
        return None if self.chat_id is None else self.sessions.get(self.chat_id)

    def _session(self, chat_id: int) -> ChatSession:
        session = self.sessions.get(chat_id)
        if session is None:
            session = ChatSession(chat_id, self.store, self.bridge, self.tools, self.thinking,
                                  self)
            session.replyDelta.connect(self._on_delta)
            session.readingChanged.connect(self._on_reading)
            session.replyFinished.connect(self._on_reply_finished)
            session.changed.connect(self._on_changed)
            session.streamsChanged.connect(self._on_streams_changed)
            session.messageSent.connect(self.view.clear_composer)
            session.chatsChanged.connect(self.chatsChanged)
            session.turnFinished.connect(self.turnFinished)
            session.errorRaised.connect(self.errorRaised)
            self.sessions[chat_id] = session
        return session

    def _release(self, chat_id: int | None) -> None:
        """Let go of the session of a chat out of view that holds nothing more."""
        session = self.sessions.get(chat_id) if chat_id is not None else None
        if session is not None and chat_id != self.chat_id and session.idle:
            del self.sessions[chat_id]
            session.deleteLater()  # it may be emitting still

    def _owner(self, request_id: str) -> ChatSession | None:
        return next((s for s in self.sessions.values() if s.owns(request_id)), None)

    def _session_of(self, message_id: int) -> ChatSession:
        return self._session(self.store.get_message(message_id).chat_id)

    @property
    def generating(self) -> bool:
        """Whether any chat is generating."""
        return any(s.generating for s in self.sessions.values())

    def is_generating(self, chat_id: int | None) -> bool:
        session = self.sessions.get(chat_id) if chat_id is not None else None
        return session is not None and session.generating

    def generating_chats(self) -> set[int]:
        return {chat_id for chat_id, s in self.sessions.items() if s.generating}

    # -- chats -------------------------------------------------------------------------
    def new_chat(self) -> int:
        """A new chat, opened; the chat in view itself when it is still empty (the sidebar
        does not pile up "New chat" entries)."""
        if self.chat_id is not None and self._is_empty(self.chat_id):
            return self.chat_id
        defaults = ChatSettings.from_dict(self.app_settings.chat_defaults.to_dict())
        chat = self.store.create_chat(DEFAULT_TITLE, defaults)
        self.chatsChanged.emit()
        self.open_chat(chat.id)
        return chat.id

    def open_chat(self, chat_id: int | None) -> None:
        left, self.chat_id = self.chat_id, chat_id
        if chat_id is not None:
            self._session(chat_id)
        self._release(left)
        if left is not None and left != chat_id:
            self._drop_if_empty(left)
        self.render()
        self.chatOpened.emit(chat_id or 0)
        self._load_ahead()

    def _load_ahead(self) -> None:
        """The chat in view (opened, or there when a model loads) gets its history's KV
        blocks from disk now, while the user types, not when the next turn is sent."""
        if self.current is not None:
            self.current.preload()

    def _is_empty(self, chat_id: int) -> bool:
        """Nobody wrote in it: no message, the default title, no message waiting for the
        model to be sent there."""
        try:
            chat = self.store.get_chat(chat_id)
        except KeyError:
            return False
        held = self.pending.message
        return (chat.title == DEFAULT_TITLE and self.store.active_leaf(chat_id) is None
                and (held is None or held.chat_id != chat_id))

    def _drop_if_empty(self, chat_id: int) -> None:
        """An empty chat left behind (another opened, or the app closing) is not kept."""
        if self._is_empty(chat_id):
            session = self.sessions.pop(chat_id, None)
            if session is not None:
                session.deleteLater()
            self.store.delete_chat(chat_id)
            self.chatsChanged.emit()

    def leave(self) -> None:
        """The window closes: the chat in view goes too if it is empty."""
        if self.chat_id is None:
            return
        try:
            self._drop_if_empty(self.chat_id)
        except sqlite3.ProgrammingError:
            pass  # the store was closed before the window: the chat stays, harmlessly

    def delete_chat(self, chat_id: int) -> None:
        session = self.sessions.pop(chat_id, None)
        if session is not None:
            session.close()
            session.deleteLater()
        self.store.delete_chat(chat_id)
        self._set_generating()
        if self.chat_id == chat_id:
            self.open_chat(None)
        self.chatsChanged.emit()

    def render(self) -> None:
        session = self.current
        self.view.show_items(session.items() if session is not None else [])
        for stream in session.streams.values() if session is not None else ():
            show_reading(self.view, stream)
        self.view.set_generating(self.is_generating(self.chat_id))
        self._update_regenerate()
        self.update_gauge()
        self.chatShown.emit(self.chat_id or 0)

    def can_regenerate(self) -> bool:
        """A model is loaded, the chat in view is idle and has a message to answer again
        (its last reply, or a user message whose reply failed)."""
        session = self.current
        return (session is not None and self.bridge.is_loaded and not session.generating
                and self.store.active_leaf(session.chat_id) is not None)

    def _update_regenerate(self) -> None:
        enabled = self.can_regenerate()
        self.view.set_can_regenerate(enabled)
        self.regenerateChanged.emit(enabled)

    def update_gauge(self) -> None:
        """The context gauge of the chat in view: what the engine counted for it."""
        session = self.current
        self.gauge.show(session.context_tokens() if session is not None else 0,
                        session.context_note if session is not None else "")

    # -- the view's requests -----------------------------------------------------------
    def send(self, text: str) -> None:
        text = text.strip()
        if not text and not self.view.attachments():
            return
        if self.is_generating(self.chat_id) or self.pending.waiting:
            return
        if not self.bridge.is_loaded:
            if self.bridge.is_loading:
                self.pending.hold(self.chat_id, text)
                return
            self.errorRaised.emit("No model loaded", "Load a model from the model picker in "
                                  "the toolbar, then send your message again.")
            return
        self._send_to(self.chat_id, text)

    def _send_to(self, chat_id: int | None, text: str) -> None:
        """Send `text` in chat `chat_id` (a new chat for None or a chat deleted since)."""
        try:
            chat = self.store.get_chat(chat_id) if chat_id is not None else None
        except KeyError:
            chat = None
        session = self._session(chat.id if chat is not None else self.new_chat())
        session.send(text, self.view.attachments())  # the draft's, held while it waited
        self._release(session.chat_id)  # refused in a chat out of view: nothing to keep

    def edit(self, message_id: int, text: str) -> None:
        session = self._session_of(message_id)
        if self.bridge.is_loaded and not session.generating:
            session.edit(message_id, text)

    def regenerate(self, message_id: int = 0) -> None:
        session = self.current
        if session is not None and not session.generating and self.bridge.is_loaded:
            session.regenerate(message_id)

    def continue_reply(self, message_id: int) -> None:
        """Extend a cut-off reply in place ("Continue" under it)."""
        session = self.current
        if session is not None and not session.generating and self.bridge.is_loaded:
            session.continue_reply(message_id)

    def continue_after(self, chat_id: int, parent_id: int) -> None:
        """The reply after tool results (ToolTurns.continueRequested)."""
        session = self._session(chat_id)
        if self.bridge.is_loaded and not session.generating:
            session.continue_after(parent_id)
        self._release(chat_id)

    def keep(self, message_id: int) -> None:
        self._session_of(message_id).keep(message_id)

    def switch(self, message_id: int, step: int) -> None:
        session = self.current
        if session is not None and not session.generating:
            session.switch(message_id, step)

    def stop(self) -> None:
        """Stop the replies of the chat in view (other chats keep generating), or take
        back a message waiting for the model."""
        self.pending.cancel()
        if self.current is not None:
            self.current.stop()

    def stop_all(self) -> None:
        for session in self.sessions.values():
            session.stop()

    def refresh_chat(self, chat_id: int) -> None:
        """Something of the chat changed (ToolTurns.chatChanged): shown again if open."""
        if chat_id == self.chat_id:
            self.render()

    # -- the bridge's events, to the session of their request -----------------------
    def _on_token(self, request_id: str, index: int, parts: tuple) -> None:
        session = self._owner(request_id)
        if session is not None:
            session.on_token(request_id, index, parts)

    def _on_prompt_progress(self, request_id: str, progress) -> None:
        session = self._owner(request_id)
        if session is not None:
            session.on_prompt_progress(request_id, progress)

    def _on_finished(self, request_id: str, output) -> None:
        session = self._owner(request_id)
        if session is not None:
            session.on_finished(request_id, output)

    def _on_failed(self, request_id: str, message: str) -> None:
        session = self._owner(request_id)
        if session is not None:
            session.on_failed(request_id, message)

    def _on_companion_ready(self, source: str) -> None:
        for session in list(self.sessions.values()):
            session.compare.ready(source)

    def _on_companion_failed(self, source: str, message: str) -> None:
        for session in list(self.sessions.values()):
            session.compare.failed(source, message)
            self._release(session.chat_id)

    # -- what sessions say, to the view while their chat is open ------------------------
    def _on_delta(self, chat_id: int, message_id: int, thought: str, text: str) -> None:
        if chat_id != self.chat_id:
            return
        if thought:
            self.view.append_thinking(message_id, thought)
        if text:
            self.view.append_text(message_id, text)

    def _on_reading(self, chat_id: int, request_id: str) -> None:
        if chat_id == self.chat_id:
            show_reading(self.view, self.current.streams.get(request_id))

    def _on_reply_finished(self, chat_id: int, message) -> None:
        if chat_id == self.chat_id:
            self.view.finish_message(message)

    def _on_changed(self, chat_id: int) -> None:
        if chat_id == self.chat_id:
            self.render()

    def _on_streams_changed(self, chat_id: int) -> None:
        self._set_generating()
        self.update_gauge()
        self._release(chat_id)

    def _set_generating(self) -> None:
        self.view.set_generating(self.is_generating(self.chat_id))
        self._update_regenerate()
        self.streamsChanged.emit()

    # -- for the memory panel ------------------------------------------------------------
    def chat_of_request(self, request_id: str) -> int | None:
        """The chat whose session runs `request_id` (controllers.dock_lookups asks)."""
        session = self._owner(request_id)
        return None if session is None else session.chat_id
