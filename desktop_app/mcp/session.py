"""One MCP server's connection, as a task on the hub's asyncio loop.

``ServerSession.run`` starts the server (a process over stdio, or a Streamable HTTP
endpoint), lists its tools, then runs the calls queued for it side by side until it is
stopped or the connection dies. Every way it can go wrong ends as an event rather than an
exception: a server that will not start or crashes reports ``FAILED`` (with the last lines
it wrote to stderr), and each call gets a ``CallResult``, an error one when the server
returned an error, hung past its timeout, or exited mid-call. The calls still queued when
a server dies fail with its reason, so nothing waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from desktop_app.mcp.config import ServerConfig, redact
from desktop_app.mcp.events import (
    FAILED,
    READY,
    STARTING,
    STOPPED,
    CallResult,
    McpEvent,
    ServerStatus,
    ToolInfo,
)

START_TIMEOUT_S = 30.0
STDERR_LINES = 6


@dataclass(slots=True, frozen=True)
class Call:
    call_id: str
    tool: str
    arguments: dict[str, Any]


class _ConnectionLost(Exception):
    """The server went away mid-call: the whole session is over."""


class ServerSession:
    def __init__(self, config: ServerConfig, emit: Callable[[McpEvent], None]) -> None:
        self.config = config
        self.emit = emit
        self.queue: asyncio.Queue[Call | None] = asyncio.Queue()
        self.state = STARTING
        self.tools: tuple[ToolInfo, ...] = ()

    def _status(self, state: str, error: str = "") -> None:
        self.state = state
        self.emit(ServerStatus(self.config.name, state, self.tools if state == READY else (),
                               redact(error, self.config.secrets)))

    async def run(self) -> None:
        self._status(STARTING)
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
            reason = ""
            try:
                async with contextlib.AsyncExitStack() as stack:
                    session = await self._connect(stack, errlog)
                    self._status(READY)
                    await self._serve(session)
            except (asyncio.CancelledError, anyio.get_cancelled_exc_class()):
                reason = "stopped"
            except BaseException as exc:  # noqa: BLE001 - a server's failure is an event
                reason = _describe(exc, self.state) + _tail(errlog)
            if reason == "stopped" or not reason:
                self._status(STOPPED)
                self._fail_queued("the server was stopped")
            else:
                self._status(FAILED, reason)
                self._fail_queued(reason)
            if reason == "stopped":
                raise asyncio.CancelledError

    async def _connect(self, stack: contextlib.AsyncExitStack, errlog):
        from mcp import ClientSession

        config = self.config
        if config.command is not None:
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(command=config.command, args=list(config.args),
                                           env=config.env or None, cwd=config.cwd)
            read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        else:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = await stack.enter_async_context(
                create_mcp_http_client(headers=config.headers or None))
            read, write = await stack.enter_async_context(
                streamable_http_client(config.url, http_client=client))
        session = await stack.enter_async_context(ClientSession(read, write))
        with anyio.fail_after(START_TIMEOUT_S):
            await session.initialize()
            listed = await session.list_tools()
        self.tools = tuple(ToolInfo(config.name, t.name, t.description or "",
                                    dict(t.input_schema or {})) for t in listed.tools)
        return session

    async def _serve(self, session) -> None:
        async with anyio.create_task_group() as group:
            while True:
                call = await self.queue.get()
                if call is None:
                    group.cancel_scope.cancel()
                    return
                group.start_soon(self._call, session, call)

    async def _call(self, session, call: Call) -> None:
        timeout = self.config.timeout_s
        try:
            with anyio.fail_after(timeout + 1.0):  # the SDK's own timeout fires first
                result = await session.call_tool(call.tool, call.arguments,
                                                 read_timeout_seconds=timeout)
        except TimeoutError:
            self._result(call, error=f"no answer within {timeout:g} s (the server's timeout)")
            return
        except Exception as exc:  # noqa: BLE001
            text = str(exc) or type(exc).__name__
            if "timed out" in text.lower():
                self._result(call, error=f"no answer within {timeout:g} s (the server's "
                             "timeout)")
                return
            if "closed" in text.lower():
                self._result(call, error="the server exited during the call")
                raise _ConnectionLost("the server exited") from exc
            self._result(call, error=text)
            return
        text = _result_text(result)
        if getattr(result, "is_error", False):
            self._result(call, error=text or "the tool reported an error")
        else:
            self._result(call, text=text)

    def _result(self, call: Call, text: str = "", error: str = "") -> None:
        secrets = self.config.secrets
        shown = redact(error, secrets)
        self.emit(CallResult(call.call_id, redact(text, secrets) if not error else
                             f"Error: {shown}", shown))

    def _fail_queued(self, reason: str) -> None:
        while not self.queue.empty():
            call = self.queue.get_nowait()
            if call is not None:
                self._result(call, error=f"{self.config.name}: {reason}")

    async def stop(self) -> None:
        await self.queue.put(None)


def _result_text(result) -> str:
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind or 'content'} not shown]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


def _describe(exc: BaseException, state: str) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, _ConnectionLost):
        return "the server exited"
    if isinstance(exc, TimeoutError):
        return f"no answer within {START_TIMEOUT_S:g} s while starting"
    if isinstance(exc, FileNotFoundError):
        return f"could not start: {exc.strerror or 'not found'}: {exc.filename or ''}".rstrip()
    text = str(exc) or type(exc).__name__
    if state == STARTING:
        return f"could not start: {text}"
    return text


def _tail(errlog) -> str:
    try:
        errlog.flush()
        errlog.seek(0)
        lines = [line.rstrip() for line in errlog.read().splitlines() if line.strip()]
    except (OSError, ValueError):
        return ""
    return ("\nIts last output:\n" + "\n".join(lines[-STDERR_LINES:])) if lines else ""
