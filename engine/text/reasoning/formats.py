"""Which reasoning format a model writes, read from its chat template (as vLLM picks a
reasoning parser per model), and the reader that follows one candidate's reply in it.

A template that writes ``<think>`` (Qwen 3, DeepSeek-R1, QwQ) or harmony's channels
(gpt-oss) gets that format; any other shows no reasoning and its replies stay answers.
Where the reply starts is read from the end of the prompt the template rendered: a prompt
ending in ``<think>`` (DeepSeek-R1's, or Qwen 3's with thinking forced) starts the reply
inside its thinking; a harmony prompt may have chosen the channel already.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.outputs import ReplyEvent, Thinking
from engine.text.reasoning.harmony import START, HarmonyParser
from engine.text.reasoning.think import CLOSE, OPEN, ThinkParser

Parser = ThinkParser | HarmonyParser
# The prompt's last tokens, decoded with special tokens, are enough to see how the reply
# opens (a generation prompt is a few tokens; a harmony call's header, which a forced
# call opens the reply with, a few more: its function's name).
TAIL_TOKENS = 64
SWITCH = "enable_thinking"  # the template variable that turns thinking on and off
EFFORT = "reasoning_effort"  # the one that sets how long it thinks (harmony's)


def _think_parser(tail: str) -> Parser:
    return ThinkParser(in_thinking=tail.rstrip().endswith(OPEN))


def _harmony_parser(tail: str) -> Parser:
    at = tail.rfind(START)
    return HarmonyParser(tail[at + len(START):] if at >= 0 else "assistant")


@dataclass(slots=True, frozen=True)
class ReasoningFormat:
    name: str
    template_hints: tuple[str, ...]
    # Its markers are special tokens: replies are decoded with them kept.
    keeps_special_tokens: bool
    _make: Callable[[str], Parser]

    def parser(self, prompt_tail: str) -> Parser:
        """A parser for a reply to a prompt ending in ``prompt_tail``."""
        return self._make(prompt_tail)

    def reader(self, tokenizer, prompt_ids: Sequence[int]) -> ReasoningReader:
        """``tokenizer``: anything with ``decode(ids, skip_special_tokens=...)``."""
        tail = tokenizer.decode(list(prompt_ids[-TAIL_TOKENS:]), skip_special_tokens=False)
        return ReasoningReader(self.parser(tail))


THINK = ReasoningFormat("think", (OPEN, CLOSE), False, _think_parser)
HARMONY = ReasoningFormat("harmony", ("<|channel|>",), True, _harmony_parser)
FORMATS = (HARMONY, THINK)  # harmony first: its templates may mention other tags


def reasoning_format(chat_template: str | None) -> ReasoningFormat | None:
    """The format replies to this template are written in; None: no reasoning."""
    for fmt in FORMATS:
        if chat_template and any(h in chat_template for h in fmt.template_hints):
            return fmt
    return None


def has_think_switch(chat_template: str | None) -> bool:
    """The template reads ``enable_thinking``: thinking can be turned on and off."""
    return bool(chat_template) and SWITCH in chat_template


def has_effort_setting(chat_template: str | None) -> bool:
    """The template reads ``reasoning_effort``: how hard the model thinks can be set."""
    return bool(chat_template) and EFFORT in chat_template


class ReasoningReader:
    """One candidate's reply read through its parser, counting the tokens and the time
    the thinking took. ``feed`` takes each delta with the number of tokens it brought: a
    token that arrives, or leaves the parser, inside the thinking is a thinking token, and
    so are the tokens held before it that showed nothing (an opening tag spelled out in
    several tokens, a harmony header)."""

    __slots__ = ("_held", "_since", "parser", "thinking_s", "thinking_tokens")

    def __init__(self, parser: Parser) -> None:
        self.parser = parser
        self.thinking_tokens = 0
        self.thinking_s = 0.0
        self._since: float | None = None
        self._held = 0

    def feed(self, text: str, num_tokens: int = 1,
             now: float | None = None) -> list[ReplyEvent]:
        before = self.parser.thinking
        events = self.parser.feed(text) if text else []
        thought = before or self.parser.thinking or any(isinstance(e, Thinking)
                                                        for e in events)
        if thought:
            self.thinking_tokens += num_tokens + self._held
            self._held = 0
        else:
            self._held = 0 if events else self._held + num_tokens
        self._clock(now, thought)
        return events

    def replay(self, text: str) -> list[ReplyEvent]:
        """A continued reply's text so far: the parser's state, not the counts."""
        return self.parser.feed(text) if text else []

    def finish(self, now: float | None = None) -> list[ReplyEvent]:
        self._clock(now, False)
        return self.parser.finish()

    def _clock(self, now: float | None, thought: bool) -> None:
        now = time.monotonic() if now is None else now
        if self._since is not None:
            self.thinking_s += now - self._since
        self._since = now if thought and self.parser.thinking else None
