"""``mcp.json``: the MCP servers the app may start, in the ``mcpServers`` format that Claude
Desktop, LM Studio and Jan read::

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
                                             "/home/me/notes"], "env": {"TOKEN": "..."}},
        "search": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "..."}}
    }}

A server has either ``command`` (stdio: ``args``, ``env``, optional ``cwd``) or ``url``
(Streamable HTTP: ``headers``); ``timeout`` (seconds a call may take) is Folio's own.
``env`` and ``headers`` values are secrets: ``ServerConfig.secrets`` lists them so
``redact`` can take them out of any text shown or logged, and ``public`` is what a chat or
an export may carry of a server (its name and kind, never those values).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MCP_FILE = "mcp.json"
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 3600.0
_STDIO_KEYS = {"command", "args", "env", "cwd", "timeout", "type"}
_HTTP_KEYS = {"url", "headers", "timeout", "type"}
_TYPES = {"stdio", "http", "streamable-http", "streamableHttp"}
EMPTY_MCP_JSON = '{\n  "mcpServers": {}\n}\n'


class McpConfigError(ValueError):
    """mcp.json cannot be used; the message names the field (``mcpServers.files.args``)."""


@dataclass(slots=True, frozen=True)
class ServerConfig:
    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def kind(self) -> str:
        return "stdio" if self.command is not None else "http"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values no chat, export or log may show."""
        return tuple(v for v in (*self.env.values(), *self.headers.values()) if v)

    @property
    def public(self) -> str:
        """How the server may be named where secrets must not go."""
        if self.command is not None:
            return f"{self.name} (stdio: {Path(self.command).name})"
        parts = urlsplit(self.url or "")
        return f"{self.name} (http: {parts.hostname or ''}{parts.path})"


@dataclass(slots=True, frozen=True)
class McpConfig:
    servers: tuple[ServerConfig, ...] = ()

    def server(self, name: str) -> ServerConfig | None:
        return next((s for s in self.servers if s.name == name), None)

    def redact(self, text: str) -> str:
        return redact(text, [s for server in self.servers for s in server.secrets])


def redact(text: str, secrets) -> str:
    """text with every secret value replaced by ``•••``."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if len(secret) >= 3:  # shorter values would blank out ordinary words
            text = text.replace(secret, "•••")
    return text


def parse_mcp_json(text: str) -> McpConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise McpConfigError(f"mcp.json is not valid JSON: {err.msg} at line {err.lineno}, "
                             f"column {err.colno}") from None
    if not isinstance(data, dict):
        raise McpConfigError("mcp.json must be an object with \"mcpServers\"")
    servers = data.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise McpConfigError("mcpServers must be an object of servers by name")
    return McpConfig(tuple(_server(name, raw) for name, raw in servers.items()))


def _server(name: str, raw: Any) -> ServerConfig:
    where = f"mcpServers.{name}"
    if not name.strip() or "/" in name:
        raise McpConfigError(f"{where}: a server's name must be non-empty, without '/'")
    if not isinstance(raw, dict):
        raise McpConfigError(f"{where} must be an object")
    kind = raw.get("type")
    if kind is not None and kind not in _TYPES:
        raise McpConfigError(f"{where}.type must be stdio or http, got {kind!r} (Folio "
                             "speaks stdio and Streamable HTTP)")
    if ("command" in raw) == ("url" in raw):
        raise McpConfigError(f"{where} needs either \"command\" (a program to start) or "
                             "\"url\" (a Streamable HTTP endpoint)")
    allowed = _STDIO_KEYS if "command" in raw else _HTTP_KEYS
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise McpConfigError(f"{where} has unknown field(s) {', '.join(unknown)}")
    timeout = raw.get("timeout", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not 0 < timeout <= MAX_TIMEOUT_S:
        raise McpConfigError(f"{where}.timeout must be seconds in (0, {MAX_TIMEOUT_S:g}], "
                             f"got {timeout!r}")
    if "command" in raw:
        command = raw["command"]
        if not isinstance(command, str) or not command.strip():
            raise McpConfigError(f"{where}.command must be a non-empty string")
        args = raw.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise McpConfigError(f"{where}.args must be a list of strings")
        cwd = raw.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise McpConfigError(f"{where}.cwd must be a string")
        return ServerConfig(name, command=command, args=tuple(args),
                            env=_strings(raw.get("env", {}), f"{where}.env"), cwd=cwd,
                            timeout_s=float(timeout))
    url = raw["url"]
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") \
            or not urlsplit(url).hostname:
        raise McpConfigError(f"{where}.url must be an http:// or https:// URL")
    return ServerConfig(name, url=url, headers=_strings(raw.get("headers", {}),
                                                        f"{where}.headers"),
                        timeout_s=float(timeout))


def _strings(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise McpConfigError(f"{where} must be an object of strings")
    return dict(value)


def mcp_json_path(config_dir: Path) -> Path:
    return config_dir / MCP_FILE


def read_mcp_json(path: Path) -> str:
    """The file's text; an empty config where there is none yet."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return EMPTY_MCP_JSON


def write_mcp_json(path: Path, text: str) -> McpConfig:
    """Check, then write (the file may hold secrets: readable by its owner only)."""
    config = parse_mcp_json(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (text if text.endswith("\n") else text + "\n").encode("utf-8")
    # Created 0600 (a chmod after the write would leave the secrets readable meanwhile),
    # under a name no other writer or leftover file has (O_EXCL would refuse it).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return config
