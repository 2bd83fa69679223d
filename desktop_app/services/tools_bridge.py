"""The one QObject in front of the MCP servers (``desktop_app.mcp``).

It reads ``mcp.json`` from the config folder, runs the servers in an ``McpHub`` (its own
asyncio thread), and posts the hub's events to the GUI thread through a queued signal:
``serversChanged`` when a server starts, fails or stops (``statuses``), ``callFinished``
with each ``CallResult``. It remembers each server's last tool list (``known_tools``), so
a chat's tools stay in its prompt while a crashed server waits to be restarted by the next
call. Nothing here logs or shows a server's ``env`` or ``headers`` values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot

from desktop_app.mcp.config import (
    McpConfig,
    McpConfigError,
    mcp_json_path,
    parse_mcp_json,
    read_mcp_json,
    write_mcp_json,
)
from desktop_app.mcp.events import READY, CallResult, ServerStatus, ToolInfo
from desktop_app.mcp.hub import McpHub
from desktop_app.mcp.toolset import ChatToolset, toolset

logger = logging.getLogger(__name__)


class ToolsBridge(QObject):
    serversChanged = Signal()
    callFinished = Signal(str, object)  # call id, CallResult

    _posted = Signal(object)  # hub thread -> GUI thread

    def __init__(self, config_dir: Path, hub_factory: Callable[..., Any] = McpHub,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.path = mcp_json_path(config_dir)
        self.config = McpConfig()
        self.config_error = ""  # why the mcp.json on disk was not used
        self.statuses: dict[str, ServerStatus] = {}
        self.known_tools: dict[str, tuple[ToolInfo, ...]] = {}
        self._posted.connect(self._on_posted, Qt.ConnectionType.QueuedConnection)
        self._hub = hub_factory(self._posted.emit)

    def start(self) -> None:
        """Start the servers of the mcp.json on disk (a bad file starts none, and says why
        in Settings ▸ Tools)."""
        try:
            self._apply(parse_mcp_json(read_mcp_json(self.path)))
        except McpConfigError as exc:
            self.config_error = str(exc)
            logger.warning("mcp.json not used: %s", exc)
            self.serversChanged.emit()

    def config_text(self) -> str:
        return read_mcp_json(self.path)

    def apply_text(self, text: str) -> None:
        """Settings ▸ Tools ▸ Apply: check, save, then start / stop servers to match;
        McpConfigError (a ValueError naming the field) changes nothing."""
        self._apply(write_mcp_json(self.path, text))

    def _apply(self, config: McpConfig) -> None:
        self.config, self.config_error = config, ""
        names = {s.name for s in config.servers}
        self.statuses = {k: v for k, v in self.statuses.items() if k in names}
        self.known_tools = {k: v for k, v in self.known_tools.items() if k in names}
        self._hub.configure(config)
        self.serversChanged.emit()

    def restart(self, server: str) -> None:
        self._hub.restart(server)

    def call(self, call_id: str, server: str, tool: str, arguments: dict) -> None:
        self._hub.call(call_id, server, tool, arguments)

    def toolset(self, selection) -> ChatToolset:
        return toolset(self.known_tools, selection)

    def shutdown(self) -> None:
        self._hub.shutdown()

    @Slot(object)
    def _on_posted(self, event) -> None:
        if isinstance(event, ServerStatus):
            if self.config.server(event.name) is None:
                return  # a server just removed from mcp.json, stopping
            self.statuses[event.name] = event
            if event.state == READY:
                self.known_tools[event.name] = event.tools
            self.serversChanged.emit()
        elif isinstance(event, CallResult):
            self.callFinished.emit(event.call_id, event)
