"""Settings ▸ Tools ▸ Test connection: start one MCP server on its own, list its tools,
stop it.

The server runs in an ``McpHub`` of its own (its asyncio thread), not the app's hub, so a
test neither disturbs the servers in use nor needs the config applied first. The hub's
first READY or FAILED status is posted to the GUI thread as a ``ProbeResult``
(``finished``); the hub is then shut down on a thread of its own, since stopping a server
process may take a moment the GUI must not wait for."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot

from desktop_app.mcp.config import McpConfig, ServerConfig
from desktop_app.mcp.events import FAILED, READY, ServerStatus, ToolInfo
from desktop_app.mcp.hub import McpHub


@dataclass(slots=True, frozen=True)
class ProbeResult:
    server: str
    ok: bool
    tools: tuple[ToolInfo, ...] = ()
    error: str = ""

    def summary(self) -> str:
        if not self.ok:
            return f"{self.server}: could not connect · {self.error}"
        names = ", ".join(t.name for t in self.tools) or "no tools"
        return f"{self.server}: connected · {len(self.tools)} tool(s): {names}"


class ConnectionProbe(QObject):
    finished = Signal(object)  # ProbeResult

    _posted = Signal(int, object)  # hub thread -> GUI thread: (test number, event)

    def __init__(self, hub_factory: Callable[..., Any] = McpHub,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._hub_factory = hub_factory
        self._hub = None
        self._server: ServerConfig | None = None
        self._number = 0  # which test is current: a dropped one's late events are ignored
        self._closers: list[threading.Thread] = []
        self._posted.connect(self._on_posted, Qt.ConnectionType.QueuedConnection)

    @property
    def running(self) -> bool:
        return self._hub is not None

    def start(self, server: ServerConfig) -> None:
        """Test `server` (one at a time: a test in progress is dropped)."""
        self.stop()
        self._server = server
        self._number += 1
        number = self._number
        self._hub = self._hub_factory(lambda event: self._posted.emit(number, event))
        self._hub.configure(McpConfig((server,)))

    @Slot(int, object)
    def _on_posted(self, number: int, event) -> None:
        if number != self._number or self._hub is None or not isinstance(event, ServerStatus):
            return
        if event.state not in (READY, FAILED):
            return
        result = ProbeResult(event.name, event.state == READY, event.tools, event.error)
        self.stop()
        self.finished.emit(result)

    def stop(self) -> None:
        """Drop a test in progress; its server stops on a thread of its own."""
        hub, self._hub = self._hub, None
        if hub is not None:
            closer = threading.Thread(target=hub.shutdown, name="folio-mcp-probe-stop",
                                      daemon=True)
            closer.start()
            self._closers.append(closer)

    def close(self, timeout: float = 10.0) -> None:
        """Drop a test in progress and wait for the servers started to stop."""
        self.stop()
        for closer in self._closers:
            closer.join(timeout)
        self._closers.clear()
