"""Replies read for thinking and tool calls, in OpenAI's chat shapes.

Each candidate gets its own readers: a ``ReasoningReader`` where the model's chat template
shows reasoning (``engine/text/reasoning``), which splits the model's thinking off first,
and a tool parser (``make_parser``: the family's ``ToolParser``, or a ``SchemaCallParser``
for a reply constrained to the tools' schemas), fed the reply's forced start
(``tool_prompt``) and then the answer. Streamed, each event becomes one ``delta``:
``reasoning_content`` thinking (DeepSeek's and vLLM's name), ``content`` text, a call's
``{"index", "id", "type", "function": {"name", "arguments": ""}}``, then
``{"index", "function": {"arguments": piece}}``, which the openai client adds up to the
call. Not streamed, the same events make ``message.reasoning_content``,
``message.content`` and ``message.tool_calls``, so both ways give the same reply. A reply
with calls finishes ``"tool_calls"``. With ``parallel_tool_calls: false`` a reply ends at
its first call: ``all_done`` says when every candidate got there, and the server stops
generating. Harmony replies carry their calls in their channels: the reasoning reader
emits them.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.text.reasoning import ReasoningReader, Thinking, split_reply
from engine.text.reasoning.events import ReasoningEvent
from engine.tools.constrained import SchemaCallParser
from engine.tools.events import CallArguments, CallStart, TextDelta
from engine.tools.parser import ToolParser

Parser = ToolParser | SchemaCallParser


def delta(event: ReasoningEvent) -> dict:
    if isinstance(event, Thinking):
        return {"reasoning_content": event.text}
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, CallStart):
        return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}}]}
    assert isinstance(event, CallArguments)
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}


class _Candidate:
    __slots__ = ("calls", "events", "parser", "reasoning")

    def __init__(self, parser: Parser | None, reasoning: ReasoningReader | None) -> None:
        self.parser, self.reasoning = parser, reasoning
        self.events: list[ReasoningEvent] = []  # everything emitted, for the message
        self.calls = 0

    @property
    def done(self) -> bool:
        return self.parser is not None and self.parser.done

    def read(self, events: list[ReasoningEvent]) -> list[ReasoningEvent]:
        out: list[ReasoningEvent] = []
        for event in events:
            if isinstance(event, TextDelta) and self.parser is not None:
                out += self.parser.feed(event.text)
            else:
                out.append(event)
        self.calls += sum(isinstance(e, CallStart) for e in out)
        self.events += out
        return out


class ToolReplies:
    """``make_parser``: None where the reply is read for thinking only; ``reasoning``: a
    fresh reader per candidate, None where the template shows no reasoning (or the reply
    was started with a call)."""

    def __init__(self, make_parser: Callable[[], Parser] | None, prefix: str = "",
                 n: int = 1, reasoning: Callable[[], ReasoningReader] | None = None) -> None:
        self._make_parser, self._prefix, self._n = make_parser, prefix, n
        self._reasoning = reasoning
        self._candidates: dict[int, _Candidate] = {}

    @property
    def all_done(self) -> bool:
        """Every candidate made its last allowed call: the rest would be dropped."""
        candidates = self._candidates.values()
        return len(self._candidates) == self._n and all(c.done for c in candidates)

    @property
    def reasoning_tokens(self) -> int | None:
        """The candidates' thinking tokens together; None where nothing is read for it."""
        if self._reasoning is None:
            return None
        return sum(c.reasoning.thinking_tokens for c in self._candidates.values())

    def _candidate(self, index: int) -> _Candidate:
        candidate = self._candidates.get(index)
        if candidate is None:
            parser = self._make_parser() if self._make_parser else None
            reader = self._reasoning() if self._reasoning else None
            candidate = self._candidates[index] = _Candidate(parser, reader)
            if parser is not None and self._prefix:
                candidate.read([TextDelta(self._prefix)])
        return candidate

    def _feed(self, index: int, text: str, num_tokens: int) -> list[ReasoningEvent]:
        candidate = self._candidate(index)
        if candidate.reasoning is None:
            return candidate.read([TextDelta(text)] if text else [])
        return candidate.read(candidate.reasoning.feed(text, num_tokens))

    # -------------------------------------------------------------- streamed
    def deltas(self, index: int, text: str, num_tokens: int = 1) -> list[dict]:
        return [delta(e) for e in self._feed(index, text, num_tokens)]

    def finish(self, index: int) -> list[dict]:
        return [delta(e) for e in self._finish(index)]

    def _finish(self, index: int) -> list[ReasoningEvent]:
        candidate = self._candidate(index)
        events = candidate.read(candidate.reasoning.finish()) if candidate.reasoning else []
        if candidate.parser is not None:
            tail = candidate.parser.finish()
            candidate.calls += sum(isinstance(e, CallStart) for e in tail)
            candidate.events += tail
            events += tail
        return events

    def finish_reason(self, index: int, reason: str | None) -> str:
        candidate = self._candidates.get(index)
        if candidate is not None and candidate.calls and (
                candidate.done or reason not in ("length", "context")):
            return "tool_calls"
        return "length" if reason in ("length", "context") else "stop"

    # ---------------------------------------------------------- not streamed
    def message(self, index: int) -> dict:
        """The candidate's whole message, once its text was fed and it finished."""
        self._finish(index)
        reply = split_reply(self._candidates[index].events)
        message: dict = {"role": "assistant",
                         "content": reply.answer or (None if reply.calls else "")}
        if self._reasoning is not None:
            message["reasoning_content"] = reply.thinking or None
        if reply.calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in reply.calls]
        return message
