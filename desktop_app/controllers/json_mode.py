"""A chat's "Answer in JSON", between the composer's button and the chat's settings."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QWidget

from desktop_app.data import beam_choice
from desktop_app.data.json_mode import METRIC
from desktop_app.widgets.json_mode import JsonModeButton, JsonModeDialog


class JsonModeController(QObject):
    """The composer's JSON button for the chat in view (``show_chat``): it shows the chat's
    mode and opens the dialog that changes it; ``reply_metrics`` is what each reply
    records of it."""

    def __init__(self, store, button: JsonModeButton, dialog_parent: QWidget,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store, self.button, self._dialog_parent = store, button, dialog_parent
        self.chat_id: int | None = None
        self.dialog: JsonModeDialog | None = None  # the open one, for tests to drive
        button.clicked.connect(self.edit)

    def show_chat(self, chat_id: int) -> None:
        """The chat in view changed (0: none)."""
        self.chat_id = chat_id or None
        self.refresh()

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
                                     self._dialog_parent)
        self.dialog.finished.connect(self._closed)
        self.dialog.open()

    def _closed(self, result: int) -> None:
        dialog, self.dialog = self.dialog, None
        settings = self._settings()
        if dialog is not None and result == JsonModeDialog.DialogCode.Accepted and settings:
            on, schema = dialog.values()
            # The dialog checked the schema already: this cannot raise.
            updated = replace(settings, json_mode=on, json_schema=schema)
            self.store.update_chat_settings(self.chat_id, updated)
        self.refresh()

    def _settings(self):
        return None if self.chat_id is None else self.store.get_chat(self.chat_id).settings


def reply_metrics(params) -> dict:
    """The metrics entries a reply made under ``params`` keeps: its response format, or
    a beam search's width (data.beam_choice)."""
    fmt, width = params.response_format, beam_choice.beam_width(params)
    return {**({} if fmt is None else {METRIC: fmt.type}),
            **({beam_choice.METRIC: width} if width else {})}
