"""The memory dock's questions about chats, answered without the database while nothing
changed: which chat a block's owner belongs to (its title), whether an owner is the open
chat's, and how many tokens the open chat holds.

The dock asks for every block of the pool on each refresh, a few times a second while the
engine runs; a title or a token count read from the store each time is a query and a parse
of the chat's settings per block. Owners map to chats through the controller's sessions
(in memory); titles and the open chat's count are kept until something that can change
them happens (the signals named in `invalidate_on`).
"""

from __future__ import annotations

from PySide6.QtCore import QObject, SignalInstance

from desktop_app.controllers.context_window import branch_tokens


class DockLookups(QObject):
    def __init__(self, store, controller, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store, self.controller = store, controller
        self._titles: dict[int, str | None] = {}  # chat id -> title (None: deleted)
        self._tokens: dict[int, int] = {}  # chat id -> tokens of its open branch
        self.invalidate_on(controller.chatsChanged, controller.chatOpened,
                           controller.chatShown, controller.streamsChanged,
                           controller.turnFinished)

    def invalidate_on(self, *signals: SignalInstance) -> None:
        """Forget what is kept whenever one of `signals` fires (connected after the
        slots that make the change, so it runs once the store has it)."""
        for signal in signals:
            signal.connect(self.invalidate)

    def invalidate(self, *_args) -> None:
        self._titles.clear()
        self._tokens.clear()

    def _chat_of_request(self, owner: str) -> int | None:
        return self.controller.chat_of_request(owner.rsplit(":", 1)[0])

    def chat_of_owner(self, owner: str) -> str | None:
        """The title of the chat whose request owns a block ("request_id:index")."""
        chat_id = self._chat_of_request(owner)
        if chat_id is None:
            return None
        if chat_id not in self._titles:
            try:
                self._titles[chat_id] = self.store.get_chat(chat_id).title
            except KeyError:
                self._titles[chat_id] = None
        return self._titles[chat_id]

    def in_open_chat(self, owner: str) -> bool:
        """Whether a block's owner is a request of the chat in view."""
        chat_id = self.controller.chat_id
        return chat_id is not None and self._chat_of_request(owner) == chat_id

    def open_chat_tokens(self) -> int:
        """Tokens of the open branch as of its last reply (controllers.context_window)."""
        chat_id = self.controller.chat_id
        if chat_id is None:
            return 0
        if chat_id not in self._tokens:
            self._tokens[chat_id] = branch_tokens(self.store, chat_id)
        return self._tokens[chat_id]
