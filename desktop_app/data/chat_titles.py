"""A chat's title from its first message.

A pasted Markdown document once became a whole chat title; a title is the first line that
says something, without the Markdown marks around it, on one line, short enough for the
sidebar and cut between words."""

from __future__ import annotations

import re

DEFAULT_TITLE = "New chat"
TITLE_LENGTH = 50

# Marks at the start of a line: headings, quotes, list bullets and numbers, task boxes.
_LEADING = re.compile(r"^(?:\s*(?:#{1,6}|>|[-*+]|\d+[.)]|\[[ xX]\])(?=\s|$))+\s*")
# Marks inside a line: emphasis, code, strike-through; a link keeps its text.
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_INLINE = re.compile(r"[*_`~]+")
_FENCE = re.compile(r"^\s*(```|~~~)")


def title_from(text: str, limit: int = TITLE_LENGTH) -> str:
    """The first non-blank line of `text` (a code fence's opening line skipped), Markdown
    marks dropped, whitespace collapsed, cut at a word boundary to `limit` characters with
    "…"; DEFAULT_TITLE when nothing is left."""
    for raw in text.splitlines():
        if _FENCE.match(raw):
            continue
        line = _INLINE.sub("", _LINK.sub(r"\1", _LEADING.sub("", raw)))
        line = " ".join(line.split())
        if line:
            return _cut(line, limit)
    return DEFAULT_TITLE


def _cut(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    head = line[: limit - 1]
    # At the last space, unless that leaves too little of the line (one very long word).
    space = head.rfind(" ")
    if space >= limit // 2:
        head = head[:space]
    return head.rstrip(" ,;:.-–—") + "…"
