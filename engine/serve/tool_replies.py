"""Replies read for tool calls, in OpenAI's chat shapes.

Each candidate gets its own parser (``make_parser``: the family's ``ToolParser``, or a
``SchemaCallParser`` for a reply constrained to the tools' schemas), fed the reply's
forced start (``tool_prompt``) and then its text. Streamed, each parser event becomes
one ``delta``: ``content`` text, a call's
``{"index", "id", "type", "function": {"name", "arguments": ""}}``, then
``{"index", "function": {"arguments": piece}}``, which the openai client adds up to the
call. Not streamed, the same events make ``message.content`` and ``message.tool_calls``,
so both ways give the same reply. A reply with calls finishes ``"tool_calls"``. With
``parallel_tool_calls: false`` a reply ends at its first call: ``all_done`` says when every
candidate got there, and the server stops generating.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.tools.constrained import SchemaCallParser
from engine.tools.events import CallArguments, CallStart, TextDelta, ToolEvent, assemble
from engine.tools.parser import ToolParser

Parser = ToolParser | SchemaCallParser


def delta(event: ToolEvent) -> dict:
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, CallStart):
        return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}}]}
    assert isinstance(event, CallArguments)
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}


class ToolReplies:
    def __init__(self, make_parser: Callable[[], Parser], prefix: str = "", n: int = 1) -> None:
        self._make_parser, self._prefix, self._n = make_parser, prefix, n
        self._parsers: dict[int, Parser] = {}

    def again(self) -> ToolReplies:
        """A fresh reader of the same replies."""
        return ToolReplies(self._make_parser, self._prefix, self._n)

    @property
    def all_done(self) -> bool:
        """Every candidate made its last allowed call: the rest would be dropped."""
        parsers = self._parsers.values()
        return len(self._parsers) == self._n and all(p.done for p in parsers)

    def _feed(self, index: int, text: str) -> list[ToolEvent]:
        parser = self._parsers.get(index)
        if parser is None:
            parser = self._parsers[index] = self._make_parser()
            text = self._prefix + text
        return parser.feed(text)

    # -------------------------------------------------------------- streamed
    def deltas(self, index: int, text: str) -> list[dict]:
        return [delta(e) for e in self._feed(index, text)]

    def finish(self, index: int) -> list[dict]:
        events = self._feed(index, "")
        return [delta(e) for e in events + self._parsers[index].finish()]

    def finish_reason(self, index: int, reason: str | None) -> str:
        parser = self._parsers.get(index)
        if parser is not None and parser.calls and (
                parser.done or reason not in ("length", "context")):
            return "tool_calls"
        return "length" if reason in ("length", "context") else "stop"

    # ---------------------------------------------------------- not streamed
    def message(self, index: int, text: str) -> dict:
        events = self._feed(index, text)
        content, calls = assemble(events + self._parsers[index].finish())
        message: dict = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in calls]
        return message
