"""Reasoning models in chats: each reply's thinking split from its answer as it streams,
the chat's "Think" switch and "Reasoning effort", and earlier replies' thinking in the
history as the template wants it.

The loaded model's chat template decides everything (``engine.text.reasoning``): which
format its replies are written in (none: replies stay answers), whether it has the
``enable_thinking`` switch (the composer's Think button shows only then) and the
``reasoning_effort`` setting (gpt-oss's: the effort box shows only then), and whether it
shows earlier replies' thinking. A template that leaves it out (Qwen 3's, gpt-oss's) gets
earlier replies as their answer text, not their exact ids, so the prompt is what the model
was trained on; the reply before the new message was cached with its thinking, so its
answer is computed again, and the new reply's metrics say how many tokens that was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from PySide6.QtCore import QObject

from desktop_app.controllers.context_window import chat_tokenizer
from engine.text.reasoning import HARMONY, ReasoningReader, Thinking, reasoning_format
from engine.text.reasoning.formats import has_effort_setting, has_think_switch
from engine.text.reasoning.options import TemplateOptions
from engine.tools.events import CallArguments, CallStart, TextDelta, assemble

PROBE = "FolioThinkingProbe"
DROPPED_METRIC = "thinking_dropped_tokens"


@dataclass(slots=True)
class _Template:
    """What the loaded model's template does with thinking, read once per tokenizer."""

    fmt: object = None  # ReasoningFormat, or None: no reasoning
    switch: bool = False  # it reads enable_thinking
    effort: bool = False  # it reads reasoning_effort
    drops_history: bool = False  # earlier replies are shown without their thinking
    tails: dict[bool | None, str] = field(default_factory=dict)  # generation prompt


class ThinkingReplies(QObject):
    """Owned by the ChatController, on the GUI thread."""

    def __init__(self, chats, parent: QObject | None = None) -> None:
        super().__init__(parent or chats)
        self.chats = chats
        self._template: tuple[object, _Template] | None = None
        self._readers: dict[tuple[str, int], ReasoningReader] = {}
        # Calls a reply's channels carried (harmony), by (request id, candidate).
        self._calls: dict[tuple[str, int], list] = {}
        button = getattr(chats.view, "think_button", None)
        self.button = button
        if button is not None:
            button.toggled.connect(self._switched)
        self.effort_box = getattr(chats.view, "effort_box", None)
        if self.effort_box is not None:
            self.effort_box.effortChosen.connect(self._effort_chosen)

    # -- the model ---------------------------------------------------------------------
    def template(self) -> _Template:
        tokenizer = self.chats.bridge.tokenizer if self.chats.bridge.is_loaded else None
        if self._template is None or self._template[0] is not tokenizer:
            self._template = (tokenizer, _read_template(chat_tokenizer(tokenizer)))
        return self._template[1]

    def options(self, chat) -> TemplateOptions:
        """What the prompt passes to the template: the chat's Think switch and reasoning
        effort, each where the template reads it."""
        info = self.template()
        return TemplateOptions(chat.settings.think if info.switch else None,
                               chat.settings.reasoning_effort if info.effort else None)

    # -- the prompt --------------------------------------------------------------------
    def adjust(self, params) -> None:
        """A format whose markers are special tokens (harmony) reads them in the text."""
        fmt = self.template().fmt
        if fmt is not None and fmt.keeps_special_tokens:
            params.skip_special_tokens = False

    def prepare(self, chat, messages: list[dict]) -> tuple[list[dict], dict]:
        """The messages as the template wants earlier replies, and what the replies'
        metrics record of it (the tokens computed again)."""
        info = self.template()
        out, cost = [], 0
        last_reply = max((i for i, m in enumerate(messages) if m["role"] == "assistant"),
                         default=-1)
        tokenizer = chat_tokenizer(self.chats.bridge.tokenizer)
        for i, message in enumerate(messages):
            thinking = message.get("thinking")
            message = {k: v for k, v in message.items() if k != "thinking"}
            if info.fmt is HARMONY:
                # Its template writes each reply's headers again, so no reply is spliced
                # as its ids; a call's reasoning goes along (shown in the turn it serves).
                if thinking and message.get("tool_calls"):
                    message["reasoning_content"] = thinking
                if thinking and i == last_reply and message.get("token_ids") and tokenizer:
                    cost = len(tokenizer.encode(message["content"], add_special_tokens=False))
                message.pop("token_ids", None)
            elif thinking and info.fmt is not None and info.drops_history:
                if i == last_reply and message.get("token_ids") and tokenizer is not None:
                    cost = len(tokenizer.encode(message["content"], add_special_tokens=False))
                message.pop("token_ids", None)
            elif thinking and "token_ids" not in message and info.fmt is not None:
                message["content"] = f"<think>\n{thinking}\n</think>\n\n{message['content']}"
            out.append(message)
        return out, ({DROPPED_METRIC: cost} if cost else {})

    def prompt(self, chat, messages: list[dict]):
        """What the bridge submits: the messages, or their ids where the Think switch or
        the reasoning effort has to reach the template."""
        variables = self.options(chat).variables()
        tokenizer = chat_tokenizer(self.chats.bridge.tokenizer)
        if not variables or tokenizer is None:
            return messages
        return tokenizer.encode_chat(messages, **variables)

    # -- the replies -------------------------------------------------------------------
    def start(self, request_id: str, chat, n: int) -> None:
        info = self.template()
        if info.fmt is None:
            return
        flag = self.options(chat).enable_thinking
        if flag not in info.tails:
            info.tails[flag] = _generation_prompt(chat_tokenizer(self.chats.bridge.tokenizer),
                                                  flag)
        for index in range(n):
            self._readers[(request_id, index)] = ReasoningReader(
                info.fmt.parser(info.tails[flag]))

    def reading(self, request_id: str, index: int) -> bool:
        """The reply is read for thinking (its model's template shows reasoning)."""
        return (request_id, index) in self._readers

    def split(self, request_id: str, index: int, text: str) -> tuple[str, str]:
        """A delta as (thinking, answer)."""
        reader = self._readers.get((request_id, index))
        if reader is None:
            return "", text
        return self._read((request_id, index), reader.feed(text, 1, time.monotonic()))

    def finish(self, request_id: str, index: int) -> tuple[str, str, dict]:
        """What was held back, as (thinking, answer), and the reply's thinking metrics."""
        reader = self._readers.pop((request_id, index), None)
        if reader is None:
            return "", "", {}
        thinking, answer = self._read((request_id, index), reader.finish(time.monotonic()))
        metrics = ({"thinking_tokens": reader.thinking_tokens,
                    "thinking_s": round(reader.thinking_s, 3)}
                   if reader.thinking_tokens else {})
        return thinking, answer, metrics

    def calls(self, request_id: str, index: int) -> list[dict] | None:
        """The calls the reply's channels made (harmony), once it has finished."""
        events = self._calls.pop((request_id, index), None)
        if not events:
            return None
        return [{"id": c.id, "name": c.name, "arguments": c.arguments}
                for c in assemble(events)[1]]

    def forget(self, request_id: str) -> None:
        for table in (self._readers, self._calls):
            for key in [k for k in table if k[0] == request_id]:
                del table[key]

    def _read(self, key: tuple[str, int], events) -> tuple[str, str]:
        calls = [e for e in events if isinstance(e, CallStart | CallArguments)]
        if calls:
            self._calls.setdefault(key, []).extend(calls)
        return _texts(events)

    # -- the Think switch and the effort box --------------------------------------------
    def refresh(self) -> None:
        chat_id = self.chats.chat_id
        info = self.template() if chat_id is not None else None
        settings = self.chats.store.get_chat(chat_id).settings if info else None
        if self.button is not None:
            self.button.setVisible(bool(info and info.switch))
            if info and info.switch:
                self.button.blockSignals(True)
                self.button.setChecked(settings.think)
                self.button.blockSignals(False)
        if self.effort_box is not None:
            self.effort_box.setVisible(bool(info and info.effort))
            if info and info.effort:
                self.effort_box.show_effort(settings.reasoning_effort)

    def _effort_chosen(self, effort: str | None) -> None:
        chat_id = self.chats.chat_id
        if chat_id is None:
            return
        settings = self.chats.store.get_chat(chat_id).settings
        self.chats.store.update_chat_settings(chat_id, replace(settings,
                                                               reasoning_effort=effort))

    def _switched(self, on: bool) -> None:
        chat_id = self.chats.chat_id
        if chat_id is None:
            return
        settings = self.chats.store.get_chat(chat_id).settings
        self.chats.store.update_chat_settings(chat_id, replace(settings, think=on))


def _texts(events) -> tuple[str, str]:
    thinking = "".join(e.text for e in events if isinstance(e, Thinking))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    return thinking, answer


def _read_template(tokenizer) -> _Template:
    hf = getattr(tokenizer, "hf", None)
    source = getattr(hf, "chat_template", None)
    if isinstance(source, dict):
        source = "\n".join(str(t) for t in source.values())
    fmt = reasoning_format(source)
    if fmt is None:  # a template may read the effort without showing reasoning
        return _Template(effort=has_effort_setting(source))
    info = _Template(fmt, has_think_switch(source), has_effort_setting(source))
    info.drops_history = fmt is HARMONY or _drops_thinking(tokenizer)
    return info


def _drops_thinking(tokenizer) -> bool:
    """Whether the template shows an earlier reply without its <think> part."""
    reply = f"<think>\n{PROBE}\n</think>\n\nok"
    conversation = [{"role": "user", "content": "a"}, {"role": "assistant", "content": reply},
                    {"role": "user", "content": "b"}]
    try:
        text = tokenizer.hf.apply_chat_template(conversation, add_generation_prompt=True,
                                                tokenize=False)
    except Exception:  # noqa: BLE001 - a template that refuses the probe shows it as sent
        return False
    return PROBE not in text


def _generation_prompt(tokenizer, flag: bool | None) -> str:
    """How the template opens a reply (a reply may start inside its thinking)."""
    try:
        return tokenizer.hf.apply_chat_template([{"role": "user", "content": "a"}],
                                                add_generation_prompt=True, tokenize=False,
                                                **TemplateOptions(flag).variables())
    except Exception:  # noqa: BLE001 - then the reply is read from its own start
        return ""
