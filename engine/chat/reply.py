"""A reply read as it streams: typed events out, and the whole message at its end.

Each candidate of a request gets one ``ReplyReader``, made by the engine from the prompt's
``ReplyPlan`` (prompt.py decides it with the prompt): where the model's chat template
shows reasoning, a ``ReasoningReader`` splits the thinking off first; where the reply may
call tools, the family's ``ToolParser`` (or a ``SchemaCallParser`` for a reply constrained
to the tools' schemas) reads the answer for calls, fed the reply's forced start first. The
events are ``Thinking``, ``TextDelta``, ``CallStart`` and ``CallArguments`` (a call comes
out only once its region closed and parsed whole, then its arguments in the pieces the
model wrote them); ``message()`` puts them together as the finished candidate's content,
reasoning and calls. The app and the server show these; neither reads a reply itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.outputs import ReplyEvent, ReplyMessage, TextDelta
from engine.text.reasoning import ReasoningFormat, ReasoningReader, split_reply
from engine.tools.constrained import SchemaCallParser
from engine.tools.format import ToolFormat
from engine.tools.parser import ToolParser


@dataclass(slots=True, frozen=True)
class ReplyPlan:
    """How a prompt's replies are read, decided with the prompt."""

    tool_format: ToolFormat | None = None  # calls read in the family's format
    prefix: str = ""  # what the reply was started with (a forced call's marker)
    max_calls: int | None = None  # 1 for parallel_tool_calls false
    schema_call: bool = False  # the reply is one call constrained to the tools' schemas
    reasoning: ReasoningFormat | None = None  # the thinking format its template shows
    prompt_tail: str = ""  # the prompt's end, decoded: where the reply starts
    # A continued reply's text so far (continued.py): read first, shown in the finished
    # message, never sent again as events.
    replay: str = ""

    def reader(self, constrained: bool = False) -> ReplyReader:
        """One candidate's reader; ``constrained``: the reply is held to a JSON schema
        the user gave (structured output), so there is no thinking to split off."""
        parser = None
        if self.schema_call:
            parser = SchemaCallParser()
        elif self.tool_format is not None:
            parser = ToolParser(self.tool_format, self.max_calls)
        reads_thinking = not (constrained or self.schema_call or self.prefix)
        reasoning = (ReasoningReader(self.reasoning.parser(self.prompt_tail))
                     if self.reasoning is not None and reads_thinking else None)
        reader = ReplyReader(parser, reasoning, self.prefix)
        if self.replay:
            reader.replay(self.replay)
        return reader


PLAIN = ReplyPlan()  # text completions and token-id prompts: the reply is its text


class ReplyReader:
    """``feed`` each delta (with the tokens it brought), ``finish`` at the end, then
    ``message()``. ``done``: the reply made its last allowed call; the rest is dropped."""

    __slots__ = ("_events", "_finished", "parser", "reasoning")

    def __init__(self, parser: ToolParser | SchemaCallParser | None,
                 reasoning: ReasoningReader | None, prefix: str = "") -> None:
        self.parser, self.reasoning = parser, reasoning
        self._events: list[ReplyEvent] = []
        self._finished = False
        if parser is not None and prefix:
            self._read([TextDelta(prefix)])

    @property
    def done(self) -> bool:
        return self.parser is not None and self.parser.done

    def feed(self, text: str, num_tokens: int = 1, now: float | None = None
             ) -> list[ReplyEvent]:
        if self.reasoning is None:
            return self._read([TextDelta(text)] if text else [])
        return self._read(self.reasoning.feed(text, num_tokens, now))

    def replay(self, text: str) -> None:
        """A continued reply's text so far: read into the reader's state and its message,
        not counted as new tokens or time, and not returned as events."""
        self._read(self.reasoning.replay(text) if self.reasoning is not None
                   else [TextDelta(text)])

    def finish(self, now: float | None = None) -> list[ReplyEvent]:
        """What was held back when the reply ends; later calls return nothing."""
        if self._finished:
            return []
        self._finished = True
        events = self._read(self.reasoning.finish(now)) if self.reasoning else []
        if self.parser is not None:
            tail = self.parser.finish()
            self._events += tail
            events += tail
        return events

    def message(self) -> ReplyMessage:
        """The whole reply (call it after ``finish``)."""
        reply = split_reply(self._events)
        if self.reasoning is None:
            return ReplyMessage(reply.answer, None, reply.calls)
        return ReplyMessage(reply.answer, reply.thinking, reply.calls,
                            self.reasoning.thinking_tokens, round(self.reasoning.thinking_s, 3))

    def _read(self, events: list[ReplyEvent]) -> list[ReplyEvent]:
        out: list[ReplyEvent] = []
        for event in events:
            if isinstance(event, TextDelta) and self.parser is not None:
                out += self.parser.feed(event.text)
            else:
                out.append(event)
        self._events += out
        return out
