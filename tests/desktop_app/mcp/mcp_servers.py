"""Small real MCP servers for the tests, written with the SDK's server API.

Run as a script it serves over stdio (``python mcp_servers.py``); ``serve_http`` runs the
same tools over Streamable HTTP on loopback, on a thread, for the test's lifetime.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from mcp.server.mcpserver import MCPServer

SCRIPT = Path(__file__).resolve()


def build_server() -> MCPServer:
    app = MCPServer("folio-test")

    @app.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @app.tool()
    def token() -> str:
        """The DEMO_TOKEN this server was started with."""
        return f"token is {os.environ.get('DEMO_TOKEN', 'unset')}"

    @app.tool()
    def fail(reason: str) -> str:
        """Always fails."""
        raise ValueError(f"failed: {reason}")

    @app.tool()
    def crash() -> str:
        """The server process exits mid-call."""
        print("crashing now", file=sys.stderr, flush=True)
        os._exit(3)

    @app.tool()
    def sleep(seconds: float) -> str:
        """Answers after a while."""
        time.sleep(seconds)
        return "awake"

    return app


def stdio_entry(env: dict[str, str] | None = None, timeout: float | None = None) -> dict:
    """This script as an mcp.json server entry."""
    entry: dict = {"command": sys.executable, "args": [str(SCRIPT)]}
    if env:
        entry["env"] = env
    if timeout is not None:
        entry["timeout"] = timeout
    return entry


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_http(required_header: tuple[str, str] | None = None):
    """The tools over Streamable HTTP on 127.0.0.1; yields the endpoint's URL. With
    ``required_header``, requests without that header value get a 401."""
    import uvicorn

    app = build_server().streamable_http_app()
    if required_header is not None:
        name, value = required_header
        inner = app

        async def app(scope, receive, send):  # noqa: F811 - the guarded app
            headers = dict(scope.get("headers") or [])
            if scope["type"] == "http" and headers.get(name.lower().encode()) != value.encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
            await inner(scope, receive, send)

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(5)


if __name__ == "__main__":
    build_server().run()
