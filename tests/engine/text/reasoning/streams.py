"""A scripted reply fed to a reasoning parser in pieces, as a stream brings it."""

from __future__ import annotations

from engine.text.reasoning import SplitReply, split_reply


def run(parser, reply: str, cuts: list[int]) -> tuple[SplitReply, list]:
    """The reply cut at ``cuts``: what it adds up to, and the streamed events."""
    events, start = [], 0
    for cut in [*cuts, len(reply)]:
        events += parser.feed(reply[start:cut])
        start = cut
    return split_reply(events + parser.finish()), events
