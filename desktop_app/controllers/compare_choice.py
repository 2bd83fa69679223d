"""The open chat's "Compare with" choice: what the toolbar's CompareButton shows and where
its changes are kept (the chat's ChatSettings.compare_models; with no chat open, the
defaults for new chats). The models offered are the picker's local ones."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject

from desktop_app.data.servers import is_remote_source
from desktop_app.services import sources
from desktop_app.widgets.compare_button import CompareButton


class CompareChoice(QObject):
    def __init__(self, store, controller, bridge, settings, persist: Callable,
                 button: CompareButton, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store, self.controller, self.bridge = store, controller, bridge
        self.settings, self._persist, self.button = settings, persist, button
        button.changed.connect(self._on_changed)
        controller.chatOpened.connect(lambda _chat_id: self.show())
        bridge.modelLoaded.connect(lambda _name: self.show())

    def _chat_settings(self):
        chat_id = self.controller.chat_id
        return (self.store.get_chat(chat_id).settings if chat_id is not None
                else self.settings.chat_defaults)

    def show(self) -> None:
        local = [s for s in sources.picker_sources(self.settings, self.bridge.source)
                 if not is_remote_source(s)]
        self.button.blockSignals(True)
        self.button.set_models([(sources.display_name(s), s) for s in local],
                               self._chat_settings().compare_models, self.bridge.source)
        self.button.blockSignals(False)

    def _on_changed(self, chosen: list[str]) -> None:
        chat_id = self.controller.chat_id
        if chat_id is None:
            self.settings.chat_defaults.compare_models = list(chosen)
            self._persist(self.settings)
        else:
            chat = self.store.get_chat(chat_id)
            chat.settings.compare_models = list(chosen)
            self.store.update_chat_settings(chat_id, chat.settings)
        self.show()
        for source in chosen:
            self.bridge.prepare(source)  # loaded now, while the user types
