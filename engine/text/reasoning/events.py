"""What a reasoning parser emits while a reply streams (engine.outputs' ``ReplyEvent``):
the model's thinking, and the answer (``TextDelta``, the tool parsers' text event, so the
answer can go on to a ``ToolParser``); harmony replies may also carry a call
(``CallStart``, ``CallArguments``). ``split_reply`` puts a reply's events together."""

from __future__ import annotations

from dataclasses import dataclass

from engine.outputs import ReplyEvent, Thinking, ToolCall
from engine.tools.events import assemble


@dataclass(slots=True, frozen=True)
class SplitReply:
    """A whole reply put together from its events, as a client does."""

    thinking: str
    answer: str
    calls: tuple[ToolCall, ...] = ()


def split_reply(events: list[ReplyEvent]) -> SplitReply:
    thinking = "".join(e.text for e in events if isinstance(e, Thinking))
    answer, calls = assemble([e for e in events if not isinstance(e, Thinking)])
    return SplitReply(thinking, answer, tuple(calls))


class HeldText:
    """What both parsers share: the text not yet emitted, and ``feed`` stepping their
    state machine (``_step``: one move, False when it waits for more text)."""

    __slots__ = ("_held",)

    def __init__(self, held: str = "") -> None:
        self._held = held

    def feed(self, text: str) -> list[ReplyEvent]:
        out: list[ReplyEvent] = []
        self._held += text
        while self._step(out):
            pass
        return out

    def _step(self, out: list[ReplyEvent]) -> bool:
        raise NotImplementedError


def partial_tag(text: str, tags: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` could be the start of one of ``tags``
    (cut by a delta boundary): they wait for the next delta."""
    best = 0
    for tag in tags:
        if tag[0] not in text[-len(tag) + 1:]:  # most deltas: no tag can start here
            continue
        for size in range(min(len(tag) - 1, len(text)), best, -1):
            if tag.startswith(text[-size:]):
                best = size
                break
    return best
