"""``ToolParser``: one reply's text deltas in, text and tool-call events out, as it streams.

A reply alternates text and call regions (a format's marker, the call's JSON, its end).
Text streams at once, except what could still be the start of a marker (``<tool_`` at the
end of a delta) and trailing whitespace, which a following call would swallow. A region is
held until it closes and then checked whole: a valid one becomes its calls (id and name,
then the arguments in the pieces the model's text arrived in), a malformed one goes out as
the text it was, so a client never gets half a call it cannot use, and the same reply
adds up to the same text and calls however it was cut into deltas.
"""

from __future__ import annotations

from itertools import pairwise

from engine.outputs import CallArguments, CallStart, TextDelta
from engine.tools.calls import RawCall, parse_calls
from engine.tools.events import ToolEvent
from engine.tools.format import Marker, ToolFormat

_SPACE = " \t\r\n"


class _Balanced:
    """Finds where the JSON value opening a region ends, a delta at a time."""

    __slots__ = ("depth", "escaped", "in_string", "pos")
    NOT_JSON = -1

    def __init__(self) -> None:
        self.pos, self.depth, self.in_string, self.escaped = 0, 0, False, False

    def advance(self, text: str) -> int | None:
        """The index just past the value, NOT_JSON, or None while it is still open."""
        for i in range(self.pos, len(text)):
            ch = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
            elif self.depth == 0 and ch not in _SPACE:
                return self.NOT_JSON
        self.pos = len(text)
        return None


class ToolParser:
    """``feed(delta)`` as the reply streams, ``finish()`` at its end; ``calls`` counts the
    calls emitted, ``malformed`` says a region was returned as text. ``max_calls`` (1 for
    ``parallel_tool_calls: false``): the reply ends, for the client, after that many."""

    def __init__(self, fmt: ToolFormat, max_calls: int | None = None) -> None:
        self.fmt = fmt
        self.max_calls = max_calls
        self.calls = 0
        self.malformed = False
        self._pending = ""  # text not yet emitted
        self._leading = True  # a leading-only marker may open a region here
        self._done = False
        # The open region: its marker, the whitespace dropped before it (given back if it
        # is malformed), its text, where each delta ended in it, how far it was searched.
        self._marker: Marker | None = None
        self._gap = ""
        self._region = ""
        self._cuts: list[int] = []
        self._searched = 0
        self._scan = _Balanced()

    @property
    def done(self) -> bool:
        """``max_calls`` calls were made: the rest of the reply is dropped."""
        return self._done

    def feed(self, text: str) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        if self._done or not text:
            return out
        if self._marker is None:
            self._pending += text
        else:
            self._region += text
            self._cuts.append(len(self._region))
            self._check_region(out)
        self._scan_text(out)
        return out

    def finish(self) -> list[ToolEvent]:
        """What is still held when the reply ends: an unclosed region is read as it stands
        (a model may end its turn without the end marker), then the held text."""
        out: list[ToolEvent] = []
        if self._done:
            return out
        if self._marker is not None:
            self._close(self._region, "", "", out)
            self._scan_text(out, final=True)
        if self._pending and not self._done:
            if self.calls and not self._pending.strip(_SPACE + self.fmt.separators):
                self._pending = ""  # what separated calls, nothing said after them
            self._emit(self._pending, out)
            self._pending = ""
        return out

    # ----------------------------------------------------------------- text
    def _scan_text(self, out: list[ToolEvent], final: bool = False) -> None:
        while self._marker is None and not self._done and self._pending:
            found = self._find_marker(self._pending)
            if found is None:
                if final:
                    return  # finish() emits the rest
                hold = self._hold_from(self._pending)
                self._emit(self._pending[:hold], out)
                self._pending = self._pending[hold:]
                return
            at, marker = found
            before, after = self._pending[:at], self._pending[at:]
            kept = before.rstrip(_SPACE)
            if self.calls and not kept.strip(_SPACE + self.fmt.separators):
                kept = ""
            self._emit(kept, out)
            self._pending = ""
            self._open(marker, before[len(kept):],
                       after if marker.in_body else after[len(marker.text):])
            self._check_region(out)

    def _lead_at(self, text: str) -> int:
        """Where a leading-only marker would stand: past whitespace (and, after a call,
        the format's separators)."""
        skip = _SPACE + (self.fmt.separators if self.calls else "")
        return len(text) - len(text.lstrip(skip))

    def _find_marker(self, text: str) -> tuple[int, Marker] | None:
        best: tuple[int, Marker] | None = None
        for marker in self.fmt.markers:
            if marker.leading_only:
                at = self._lead_at(text) if self._leading else -1
                at = at if at >= 0 and text.startswith(marker.text, at) else -1
            else:
                at = text.find(marker.text)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, marker)
        return best

    def _hold_from(self, text: str) -> int:
        """Where the text that must wait begins: a possible marker start at the end, and
        the whitespace before it."""
        hold = len(text)
        for marker in self.fmt.markers:
            if marker.leading_only:
                if self._leading and marker.text.startswith(text[self._lead_at(text):]):
                    hold = 0
                continue
            for size in range(min(len(marker.text) - 1, len(text)), 0, -1):
                if marker.text.startswith(text[-size:]):
                    hold = min(hold, len(text) - size)
                    break
        return len(text[:hold].rstrip(_SPACE + (self.fmt.separators if self.calls else "")))

    def _emit(self, text: str, out: list[ToolEvent]) -> None:
        if not text:
            return
        out.append(TextDelta(text))
        if text.strip(_SPACE + self.fmt.separators):
            self._leading = False

    # --------------------------------------------------------------- region
    def _open(self, marker: Marker, gap: str, text: str) -> None:
        self._marker, self._gap, self._region = marker, gap, text
        self._cuts, self._searched, self._scan = [len(text)], 0, _Balanced()

    def _check_region(self, out: list[ToolEvent]) -> None:
        region, end = self._region, self.fmt.end
        if end is not None:
            at = region.find(end, self._searched)
            if at < 0:
                self._searched = max(0, len(region) - len(end) + 1)
                return
            self._close(region[:at], end, region[at + len(end):], out)
            return
        stop = self._scan.advance(region)
        if stop is None:
            return
        if stop == _Balanced.NOT_JSON:
            self._close(region, "", "", out, malformed=True)
        else:
            self._close(region[:stop], "", region[stop:], out)

    def _close(self, body: str, end: str, rest: str, out: list[ToolEvent],
               malformed: bool = False) -> None:
        marker, cuts = self._marker, self._cuts
        self._marker = None
        calls: list[RawCall] = []
        if not malformed:
            try:
                calls = parse_calls(body)
            except ValueError:
                malformed = True
        if malformed:
            self.malformed = True
            self._emit(self._gap + ("" if marker.in_body else marker.text) + body + end, out)
        for call in calls:
            index = self.calls
            self.calls += 1
            out.append(CallStart(index, self.fmt.new_id(), call.name))
            out += [CallArguments(index, piece) for piece in _pieces(body, call, cuts)]
            if self.max_calls is not None and self.calls >= self.max_calls:
                self._done = True
                self._pending = ""
                return
        if calls:
            self._leading = True
        self._pending = rest


def _pieces(body: str, call: RawCall, cuts: list[int]) -> list[str]:
    """The call's arguments, cut where the deltas that brought them ended."""
    if call.span is None:
        return [call.arguments]
    start, end = call.span
    bounds = [start, *(c for c in cuts if start < c < end), end]
    return [body[a:b] for a, b in pairwise(bounds)]
