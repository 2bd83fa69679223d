"""A chat's tools: its selection over the servers' tools, names the model can call."""

from __future__ import annotations

from desktop_app.mcp.events import ToolInfo
from desktop_app.mcp.toolset import toolset, with_server, with_tool

CALC = (ToolInfo("calc", "add", "Add", {"type": "object", "properties": {"a": {}}}),
        ToolInfo("calc", "mul", "Multiply"))
FILES = (ToolInfo("files", "read.file", "Read"), ToolInfo("files", "add", "Append"))
TOOLS = {"calc": CALC, "files": FILES}


def test_only_the_selected_tools_under_names_the_model_can_call():
    assert not toolset(TOOLS, {})
    chosen = toolset(TOOLS, {"calc": ["mul"], "files": None})
    assert list(chosen.by_name) == ["mul", "read_file", "add"]
    assert chosen.resolve("read_file") == FILES[0] and chosen.resolve("nope") is None
    both = toolset(TOOLS, {"calc": None, "files": None})
    assert both.resolve("calc_add") == CALC[0] and both.resolve("files_add") == FILES[1]
    definition = toolset(TOOLS, {"calc": ["add"]}).definitions()
    assert definition == [{"type": "function", "function": {
        "name": "add", "description": "Add", "parameters": CALC[0].input_schema}}]
    assert toolset(TOOLS, {"calc": ["mul"]}).definitions()[0]["function"]["parameters"] == {
        "type": "object", "properties": {}}


def test_toggling_tools_and_servers():
    names = ["add", "mul"]
    sel = with_server({}, "calc", True)
    assert sel == {"calc": None}
    sel = with_tool(sel, CALC[0], False, names)
    assert sel == {"calc": ["mul"]}
    assert with_tool(sel, CALC[0], True, names) == {"calc": None}
    assert with_tool(sel, CALC[1], False, names) == {}
    assert with_server({"calc": ["mul"]}, "calc", False) == {}
