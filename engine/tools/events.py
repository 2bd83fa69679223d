"""What a tool parser emits while a reply streams (the event types are engine.outputs'):
text, then each call's id and name, then its arguments in pieces; ``assemble`` puts a
reply's events together as a client does."""

from __future__ import annotations

from engine.outputs import CallArguments, CallStart, TextDelta, ToolCall

ToolEvent = TextDelta | CallStart | CallArguments


def assemble(events: list[ToolEvent]) -> tuple[str, list[ToolCall]]:
    """The reply's text and calls, put together from its events as a client does."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    starts = [e for e in events if isinstance(e, CallStart)]
    pieces: dict[int, list[str]] = {e.index: [] for e in starts}
    for e in events:
        if isinstance(e, CallArguments):
            pieces[e.index].append(e.text)
    return text, [ToolCall(s.id, s.name, "".join(pieces[s.index])) for s in starts]
