"""A chat's "Answer in JSON", between the composer's button and the chat's settings."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QObject

from desktop_app.data.json_mode import METRIC
from desktop_app.widgets.json_mode import JsonModeButton, JsonModeDialog


class JsonModeController(QObject):
    """Owned by the ChatController: the button shows the chat in view's mode and opens
    the dialog that changes it; ``reply_metrics`` is what each reply records of it."""

    def __init__(self, chats, button: JsonModeButton) -> None:
        super().__init__(chats)
        self.chats, self.button = chats, button
        self.dialog: JsonModeDialog | None = None  # the open one, for tests to drive
        button.clicked.connect(self.edit)

    def refresh(self) -> None:
        settings = self._settings()
        self.button.setEnabled(settings is not None)
        self.button.show_mode(bool(settings and settings.json_mode),
                              settings.json_schema if settings else "")

    def edit(self) -> None:
        settings = self._settings()
        if settings is None:
            self.refresh()
            return
        self.dialog = JsonModeDialog(settings.json_mode, settings.json_schema,
                                     self.chats.view)
        self.dialog.finished.connect(self._closed)
        self.dialog.open()

    def _closed(self, result: int) -> None:
        dialog, self.dialog = self.dialog, None
        settings = self._settings()
        if dialog is not None and result == JsonModeDialog.DialogCode.Accepted and settings:
            on, schema = dialog.values()
            # The dialog checked the schema already: this cannot raise.
            updated = replace(settings, json_mode=on, json_schema=schema)
            self.chats.store.update_chat_settings(self.chats.chat_id, updated)
        self.refresh()

    def _settings(self):
        chat_id = self.chats.chat_id
        return None if chat_id is None else self.chats.store.get_chat(chat_id).settings


def reply_metrics(params) -> dict:
    """The metrics entry a reply made under ``params`` keeps: its response format."""
    fmt = params.response_format
    return {} if fmt is None else {METRIC: fmt.type}
