"""Settings ▸ Tools: the MCP server form writes what the mcp.json editor would, and Test
connection starts a real MCP server (tests/desktop_app/mcp/mcp_servers.py) on its own."""

from __future__ import annotations

import json
import sys

import pytest

from desktop_app.mcp.config import McpConfigError, parse_mcp_json, read_mcp_json
from desktop_app.mcp.server_form import HTTP, ServerFields, fields_of, with_server
from tests.desktop_app.mcp.mcp_servers import SCRIPT

PROBE_MS = 30_000


def tools_page(qtbot, window):
    dialog = window.open_settings()
    qtbot.addWidget(dialog)
    dialog.tabs.setCurrentWidget(dialog.tools_page)
    return dialog, dialog.tools_page


def fill(form, name, command="", args=(), env="", url="", headers="", kind=None):
    form.name.setText(name)
    form.kind.setCurrentIndex(form.kind.findData(kind or ("http" if url else "stdio")))
    form.command.setText(command)
    form.args.setPlainText("\n".join(args))
    form.env.setPlainText(env)
    form.url.setText(url)
    form.headers.setPlainText(headers)


def test_the_form_writes_the_same_json_as_the_editor(qtbot, fake_bridge, make_window,
                                                     folio_dirs):
    window = make_window(fake_bridge)
    dialog, page = tools_page(qtbot, window)
    mcp_path = folio_dirs[1] / "mcp.json"
    form = page.form
    fill(form, "files", "npx", ["-y", "@modelcontextprotocol/server-filesystem",
                                "/home/me/my notes"], env="TOKEN=abc=def\n\nLEVEL=debug")
    assert form.save()
    fill(form, "search", url="http://127.0.0.1:9000/mcp", headers="Authorization=Bearer x")
    form._editing = None  # a second, new server
    assert form.save()
    by_form = read_mcp_json(mcp_path)
    assert page.editor.toPlainText() == by_form and page.error.text() == ""

    typed = """{"mcpServers": {
      "files": {"command": "npx",
                "args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/my notes"],
                "env": {"TOKEN": "abc=def", "LEVEL": "debug"}},
      "search": {"url": "http://127.0.0.1:9000/mcp",
                 "headers": {"Authorization": "Bearer x"}}}}"""
    page.editor.setPlainText(typed)
    page.apply()
    assert page.error.text() == ""
    by_editor = read_mcp_json(mcp_path)
    assert json.loads(by_form) == json.loads(by_editor)
    assert parse_mcp_json(by_form) == parse_mcp_json(by_editor)
    assert [s.name for s in window.tools.config.servers] == ["files", "search"]
    dialog.reject()


def test_editing_a_server_keeps_its_place_and_the_others(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    dialog, page = tools_page(qtbot, window)
    page.editor.setPlainText(json.dumps({"mcpServers": {
        "a": {"command": "one"}, "b": {"command": "two", "args": ["x"], "timeout": 5},
        "c": {"url": "https://example.com/mcp"}}}))
    picker = page.form.picker
    assert [picker.itemText(i) for i in range(picker.count())] == ["New server", "a", "b", "c"]
    picker.setCurrentIndex(2)
    picker.activated.emit(2)  # as a user's pick
    form = page.form
    assert (form.name.text(), form.command.text(), form.args.toPlainText(),
            form.timeout.value()) == ("b", "two", "x", 5)
    form.name.setText("bee")
    form.args.setPlainText("x\ny")
    assert form.save()
    servers = json.loads(page.editor.toPlainText())["mcpServers"]
    assert list(servers) == ["a", "bee", "c"]
    assert servers["bee"] == {"command": "two", "args": ["x", "y"], "timeout": 5.0}
    assert [s.name for s in window.tools.config.servers] == ["a", "bee", "c"]
    dialog.reject()


@pytest.mark.parametrize("setup, message", [
    (dict(name="", command="npx"), "Not saved: name: a server needs a name"),
    (dict(name="x", command="npx", env="TOKEN"),
     "Not saved: Environment: row 1 must be KEY=VALUE, got 'TOKEN'"),
    (dict(name="x", command=""), "Not saved: mcpServers.x.command must be a non-empty string"),
    (dict(name="x", url="ftp://host/mcp"),
     "Not saved: mcpServers.x.url must be an http:// or https:// URL"),
])
def test_a_bad_form_is_refused_with_the_field_named(qtbot, fake_bridge, make_window,
                                                    folio_dirs, setup, message):
    window = make_window(fake_bridge)
    dialog, page = tools_page(qtbot, window)
    before = page.editor.toPlainText()
    fill(page.form, **setup)
    assert not page.form.save()
    assert page.form.message.text() == message
    assert page.editor.toPlainText() == before
    assert not (folio_dirs[1] / "mcp.json").exists()  # nothing written
    dialog.reject()


def test_with_server_refuses_a_second_server_of_the_same_name():
    text = with_server("", ServerFields("a", command="one"))
    with pytest.raises(McpConfigError, match="name: a server named 'a' is already"):
        with_server(text, ServerFields("a", command="two"))
    assert fields_of("h", {"url": "http://h/mcp", "headers": {"K": "v"}}) == ServerFields(
        "h", HTTP, url="http://h/mcp", headers={"K": "v"})


def test_test_connection_lists_the_servers_tools(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    dialog, page = tools_page(qtbot, window)
    form = page.form
    fill(form, "demo", sys.executable, [str(SCRIPT)], env="DEMO_TOKEN=abc")
    with qtbot.waitSignal(form.probe.finished, timeout=PROBE_MS) as finished:
        form.test_button.click()
        assert not form.test_button.isEnabled()
    result = finished.args[0]
    assert result.ok and {t.name for t in result.tools} >= {"add", "token", "sleep"}
    assert form.message.text().startswith("demo: connected · 5 tool(s): ")
    assert form.test_button.isEnabled()
    assert window.tools.config.servers == ()  # a test applies nothing
    form.probe.close()
    dialog.reject()


def test_test_connection_says_why_a_server_fails(qtbot, fake_bridge, make_window, tmp_path):
    window = make_window(fake_bridge)
    dialog, page = tools_page(qtbot, window)
    form = page.form
    fill(form, "broken", str(tmp_path / "no-such-program"))
    with qtbot.waitSignal(form.probe.finished, timeout=PROBE_MS):
        form.test_button.click()
    text = form.message.text()
    assert text.startswith("broken: could not connect · could not start") and \
        "no-such-program" in text
    form.probe.close()
    dialog.reject()
