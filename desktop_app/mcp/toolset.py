"""What one chat lets the model call: its selection (``ChatSettings.tools``: per server,
None for every tool or the names chosen) over the tools the servers listed.

The model sees each tool under a function name (1 to 64 letters, digits, ``_`` or ``-``,
as OpenAI's tools are named): the MCP tool's own name where it fits and is unique, else
one made from the server's and tool's names. ``ChatToolset.resolve`` maps a call back to
the server and tool that run it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from desktop_app.mcp.events import ToolInfo

_BAD = re.compile(r"[^A-Za-z0-9_-]")
MAX_NAME = 64


def selected(selection: Mapping[str, list[str] | None], tool: ToolInfo) -> bool:
    chosen = selection.get(tool.server, ())
    return chosen is None or tool.name in (chosen or ())


def with_tool(selection: Mapping[str, list[str] | None], tool: ToolInfo, on: bool,
              all_tools: list[str]) -> dict[str, list[str] | None]:
    """The selection with one tool turned on or off (``all_tools``: its server's tools)."""
    out = dict(selection)
    chosen = out.get(tool.server, ())
    names = list(all_tools) if chosen is None else list(chosen or ())
    names = [n for n in names if n != tool.name] + ([tool.name] if on else [])
    if not names:
        out.pop(tool.server, None)
    else:
        out[tool.server] = None if set(names) >= set(all_tools) else sorted(names)
    return out


def with_server(selection: Mapping[str, list[str] | None], server: str,
                on: bool) -> dict[str, list[str] | None]:
    out = dict(selection)
    if on:
        out[server] = None
    else:
        out.pop(server, None)
    return out


@dataclass(slots=True, frozen=True)
class ChatToolset:
    by_name: dict[str, ToolInfo] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def resolve(self, name: str) -> ToolInfo | None:
        return self.by_name.get(name)

    def definitions(self) -> list[dict]:
        """The tools as OpenAI function definitions, for the chat template."""
        out = []
        for name, tool in self.by_name.items():
            schema = tool.input_schema or {"type": "object", "properties": {}}
            out.append({"type": "function", "function": {
                "name": name, "description": tool.description, "parameters": schema}})
        return out


def toolset(tools: Mapping[str, tuple[ToolInfo, ...]],
            selection: Mapping[str, list[str] | None]) -> ChatToolset:
    """tools: each server's listed tools (the last list a server gave, so a server that
    crashed keeps its place in the prompt and restarts when called)."""
    chosen = [t for server in sorted(tools) for t in tools[server] if selected(selection, t)]
    counts: dict[str, int] = {}
    for tool in chosen:
        counts[_clean(tool.name)] = counts.get(_clean(tool.name), 0) + 1
    by_name: dict[str, ToolInfo] = {}
    for tool in chosen:
        name = _clean(tool.name)
        if counts[name] > 1 or not name:
            name = _clean(f"{tool.server}_{tool.name}")
        while name in by_name:
            name = name[: MAX_NAME - 1] + "_"
        by_name[name] = tool
    return ChatToolset(by_name)


def _clean(name: str) -> str:
    return _BAD.sub("_", name)[:MAX_NAME]
