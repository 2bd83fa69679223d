"""The toolbar's "Tools" button: for the open chat, a toggle per MCP server and per tool.

It shows what it is handed (``set_entries``) and reports each toggle (``toggled``); the
chat's selection itself lives in the chat's settings, kept by its controller."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QMenu, QToolButton, QWidget


@dataclass(slots=True, frozen=True)
class ServerEntry:
    name: str
    state: str  # "ready", "failed", ... as the hub says
    on: bool  # the server is on for this chat
    tools: tuple[tuple[str, bool], ...]  # (tool name, on)


class ChatToolsButton(QToolButton):
    toggled_tool = Signal(str, str, bool)  # server, tool ("" for the whole server), on

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatToolsButton")
        self.setText("Tools")
        self.setAccessibleName("Tools this chat's model may use")
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu_ = QMenu(self)
        self.menu_.setObjectName("chatToolsMenu")
        self.setMenu(self.menu_)
        self.set_entries([], "Add MCP servers in Settings ▸ Tools.")

    def set_entries(self, entries: list[ServerEntry], note: str = "") -> None:
        menu = self.menu_
        menu.clear()
        if note:
            menu.addAction(note).setEnabled(False)
        count = 0
        for entry in entries:
            label = entry.name if entry.state == "ready" else f"{entry.name} ({entry.state})"
            server = menu.addAction(label)
            server.setCheckable(True)
            server.setChecked(entry.on)
            server.setObjectName(f"toolServer:{entry.name}")
            server.toggled.connect(
                lambda on, name=entry.name: self.toggled_tool.emit(name, "", on))
            for tool, on in entry.tools:
                action = menu.addAction(f"    {tool}")
                action.setCheckable(True)
                action.setChecked(on)
                action.setObjectName(f"tool:{entry.name}/{tool}")
                action.toggled.connect(
                    lambda checked, s=entry.name, t=tool: self.toggled_tool.emit(s, t, checked))
                count += on
            menu.addSeparator()
        self.setText(f"Tools ({count})" if count else "Tools")
        self.setToolTip(f"{count} tool(s) on for this chat" if count else
                        "No tools on for this chat: choose a server's tools here")

    def action(self, object_name: str):
        return next((a for a in self.menu_.actions() if a.objectName() == object_name), None)
