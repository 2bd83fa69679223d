"""Settings ▸ Tools: the MCP servers, as the ``mcp.json`` text Claude Desktop, LM Studio
and Jan read, and each server's state (starting, ready with its tools, failed and why).

Apply checks the text, saves it and starts or stops servers to match at once (a bad text
is refused with the field named and changes nothing); OK and Cancel of the dialog do not
touch it. The text is the user's own file: env and headers values show here, and only
here."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from desktop_app.dialogs.mcp_form import McpServerForm
from desktop_app.mcp.events import FAILED, READY

HELP = ("MCP servers give the model tools: files, search, anything a server offers. Each "
        "server is a program Folio starts (\"command\", \"args\", \"env\") or a Streamable "
        "HTTP endpoint (\"url\", \"headers\"); \"timeout\" is the seconds a call may take "
        "(60 by default). Turn tools on per chat with the toolbar's Tools button; each call "
        "waits for your Run unless you chose Always allow for that tool.")


def status_line(name: str, status, tools: tuple) -> str:
    if status is None:
        return f"{name}: starting…"
    if status.state == READY:
        listed = ", ".join(t.name for t in tools) or "no tools"
        return f"{name}: ready · {len(tools)} tool(s): {listed}"
    if status.state == FAILED:
        return f"{name}: failed · {status.error}"
    return f"{name}: {status.state}"


class ToolsSettingsPage(QWidget):
    """The form (dialogs.mcp_form) beside the mcp.json editor; both end in Apply."""

    def __init__(self, tools_bridge, parent: QWidget | None = None, probe=None) -> None:
        super().__init__(parent)
        self.setObjectName("toolsSettings")
        self.tools = tools_bridge
        note = QLabel(HELP)
        note.setObjectName("mutedLabel")
        note.setWordWrap(True)
        self.editor = QPlainTextEdit(tools_bridge.config_text())
        self.editor.setObjectName("mcpJsonEdit")
        self.editor.setAccessibleName("mcp.json")
        self.editor.setPlaceholderText('{"mcpServers": {"name": {"command": "...", '
                                       '"args": []}}}')
        self.apply_button = QPushButton("Apply")
        self.apply_button.setObjectName("mcpApplyButton")
        self.apply_button.setToolTip("Save mcp.json and start or stop servers to match")
        self.apply_button.clicked.connect(self.apply)
        self.restart_button = QPushButton("Restart server")
        self.restart_button.setObjectName("mcpRestartButton")
        self.restart_button.clicked.connect(self.restart_selected)
        self.error = QLabel("")
        self.error.setObjectName("mcpError")
        self.error.setWordWrap(True)
        self.servers = QListWidget()
        self.servers.setObjectName("mcpServerList")
        self.servers.setAccessibleName("MCP servers")
        self.servers.setWordWrap(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.restart_button)
        buttons.addStretch(1)
        self.form = McpServerForm(self.editor.toPlainText, probe)
        self.form.saveRequested.connect(self._save_from_form)
        self.editor.textChanged.connect(self.form.refresh_picker)
        json_side = QWidget()
        json_layout = QVBoxLayout(json_side)
        json_layout.setContentsMargins(0, 0, 0, 0)
        json_layout.addWidget(QLabel(f"mcp.json ({tools_bridge.path})"))
        json_layout.addWidget(self.editor, 1)
        beside = QSplitter()
        beside.setObjectName("mcpFormSplitter")
        beside.setChildrenCollapsible(False)
        beside.addWidget(self.form)
        beside.addWidget(json_side)
        layout = QVBoxLayout(self)
        layout.addWidget(note)
        layout.addWidget(beside, 2)
        layout.addLayout(buttons)
        layout.addWidget(self.error)
        layout.addWidget(QLabel("Servers"))
        layout.addWidget(self.servers, 1)
        tools_bridge.serversChanged.connect(self.refresh)
        self.refresh()

    def apply(self) -> None:
        try:
            self.tools.apply_text(self.editor.toPlainText())
        except ValueError as exc:
            self.error.setText(f"Not applied: {exc}")
            return
        self.error.setText("")

    def _save_from_form(self, text: str) -> None:
        """The form's server, into the editor and applied like a typed edit."""
        self.editor.setPlainText(text)
        self.apply()

    def restart_selected(self) -> None:
        item = self.servers.currentItem()
        if item is not None:
            self.tools.restart(item.data(256))

    def refresh(self) -> None:
        if self.tools.config_error and not self.error.text():
            self.error.setText(f"mcp.json is not used: {self.tools.config_error}")
        current = self.servers.currentRow()
        self.servers.clear()
        for server in self.tools.config.servers:
            status = self.tools.statuses.get(server.name)
            tools = self.tools.known_tools.get(server.name, ())
            item = QListWidgetItem(status_line(server.name, status, tools))
            item.setData(256, server.name)  # Qt.UserRole
            item.setToolTip(server.public)
            self.servers.addItem(item)
        self.servers.setCurrentRow(min(current, self.servers.count() - 1))
        self.restart_button.setEnabled(self.servers.count() > 0)
