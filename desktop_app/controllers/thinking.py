"""Reasoning models in chats: the chat's "Think" switch and "Reasoning effort", shown where
the loaded model's chat template reads them.

The engine decides the rest (``engine.chat``): its prompt builder shows earlier replies'
thinking as the template wants, and its reply reader splits each reply's thinking from its
answer as it streams (the bridge's ``tokenArrived`` carries both as typed parts). What the
prompt builder reports of the template says whether the composer's Think button shows
(``enable_thinking``) and the effort box (gpt-oss's ``reasoning_effort``).
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QObject

from engine.text.reasoning.options import TemplateOptions

# A reply's metrics key: tokens of the reply before it computed again, because the
# template shows that reply without its thinking (engine/chat/history.py).
DROPPED_METRIC = "thinking_dropped_tokens"


class ThinkingControls(QObject):
    """The composer's Think button and effort box, for the chat in view (``show_chat``, on
    the GUI thread); ``options(chat)`` what a chat's prompts pass the template."""

    def __init__(self, store, bridge, button, effort_box, parent: QObject | None = None
                 ) -> None:
        super().__init__(parent)
        self.store, self.bridge = store, bridge
        self.chat_id: int | None = None
        self.button = button
        self.button.toggled.connect(self._switched)
        self.effort_box = effort_box
        self.effort_box.effortChosen.connect(self._effort_chosen)
        # What the template reads changes with the model.
        for signal in (bridge.modelLoaded, bridge.modelUnloaded):
            signal.connect(lambda *_: self.refresh())

    def _template(self) -> tuple[bool, bool]:
        """(the template reads enable_thinking, it reads reasoning_effort)."""
        prompts = self.bridge.prompts if self.bridge.is_loaded else None
        if prompts is None:
            return False, False
        return prompts.has_think_switch, prompts.has_effort_setting

    def options(self, chat) -> TemplateOptions:
        """The chat's Think switch and reasoning effort, each where the template reads it."""
        switch, effort = self._template()
        return TemplateOptions(chat.settings.think if switch else None,
                               chat.settings.reasoning_effort if effort else None)

    def show_chat(self, chat_id: int) -> None:
        """The chat in view changed (0: none)."""
        self.chat_id = chat_id or None
        self.refresh()

    def refresh(self) -> None:
        chat_id = self.chat_id
        switch, effort = self._template() if chat_id is not None else (False, False)
        settings = self.store.get_chat(chat_id).settings if chat_id is not None else None
        self.button.setVisible(switch)
        if switch:
            self.button.blockSignals(True)
            self.button.setChecked(settings.think)
            self.button.blockSignals(False)
        self.effort_box.setVisible(effort)
        if effort:
            self.effort_box.show_effort(settings.reasoning_effort)

    def _effort_chosen(self, effort: str | None) -> None:
        if self.chat_id is None:
            return
        settings = self.store.get_chat(self.chat_id).settings
        self.store.update_chat_settings(self.chat_id, replace(settings,
                                                              reasoning_effort=effort))

    def _switched(self, on: bool) -> None:
        if self.chat_id is None:
            return
        settings = self.store.get_chat(self.chat_id).settings
        self.store.update_chat_settings(self.chat_id, replace(settings, think=on))
