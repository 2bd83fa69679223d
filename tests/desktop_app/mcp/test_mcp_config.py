"""mcp.json: the mcpServers format read, each bad field named, secrets kept out of text."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from desktop_app.mcp.config import (
    EMPTY_MCP_JSON,
    McpConfigError,
    parse_mcp_json,
    read_mcp_json,
    redact,
    write_mcp_json,
)

CLAUDE_STYLE = {"mcpServers": {
    "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
                                         "/tmp"], "env": {"API_TOKEN": "tok-123456"}},
    "search": {"url": "https://example.org/mcp", "headers": {"Authorization": "Bearer abc"},
               "timeout": 5},
}}


def test_reads_stdio_and_http_servers():
    config = parse_mcp_json(json.dumps(CLAUDE_STYLE))
    files, search = config.servers
    assert (files.kind, files.command, files.args) == ("stdio", "npx", (
        "-y", "@modelcontextprotocol/server-filesystem", "/tmp"))
    assert files.env == {"API_TOKEN": "tok-123456"}
    assert (search.kind, search.url, search.timeout_s) == ("http", "https://example.org/mcp", 5)
    assert config.server("search") is search and config.server("nope") is None


def test_secrets_are_listed_and_redacted_and_never_public():
    config = parse_mcp_json(json.dumps(CLAUDE_STYLE))
    assert set(config.servers[0].secrets) == {"tok-123456"}
    text = "env API_TOKEN=tok-123456, header Bearer abc"
    assert config.redact(text) == "env API_TOKEN=•••, header •••"
    for server in config.servers:
        assert not any(s in server.public for s in server.secrets)
    assert redact("a b", ["a"]) == "a b"  # too short to be told apart from words


@pytest.mark.parametrize(("raw", "field"), [
    ({"mcpServers": {"x": {}}}, "mcpServers.x needs either"),
    ({"mcpServers": {"x": {"command": "a", "url": "http://h/"}}}, "mcpServers.x needs"),
    ({"mcpServers": {"x": {"command": ""}}}, "mcpServers.x.command"),
    ({"mcpServers": {"x": {"command": "a", "args": "b"}}}, "mcpServers.x.args"),
    ({"mcpServers": {"x": {"command": "a", "env": {"K": 1}}}}, "mcpServers.x.env"),
    ({"mcpServers": {"x": {"url": "ftp://h/"}}}, "mcpServers.x.url"),
    ({"mcpServers": {"x": {"url": "http://h/", "headers": []}}}, "mcpServers.x.headers"),
    ({"mcpServers": {"x": {"url": "http://h/", "timeout": 0}}}, "mcpServers.x.timeout"),
    ({"mcpServers": {"x": {"command": "a", "headers": {}}}}, "unknown field(s) headers"),
    ({"mcpServers": {"x": {"url": "http://h/", "type": "sse"}}}, "mcpServers.x.type"),
    ({"mcpServers": {"a/b": {"command": "a"}}}, "mcpServers.a/b"),
    ({"mcpServers": []}, "mcpServers must be an object"),
    ([], "mcp.json must be an object"),
])
def test_bad_fields_are_named(raw, field):
    with pytest.raises(McpConfigError, match=field.replace("(", r"\(").replace(")", r"\)")):
        parse_mcp_json(json.dumps(raw))


def test_not_json_says_where():
    with pytest.raises(McpConfigError, match="line 1, column"):
        parse_mcp_json("{nope")


def test_write_checks_first_and_keeps_the_file_private(tmp_path):
    path = tmp_path / "mcp.json"
    assert parse_mcp_json(read_mcp_json(path)).servers == ()
    write_mcp_json(path, json.dumps(CLAUDE_STYLE))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(McpConfigError):
        write_mcp_json(path, "{")
    assert json.loads(read_mcp_json(path)) == CLAUDE_STYLE  # the bad text wrote nothing


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_the_secrets_are_never_in_a_file_others_may_read(tmp_path, monkeypatch):
    """Private from the file's creation: a chmod before the rename would be too late."""
    seen: list[tuple[str, int, bytes]] = []

    def look(name: str, real):
        def call(path, *args, **kwargs):
            path = Path(path)
            if path.name.endswith(".tmp"):
                seen.append((name, stat.S_IMODE(path.stat().st_mode), path.read_bytes()))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "chmod", look("chmod", os.chmod))
    monkeypatch.setattr(os, "replace", look("replace", os.replace))
    old = os.umask(0o022)
    try:
        write_mcp_json(tmp_path / "mcp.json", json.dumps(CLAUDE_STYLE))
    finally:
        os.umask(old)
    assert [name for name, _, _ in seen][-1] == "replace"
    assert all(b"tok-123456" in data for _, _, data in seen)
    assert [mode for _, mode, _ in seen] == [0o600] * len(seen)


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(tmp_path,
                                                                       monkeypatch):
    path = tmp_path / "mcp.json"
    write_mcp_json(path, json.dumps(CLAUDE_STYLE))

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(OSError):
        write_mcp_json(path, EMPTY_MCP_JSON)
    assert json.loads(read_mcp_json(path)) == CLAUDE_STYLE
    assert [p.name for p in tmp_path.iterdir()] == ["mcp.json"]
