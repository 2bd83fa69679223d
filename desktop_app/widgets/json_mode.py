"""The composer's "Answer in JSON" button and the dialog behind it (a chat's JSON mode:
on or off, and an optional schema pasted or read from a file)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.data.json_mode import parse_schema
from desktop_app.widgets.dialog_parts import error_label, ok_cancel

MAX_SCHEMA_BYTES = 1 << 20  # a schema file larger than this is surely not one


class JsonModeButton(QPushButton):
    """Checked while the chat in view answers in JSON; a click opens its dialog."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("{ } JSON", parent)
        self.setObjectName("jsonModeButton")
        self.setAccessibleName("Answer in JSON")
        self.setCheckable(True)
        self.show_mode(False, "")

    def show_mode(self, on: bool, schema: str) -> None:
        # The click opens the dialog; the check mark only shows the chat's state.
        self.setChecked(on)
        self.setToolTip("Answer in JSON: off" if not on else
                        "Answer in JSON: on, " + ("with a schema" if schema.strip() else
                                                  "any JSON object"))


class JsonModeDialog(QDialog):
    """``values()``: (on, schema text) once accepted; OK stays refused, the error shown,
    while the schema is not one the engine can hold a reply to."""

    def __init__(self, on: bool, schema: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("jsonModeDialog")
        self.setWindowTitle("Answer in JSON")
        self.check = QCheckBox("Answer in JSON")
        self.check.setObjectName("jsonModeCheck")
        self.check.setChecked(on)
        self.schema_edit = QPlainTextEdit(schema)
        self.schema_edit.setObjectName("jsonSchemaEdit")
        self.schema_edit.setPlaceholderText("Optional JSON schema the reply must follow; "
                                            "empty: any JSON object")
        self.file_button = QPushButton("Load schema from file…")
        self.file_button.setObjectName("jsonSchemaFileButton")
        self.file_button.clicked.connect(self._choose_file)
        self.error_label = error_label("jsonModeError")
        buttons = ok_cancel(self)
        row = QHBoxLayout()
        row.addWidget(self.file_button)
        row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.check)
        layout.addWidget(self.schema_edit, 1)
        layout.addLayout(row)
        layout.addWidget(self.error_label)
        layout.addWidget(buttons)
        self.resize(520, 380)

    def values(self) -> tuple[bool, str]:
        return self.check.isChecked(), self.schema_edit.toPlainText()

    def load_file(self, path: str | Path) -> bool:
        """Put the file's text in the schema box; False (and the error shown) if it
        cannot be read."""
        try:
            data = Path(path).read_bytes()
            if len(data) > MAX_SCHEMA_BYTES:
                raise ValueError(f"{Path(path).name} is larger than a schema can be")
            self.schema_edit.setPlainText(data.decode("utf-8"))
        except (OSError, ValueError) as exc:
            self._show_error(f"Could not read the schema: {exc}")
            return False
        self.error_label.setVisible(False)
        return True

    def accept(self) -> None:
        on, schema = self.values()
        if on:
            try:
                parse_schema(schema)
            except ValueError as exc:
                self._show_error(str(exc).removeprefix("ChatSettings.json_schema: "))
                return
        super().accept()

    def _show_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(True)

    def _choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "JSON schema", "",
                                              "JSON schema (*.json);;All files (*)")
        if path:
            self.load_file(path)
