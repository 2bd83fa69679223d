"""``ThinkParser``: a reply written as ``<think>…</think>`` then the answer (Qwen 3,
DeepSeek-R1, QwQ...), split as it streams.

Templates differ in who writes the opening tag: some leave it to the model, others
(DeepSeek-R1's, Qwen 3's thinking variants) end the prompt with ``<think>`` so the reply
starts inside the thinking (``in_thinking``). The opening tag counts only at the reply's
start, so an answer that talks about the tag stays an answer. A tag cut across deltas is
held until it is whole; the whitespace around the tags is dropped (the model writes
``\\n\\n`` after ``</think>``), so the same reply splits the same however it was cut. A
reply that ends inside its thinking has no answer.
"""

from __future__ import annotations

from engine.outputs import ReplyEvent, TextDelta, Thinking
from engine.text.reasoning.events import HeldText, partial_tag

OPEN, CLOSE = "<think>", "</think>"
_START, _THINKING, _ANSWER = "start", "thinking", "answer"


class ThinkParser(HeldText):
    """``feed(delta)`` as the reply streams, ``finish()`` at its end."""

    __slots__ = ("_lead", "_state")

    def __init__(self, in_thinking: bool = False) -> None:
        super().__init__()
        self._state = _THINKING if in_thinking else _START
        self._lead = True  # the current part has shown nothing but whitespace yet

    @property
    def thinking(self) -> bool:
        """The text that comes next is (still) thinking."""
        return self._state == _THINKING

    def finish(self) -> list[ReplyEvent]:
        out: list[ReplyEvent] = []
        held, self._held = self._held, ""
        if self._state == _THINKING:
            self._emit(Thinking, held.rstrip(), out)
        else:  # a reply that is only whitespace, or half an opening tag: an answer
            self._emit(TextDelta, held, out)
        return out

    def _step(self, out: list[ReplyEvent]) -> bool:
        """One move of the state machine; False when it waits for more text."""
        held = self._held
        if self._state == _START or (self._state == _THINKING and self._lead):
            bare = held.lstrip()
            if bare.startswith(OPEN):
                self._held, self._state, self._lead = bare[len(OPEN):], _THINKING, True
                return True
            if OPEN.startswith(bare):
                return False  # nothing yet, or the opening tag still arriving
            if self._state == _START:
                self._state = _ANSWER
                return True
        if self._state == _THINKING:
            at = held.find(CLOSE)
            if at >= 0:
                self._emit(Thinking, held[:at].rstrip(), out)
                self._held, self._state, self._lead = held[at + len(CLOSE):], _ANSWER, True
                return True
            cut = len(held[: len(held) - partial_tag(held, (CLOSE,))].rstrip())
            self._emit(Thinking, held[:cut], out)
            self._held = held[cut:]
            return False
        self._emit(TextDelta, held, out)
        self._held = ""
        return False

    def _emit(self, kind: type, text: str, out: list[ReplyEvent]) -> None:
        if self._lead:
            text = text.lstrip()
        if text:
            self._lead = False
            out.append(kind(text))
