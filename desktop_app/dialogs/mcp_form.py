"""Settings ▸ Tools: an MCP server as a form, beside the mcp.json editor.

Name, a program to start (command, one argument a row, environment variables as
KEY=VALUE rows) or a Streamable HTTP URL (with header rows), and the seconds a call may
take. "Save to mcp.json" hands the editor's text with this server in it to the page
(``saveRequested``), which shows and applies it like a typed edit; "Test connection"
starts the server alone (services.mcp_probe), off the GUI thread, and lists its tools or
says why it failed. Picking a server of the editor's text loads it for editing."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtGui import QHideEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from desktop_app.mcp.config import MAX_TIMEOUT_S, McpConfigError, parse_mcp_json
from desktop_app.mcp.server_form import (
    HTTP,
    STDIO,
    ServerFields,
    fields_of,
    pairs_text,
    parse_args,
    parse_pairs,
    servers_of,
    with_server,
)
from desktop_app.services.mcp_probe import ConnectionProbe, ProbeResult

NEW_SERVER = "New server"


def _rows_edit(name: str, placeholder: str) -> QPlainTextEdit:
    edit = QPlainTextEdit()
    edit.setObjectName(name)
    edit.setPlaceholderText(placeholder)
    edit.setFixedHeight(64)
    return edit


class McpServerForm(QWidget):
    saveRequested = Signal(str)  # the editor's new mcp.json text

    def __init__(self, editor_text: Callable[[], str], probe: ConnectionProbe | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("mcpServerForm")
        self._editor_text = editor_text
        self.probe = probe if probe is not None else ConnectionProbe(parent=self)
        self.probe.finished.connect(self._on_probe_finished)
        self.picker = QComboBox()
        self.picker.setObjectName("mcpFormPicker")
        self.picker.setAccessibleName("Server to edit")
        self.picker.activated.connect(lambda _i: self.load(self.picker.currentData()))
        self.name = QLineEdit()
        self.name.setObjectName("mcpFormName")
        self.name.setPlaceholderText("files")
        self.kind = QComboBox()
        self.kind.setObjectName("mcpFormKind")
        self.kind.addItem("A program (stdio)", STDIO)
        self.kind.addItem("An HTTP endpoint", HTTP)
        self.command = QLineEdit()
        self.command.setObjectName("mcpFormCommand")
        self.command.setPlaceholderText("npx")
        self.args = _rows_edit("mcpFormArgs", "one argument a row, e.g.\n-y\n"
                               "@modelcontextprotocol/server-filesystem")
        self.env = _rows_edit("mcpFormEnv", "KEY=VALUE, one a row")
        self.url = QLineEdit()
        self.url.setObjectName("mcpFormUrl")
        self.url.setPlaceholderText("http://127.0.0.1:9000/mcp")
        self.headers = _rows_edit("mcpFormHeaders", "Header=value, one a row")
        self.timeout = QDoubleSpinBox()
        self.timeout.setObjectName("mcpFormTimeout")
        self.timeout.setRange(1, MAX_TIMEOUT_S)
        self.timeout.setDecimals(0)
        self.timeout.setSuffix(" s")
        self.timeout.setValue(60)
        self.timeout.setToolTip("How long one tool call may take")

        program = QWidget()
        program_form = QFormLayout(program)
        program_form.setContentsMargins(0, 0, 0, 0)
        program_form.addRow("Command", self.command)
        program_form.addRow("Arguments", self.args)
        program_form.addRow("Environment", self.env)
        endpoint = QWidget()
        endpoint_form = QFormLayout(endpoint)
        endpoint_form.setContentsMargins(0, 0, 0, 0)
        endpoint_form.addRow("URL", self.url)
        endpoint_form.addRow("Headers", self.headers)
        self.kind_pages = QStackedWidget()
        self.kind_pages.addWidget(program)
        self.kind_pages.addWidget(endpoint)
        self.kind.currentIndexChanged.connect(self.kind_pages.setCurrentIndex)

        self.save_button = QPushButton("Save to mcp.json")
        self.save_button.setObjectName("mcpFormSave")
        self.save_button.setToolTip("Put this server into mcp.json and start it")
        self.save_button.clicked.connect(self.save)
        self.test_button = QPushButton("Test connection")
        self.test_button.setObjectName("mcpFormTest")
        self.test_button.setToolTip("Start this server on its own and list its tools")
        self.test_button.clicked.connect(self.test_connection)
        self.message = QLabel("")
        self.message.setObjectName("mcpFormMessage")
        self.message.setWordWrap(True)

        form = QFormLayout()
        form.addRow("Server", self.picker)
        form.addRow("Name", self.name)
        form.addRow("Kind", self.kind)
        buttons = QHBoxLayout()
        buttons.addWidget(self.save_button)
        buttons.addWidget(self.test_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(form)
        layout.addWidget(self.kind_pages)
        tail = QFormLayout()
        tail.addRow("Call timeout", self.timeout)
        layout.addLayout(tail)
        layout.addLayout(buttons)
        layout.addWidget(self.message)
        layout.addStretch(1)
        self._editing: str | None = None
        self.refresh_picker()

    # -- the fields -------------------------------------------------------------------
    def fields(self) -> ServerFields:
        """What the form says (McpConfigError, naming the field, for a bad row)."""
        return ServerFields(
            self.name.text().strip(), self.kind.currentData(), command=self.command.text(),
            args=parse_args(self.args.toPlainText()),
            env=parse_pairs(self.env.toPlainText(), "Environment"),
            url=self.url.text(), headers=parse_pairs(self.headers.toPlainText(), "Headers"),
            timeout_s=float(self.timeout.value()))

    def set_fields(self, fields: ServerFields) -> None:
        self.name.setText(fields.name)
        self.kind.setCurrentIndex(max(0, self.kind.findData(fields.kind)))
        self.command.setText(fields.command)
        self.args.setPlainText("\n".join(fields.args))
        self.env.setPlainText(pairs_text(fields.env))
        self.url.setText(fields.url)
        self.headers.setPlainText(pairs_text(fields.headers))
        self.timeout.setValue(fields.timeout_s)

    def refresh_picker(self) -> None:
        """The servers of the editor's text (none listed while it does not parse)."""
        try:
            names = list(servers_of(self._editor_text()))
        except (McpConfigError, ValueError):
            names = []
        self.picker.clear()
        self.picker.addItem(NEW_SERVER, None)
        for name in names:
            self.picker.addItem(name, name)
        self.picker.setCurrentIndex(max(0, self.picker.findData(self._editing)))

    def load(self, name: str | None) -> None:
        """Edit the editor's server `name`; None: an empty form for a new one."""
        self._editing = name
        raw = servers_of(self._editor_text()).get(name) if name else None
        self.set_fields(fields_of(name, raw) if raw is not None else ServerFields(""))
        self.message.setText("")

    # -- actions ----------------------------------------------------------------------
    def save(self) -> bool:
        try:
            text = with_server(self._editor_text(), self.fields(), self._editing)
        except McpConfigError as exc:
            self.message.setText(f"Not saved: {exc}")
            return False
        self._editing = self.fields().name
        self.message.setText("")
        self.saveRequested.emit(text)
        self.refresh_picker()
        return True

    def test_connection(self) -> None:
        try:
            fields = self.fields()
            config = parse_mcp_json(with_server("", fields))
        except McpConfigError as exc:
            self.message.setText(f"Cannot test: {exc}")
            return
        self.test_button.setEnabled(False)
        self.message.setText(f"Starting {fields.name}…")
        self.probe.start(config.servers[0])

    def hideEvent(self, event: QHideEvent) -> None:  # noqa: N802 - Qt override
        # The dialog closed or another tab opened: no server under test is left running.
        if self.probe.running:
            self.probe.stop()
            self.test_button.setEnabled(True)
            self.message.setText("Test stopped.")
        super().hideEvent(event)

    def _on_probe_finished(self, result: ProbeResult) -> None:
        self.test_button.setEnabled(True)
        self.message.setText(result.summary())
