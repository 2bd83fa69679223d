"""Servers that run one request at a time, and the candidates of a turn sent to one.

A server that ignores ``n`` gets a turn's missing candidates as parallel requests
(remote_request.py). Some servers run one request at a time: llama-cpp-python's, with
its default ``interrupt_requests``, cuts the running stream when another request
arrives; others answer the second request 503 or 429. Either is noticed by the request
it hurts (a stream cut, or a "busy" answer, while another part of the same turn runs);
from then on the turn's candidates run one after another, the cut one again from the
start, and the server is remembered as such for the session (``SERIAL_SERVERS``), so
later turns go one at a time at once. The turn that found it out says so in its footer,
once (``RemoteMetrics``; the note is desktop_app/data/pacing_note.py).

A candidate run again is a ``Replay``: its first run's text is already on screen, so the
new text is held back until it passes what was shown (a server that honours ``seed``
repeats it), and only what is new is streamed; text that differs replaces the shown one
when the turn finishes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import openai

from engine.outputs import RequestMetrics

BUSY_STATUSES = (429, 503)


class SerialServers:
    """The base URLs of servers found to run one request at a time, this session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._urls: set[str] = set()

    def knows(self, base_url: str) -> bool:
        with self._lock:
            return base_url in self._urls

    def remember(self, base_url: str) -> None:
        with self._lock:
            self._urls.add(base_url)


SERIAL_SERVERS = SerialServers()


def is_busy(exc: BaseException) -> bool:
    """A server's "not now" (it runs something else) rather than a refusal."""
    return isinstance(exc, openai.APIStatusError) and exc.status_code in BUSY_STATUSES


@dataclass(slots=True)
class RemoteMetrics(RequestMetrics):
    """A remote turn's figures, and whether it found its server runs one request at a
    time (pacing_note.METRIC in the reply's metrics: its footer says so)."""

    candidates_one_at_a_time: bool = False


class Replay:
    """A candidate's text, run again after ``shown`` was streamed from its first run."""

    __slots__ = ("shown", "fresh", "_sent", "diverged")

    def __init__(self, shown: str) -> None:
        self.shown = shown
        self.fresh = ""
        self._sent = len(shown)  # of fresh, what the screen already has
        self.diverged = False

    def take(self, text: str) -> str:
        """The new run's next text in; what to stream of it out ("" while it repeats
        what was shown, and for good once it differs)."""
        self.fresh += text
        if self.diverged:
            return ""
        if not (self.fresh.startswith(self.shown) or self.shown.startswith(self.fresh)):
            self.diverged = True
            return ""
        if len(self.fresh) <= self._sent:
            return ""
        delta, self._sent = self.fresh[self._sent:], len(self.fresh)
        return delta

    @property
    def text(self) -> str:
        """The candidate's text so far: what was shown until the new run passes it."""
        return self.fresh if self.diverged or len(self.fresh) > len(self.shown) else self.shown
