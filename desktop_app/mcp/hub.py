"""``McpHub``: the MCP servers of one ``mcp.json``, on an asyncio loop of their own thread.

Usable from any thread: ``configure`` (start the servers of a config, stopping those it
dropped or changed), ``call`` (queue a tool call; its ``CallResult`` arrives as an event),
``restart`` and ``shutdown``. ``on_event`` is called on the hub's thread with each
``ServerStatus`` and ``CallResult``; a GUI posts them on to its own thread. A call to a
server that failed or stopped starts it again first, so a crashed server gets another
chance the next time the model needs it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from desktop_app.mcp.config import McpConfig
from desktop_app.mcp.events import FAILED, STOPPED, CallResult, McpEvent
from desktop_app.mcp.session import Call, ServerSession


class McpHub:
    def __init__(self, on_event: Callable[[McpEvent], None]) -> None:
        self.on_event = on_event
        self.config = McpConfig()
        self._loop = asyncio.new_event_loop()
        self._sessions: dict[str, tuple[ServerSession, asyncio.Task]] = {}
        self._thread = threading.Thread(target=self._loop.run_forever, name="folio-mcp",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread
    def configure(self, config: McpConfig) -> None:
        self._submit(self._configure(config))

    def call(self, call_id: str, server: str, tool: str, arguments: dict[str, Any]) -> None:
        self._submit(self._call(Call(call_id, tool, arguments), server))

    def restart(self, server: str) -> None:
        self._submit(self._restart(server))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every server (their processes end) and the loop."""
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop_all(), self._loop).result(timeout)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()

    # ------------------------------------------------------------------ the loop
    def _submit(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _emit(self, event: McpEvent) -> None:
        try:
            self.on_event(event)
        except Exception:  # noqa: BLE001 - a listener's bug must not stop the servers
            pass

    async def _configure(self, config: McpConfig) -> None:
        old, self.config = self.config, config
        for name in list(self._sessions):
            if config.server(name) != old.server(name):
                await self._stop(name)
        for server in config.servers:
            if server.name not in self._sessions:
                self._start(server.name)

    def _start(self, name: str) -> ServerSession:
        session = ServerSession(self.config.server(name), self._emit)
        task = self._loop.create_task(session.run())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._sessions[name] = (session, task)
        return session

    async def _stop(self, name: str) -> None:
        session, task = self._sessions.pop(name)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _stop_all(self) -> None:
        for name in list(self._sessions):
            await self._stop(name)

    async def _restart(self, name: str) -> None:
        if name in self._sessions:
            await self._stop(name)
        if self.config.server(name) is not None:
            self._start(name)

    async def _call(self, call: Call, server: str) -> None:
        if self.config.server(server) is None:
            self._emit(CallResult(call.call_id, f"Error: no MCP server named {server!r}",
                                  f"no MCP server named {server!r}"))
            return
        entry = self._sessions.get(server)
        if entry is None or entry[0].state in (FAILED, STOPPED) or entry[1].done():
            if entry is not None:
                await self._stop(server)
            session = self._start(server)
        else:
            session = entry[0]
        await session.queue.put(call)
