"""One MCP server as the Settings ▸ Tools form edits it, and back into ``mcp.json`` text.

The form is another way to write the same file: ``with_server`` puts a server's entry into
the editor's text (other servers, and their order, untouched) exactly as a user would type
it (``command``/``args``/``env`` or ``url``/``headers``, ``timeout`` only when not the
default), then checks the whole text with ``parse_mcp_json``, so the form refuses what the
editor's Apply would refuse, with the field named."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from desktop_app.mcp.config import DEFAULT_TIMEOUT_S, McpConfigError, parse_mcp_json

STDIO, HTTP = "stdio", "http"


@dataclass(slots=True)
class ServerFields:
    name: str
    kind: str = STDIO
    command: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S


def parse_pairs(text: str, what: str) -> dict[str, str]:
    """``KEY=VALUE`` rows (blank rows skipped; the value may hold "=") as a dict."""
    pairs: dict[str, str] = {}
    for number, row in enumerate(text.splitlines(), 1):
        if not row.strip():
            continue
        key, sep, value = row.partition("=")
        key = key.strip()
        if not sep or not key:
            raise McpConfigError(f"{what}: row {number} must be KEY=VALUE, got {row.strip()!r}")
        pairs[key] = value
    return pairs


def pairs_text(pairs: dict[str, str]) -> str:
    return "\n".join(f"{k}={v}" for k, v in pairs.items())


def parse_args(text: str) -> list[str]:
    """One argument a row, as typed (blank rows skipped): no shell quoting to get wrong."""
    return [row.strip() for row in text.splitlines() if row.strip()]


def entry_of(fields: ServerFields) -> dict[str, Any]:
    """The server's ``mcpServers`` entry."""
    if fields.kind == STDIO:
        entry: dict[str, Any] = {"command": fields.command.strip(), "args": list(fields.args)}
        if fields.env:
            entry["env"] = dict(fields.env)
    elif fields.kind == HTTP:
        entry = {"url": fields.url.strip()}
        if fields.headers:
            entry["headers"] = dict(fields.headers)
    else:
        raise McpConfigError(f"kind must be {STDIO} or {HTTP}, got {fields.kind!r}")
    if fields.timeout_s != DEFAULT_TIMEOUT_S:
        entry["timeout"] = fields.timeout_s
    return entry


def fields_of(name: str, raw: dict[str, Any]) -> ServerFields:
    """A server entry of the editor's text back into the form's fields."""
    timeout = float(raw.get("timeout", DEFAULT_TIMEOUT_S))
    if "url" in raw:
        return ServerFields(name, HTTP, url=raw["url"], headers=dict(raw.get("headers", {})),
                            timeout_s=timeout)
    return ServerFields(name, STDIO, command=raw.get("command", ""),
                        args=list(raw.get("args", [])), env=dict(raw.get("env", {})),
                        timeout_s=timeout)


def servers_of(text: str) -> dict[str, dict[str, Any]]:
    """The editor's servers by name, as written (McpConfigError for a text not JSON)."""
    parse_mcp_json(text)
    return dict(json.loads(text).get("mcpServers", {}))


def with_server(text: str, fields: ServerFields, replacing: str | None = None) -> str:
    """The editor's `text` with `fields`' server added, or put in place of `replacing`
    (renamed where the name changed); McpConfigError, naming the field, if the result is
    not a config the app can use."""
    name = fields.name.strip()
    if not name:
        raise McpConfigError("name: a server needs a name")
    if text.strip():
        parse_mcp_json(text)  # the editor's own mistakes are named first
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise McpConfigError("mcp.json must be an object with \"mcpServers\"")
    servers = data.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise McpConfigError("mcpServers must be an object of servers by name")
    if name in servers and name != replacing:
        raise McpConfigError(f"name: a server named {name!r} is already in mcp.json")
    entry = entry_of(fields)
    rebuilt: dict[str, Any] = {}
    for key, value in servers.items():  # the edited server keeps its place
        if key == replacing:
            rebuilt[name] = entry
        elif key != name:
            rebuilt[key] = value
    rebuilt.setdefault(name, entry)
    data["mcpServers"] = rebuilt
    out = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    parse_mcp_json(out)
    return out
