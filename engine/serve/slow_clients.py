"""Connections that never finish sending a request's head are closed after a bound.

uvicorn (as of 0.55) has no such timeout: ``timeout_keep_alive`` runs only between
requests and is stopped by the first byte of the next one, and nothing runs on a new
connection. A client that opens connections and sends their heads a byte at a time
(slowloris) would hold each one for ever, and with ``limit_concurrency`` hold the places
every other client needs. ``head_timeout_protocol`` is uvicorn's h11 protocol with one
timer more: armed when a connection opens or a request's first byte arrives, stopped
once h11 has the whole head; when it fires, the connection is closed.

The body is not bounded here: the app reads it as it comes, and a slow upload of a
large prompt is a client on a slow link as often as an attacker.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class HeadTimeoutH11(H11Protocol):
    head_timeout_s: float = 10.0  # set per server by head_timeout_protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        # IDLE: h11 has not yet read a whole request line and headers. Between requests
        # the connection is IDLE too, with no byte yet: uvicorn's keep-alive timer has it
        # then, and this one starts with the next byte (data_received).
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not waiting:
            self._stop_head_timer()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        log.info("closed a connection from %s: no whole request head in %.3g s",
                 self.client[0] if self.client else "?", self.head_timeout_s)
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:
            pass  # nothing to tell h11: the transport is closed all the same
        self.transport.close()


def head_timeout_protocol(head_timeout_s: float) -> type[HeadTimeoutH11]:
    """The protocol class to give uvicorn.Config(http=...) for this bound."""
    return type("HeadTimeoutH11", (HeadTimeoutH11,), {"head_timeout_s": head_timeout_s})
