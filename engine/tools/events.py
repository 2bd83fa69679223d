"""What a tool parser emits while a reply streams: text, then each call's id and name,
then its arguments in pieces (OpenAI's ``delta.tool_calls`` order)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class TextDelta:
    text: str


@dataclass(slots=True, frozen=True)
class CallStart:
    index: int  # the call's place in the reply, from 0
    id: str
    name: str


@dataclass(slots=True, frozen=True)
class CallArguments:
    index: int
    text: str  # a piece of the arguments' JSON text


ToolEvent = TextDelta | CallStart | CallArguments


@dataclass(slots=True, frozen=True)
class ToolCall:
    """A whole call, as a non-streamed reply carries it."""

    id: str
    name: str
    arguments: str  # JSON text of an object


def assemble(events: list[ToolEvent]) -> tuple[str, list[ToolCall]]:
    """The reply's text and calls, put together from its events as a client does."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    starts = [e for e in events if isinstance(e, CallStart)]
    pieces: dict[int, list[str]] = {e.index: [] for e in starts}
    for e in events:
        if isinstance(e, CallArguments):
            pieces[e.index].append(e.text)
    return text, [ToolCall(s.id, s.name, "".join(pieces[s.index])) for s in starts]
