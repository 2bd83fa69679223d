"""``HarmonyParser``: gpt-oss's "harmony" replies split as they stream.

A harmony reply is a run of messages, each a header and a body::

    <|channel|>analysis<|message|>Let me think…<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

(the prompt wrote the first ``<|start|>assistant``). The header's channel says what the
body is: ``analysis`` the model's thinking, ``final`` the answer, ``commentary`` a
preamble shown with the answer; a header naming a recipient (``to=functions.NAME``) makes
the body a call's JSON arguments, held until the message ends and checked whole, as the
tool parsers do: a valid object becomes a call, anything else goes out as answer text.
Bodies are stripped of surrounding whitespace and two of a kind are joined by a blank
line, so the same reply splits the same however it was cut. Its markers are special
tokens: the reply must be decoded with them kept (``skip_special_tokens=False``).
"""

from __future__ import annotations

import json
import re

from engine.outputs import CallArguments, CallStart, ReplyEvent, TextDelta, Thinking
from engine.text.reasoning.events import HeldText, partial_tag
from engine.tools.format import openai_call_id

START, MESSAGE = "<|start|>", "<|message|>"
# What ends a body: the message's end, a call, the reply's end, or (a model that skipped
# <|end|>) the next message's start.
ENDS = ("<|end|>", "<|call|>", "<|return|>", START)
_CHANNEL = re.compile(r"<\|channel\|>\s*([\w.-]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_HEADER, _BODY, _BETWEEN = "header", "body", "between"
_JOIN = "\n\n"


class HarmonyParser(HeldText):
    """``opened``: what the prompt already wrote of the reply's first header (after its
    ``<|start|>``: ``assistant``, or a whole header ending ``<|message|>`` when the prompt
    chose the channel)."""

    __slots__ = ("_call", "_calls", "_kind", "_lead", "_said", "_state")

    def __init__(self, opened: str = "assistant") -> None:
        super().__init__(opened)
        self._state = _HEADER
        self._kind: type = TextDelta  # what the open body is
        self._call: str | None = None  # the open body's recipient, when it is a call
        self._lead = True  # the open body has shown nothing but whitespace yet
        self._said: set[type] = set()  # kinds that have shown text (joined by _JOIN)
        self._calls = 0
        self._step([])  # the prompt's part of the header is never output

    @property
    def thinking(self) -> bool:
        return self._state == _BODY and self._kind is Thinking and self._call is None

    def finish(self) -> list[ReplyEvent]:
        """A reply cut short (max_tokens, a stop) ends its open body as it stands."""
        out: list[ReplyEvent] = []
        if self._state == _BODY:
            self._end_body(self._held, out)
        self._held = ""
        return out

    def _step(self, out: list[ReplyEvent]) -> bool:
        held = self._held
        if self._state == _HEADER:
            at = held.find(MESSAGE)
            if at < 0:
                return False
            header, self._held = held[:at], held[at + len(MESSAGE):]
            channel = _CHANNEL.search(header)
            recipient = _RECIPIENT.search(header)
            kind = Thinking if channel and channel.group(1) == "analysis" else TextDelta
            self._open(kind, recipient.group(1) if recipient else None)
            return True
        if self._state == _BETWEEN:
            at = held.find(START)
            if at < 0:
                keep = partial_tag(held, (START,))
                self._held = held[len(held) - keep:] if keep else ""
                return False
            self._state, self._held = _HEADER, held[at + len(START):]
            return True
        ends = [(held.find(e), e) for e in ENDS if e in held]
        if ends:
            at, end = min(ends)
            self._end_body(held[:at], out)
            self._held = held[at + (0 if end == START else len(end)):]
            return True
        if self._call is None:  # stream the body, holding what may be an end marker
            cut = len(held[: len(held) - partial_tag(held, ENDS)].rstrip())
            self._emit(held[:cut], out)
            self._held = held[cut:]
        return False

    def _open(self, kind: type, recipient: str | None) -> None:
        self._state, self._kind, self._call, self._lead = _BODY, kind, recipient, True

    def _end_body(self, body: str, out: list[ReplyEvent]) -> None:
        self._state = _BETWEEN
        if self._call is None:
            self._emit(body.rstrip(), out)
            return
        name = self._call.removeprefix("functions.")
        try:
            valid = isinstance(json.loads(body), dict)
        except ValueError:
            valid = False
        if not valid:
            self._kind = TextDelta
            self._emit(body.strip(), out)
            return
        index, self._calls = self._calls, self._calls + 1
        out += [CallStart(index, openai_call_id(), name), CallArguments(index, body.strip())]

    def _emit(self, text: str, out: list[ReplyEvent]) -> None:
        if self._lead:
            text = text.lstrip()
            if not text:
                return
            self._lead = False
            if self._kind in self._said:
                text = _JOIN + text
            self._said.add(self._kind)
        if text:
            out.append(self._kind(text))
