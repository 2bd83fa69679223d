"""ToolsBridge: mcp.json read at start, applied from Settings, events on the GUI thread."""

from __future__ import annotations

import json

import pytest

from desktop_app.mcp.config import McpConfigError
from desktop_app.services.tools_bridge import ToolsBridge
from tests.desktop_app.mcp.mcp_servers import stdio_entry


@pytest.fixture
def make_bridge(tmp_path):
    made = []

    def make():
        bridge = ToolsBridge(tmp_path)
        made.append(bridge)
        return bridge

    yield make
    for bridge in made:
        bridge.shutdown()


def test_a_bad_mcp_json_on_disk_starts_nothing_and_says_why(make_bridge, tmp_path):
    (tmp_path / "mcp.json").write_text('{"mcpServers": {"x": {"url": "ftp://h"}}}')
    bridge = make_bridge()
    bridge.start()
    assert "mcpServers.x.url" in bridge.config_error and bridge.config.servers == ()


def test_apply_refuses_bad_text_and_keeps_the_file(make_bridge, tmp_path):
    bridge = make_bridge()
    bridge.start()
    with pytest.raises(McpConfigError, match="mcpServers.x.args"):
        bridge.apply_text('{"mcpServers": {"x": {"command": "a", "args": 1}}}')
    assert not (tmp_path / "mcp.json").exists()


def test_servers_report_on_the_gui_thread_and_keep_their_tools(qtbot, make_bridge):
    bridge = make_bridge()
    bridge.start()
    with qtbot.waitSignal(bridge.serversChanged, timeout=30_000,
                          check_params_cb=lambda: "demo" in bridge.known_tools):
        bridge.apply_text(json.dumps({"mcpServers": {"demo": stdio_entry()}}))
    assert bridge.statuses["demo"].state == "ready"
    assert bridge.toolset({"demo": ["add"]}).resolve("add").server == "demo"
    with qtbot.waitSignal(bridge.callFinished, timeout=30_000) as got:
        bridge.call("c1", "demo", "crash", {})
    assert got.args[0] == "c1" and not got.args[1].ok
    qtbot.waitUntil(lambda: bridge.statuses["demo"].state == "failed", timeout=10_000)
    # Its tools stay known, so chats keep them in their prompts until it restarts.
    assert "add" in {t.name for t in bridge.known_tools["demo"]}
    bridge.apply_text('{"mcpServers": {}}')
    assert bridge.statuses == {} and bridge.known_tools == {}
