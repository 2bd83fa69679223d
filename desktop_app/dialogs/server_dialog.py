""""Add a server…": a remote OpenAI-compatible server (vLLM, SGLang, folio serve) as a
model source.

The user types the base URL and, if the server wants one, an API key, clicks Connect
(``GET /v1/models`` runs on a background thread; the answer comes back through a queued
signal) and picks one of the models it serves. Nothing is saved until Add; the key is
kept in the settings only when "Remember the key" is ticked, otherwise in memory until
Folio closes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.data.servers import ServerEntry, normalize_base_url
from desktop_app.services import remote


class AddServerDialog(QDialog):
    _answer = Signal(int, object)  # internal: (attempt, ("ok", cards) | ("error", text))

    def __init__(self, parent: QWidget | None = None,
                 list_models: Callable | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("addServerDialog")
        self.setWindowTitle("Add a server")
        self.setMinimumWidth(520)
        self._list_models = list_models or remote.list_models
        self._attempt = 0
        self._connected_url = ""
        self.cards: list = []
        self.entry: ServerEntry | None = None
        self.api_key = ""
        self._answer.connect(self._on_answer, Qt.ConnectionType.QueuedConnection)

        self.url_edit = QLineEdit()
        self.url_edit.setObjectName("serverUrl")
        self.url_edit.setAccessibleName("Server base URL")
        self.url_edit.setPlaceholderText("http://gpu-box:8000/v1")
        self.key_edit = QLineEdit()
        self.key_edit.setObjectName("serverKey")
        self.key_edit.setAccessibleName("API key")
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("optional: the server's --api-key")
        self.remember = QCheckBox("Remember the key")
        self.remember.setObjectName("rememberKey")
        self.remember.setAccessibleName("Remember the API key")
        self.remember.setToolTip("Keep the key in Folio's settings file on this computer; "
                                 "otherwise it is forgotten when Folio closes")
        self.connect_button = QPushButton("Connect")
        self.connect_button.setObjectName("connectServer")
        self.connect_button.setAccessibleName("Connect to the server")
        self.connect_button.clicked.connect(self.connect_to_server)
        self.model_box = QComboBox()
        self.model_box.setObjectName("serverModel")
        self.model_box.setAccessibleName("Model on the server")
        self.model_box.setEnabled(False)
        self.status = QLabel("Enter the server's URL, then click Connect to list its models.")
        self.status.setObjectName("serverStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        url_row = QHBoxLayout()
        url_row.addWidget(self.url_edit, 1)
        url_row.addWidget(self.connect_button)
        form = QFormLayout()
        form.addRow("Base URL", url_row)
        form.addRow("API key", self.key_edit)
        form.addRow("", self.remember)
        form.addRow("Model", self.model_box)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.add_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.add_button.setText("Add")
        self.add_button.setObjectName("addServerOk")
        self.add_button.setEnabled(False)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self.url_edit.textEdited.connect(self._forget_models)
        self.key_edit.textEdited.connect(self._forget_models)
        self.url_edit.returnPressed.connect(self.connect_to_server)

    @property
    def connecting(self) -> bool:
        return not self.connect_button.isEnabled()

    def connect_to_server(self) -> None:
        try:
            base_url = normalize_base_url(self.url_edit.text())
        except ValueError as exc:
            self._show_error(str(exc))
            return
        self._attempt += 1
        attempt, key = self._attempt, self.key_edit.text().strip()
        self._forget_models()
        self.connect_button.setEnabled(False)
        self.status.setText(f"Connecting to {base_url}…")

        def run() -> None:
            try:
                cards = self._list_models(base_url, key)
            except Exception as exc:  # noqa: BLE001 - RemoteError mostly; shown, not raised
                text = str(exc) if isinstance(exc, remote.RemoteError) else (
                    f"Could not list the models of {base_url}: {type(exc).__name__}: {exc}")
                self._answer.emit(attempt, ("error", text))
            else:
                self._answer.emit(attempt, ("ok", (base_url, cards)))

        threading.Thread(target=run, name="folio-server-connect", daemon=True).start()

    @Slot(int, object)
    def _on_answer(self, attempt: int, payload) -> None:
        if attempt != self._attempt:
            return
        self.connect_button.setEnabled(True)
        kind, value = payload
        if kind == "error":
            self._show_error(value)
            return
        base_url, self.cards = value
        self._connected_url = base_url
        self.model_box.clear()
        for card in self.cards:
            label = f"{card.id} ({card.max_model_len} tokens)" if card.max_model_len \
                else card.id
            self.model_box.addItem(label, card.id)
        self.model_box.setEnabled(True)
        self.add_button.setEnabled(True)
        count = len(self.cards)
        self.status.setText(f"Connected: {base_url} serves {count} model"
                            f"{'s' if count != 1 else ''}. Pick one, then Add.")

    def _show_error(self, text: str) -> None:
        self.status.setText(f"⚠ {text}\n\nNothing was saved.")

    def _forget_models(self, *_args) -> None:
        self.cards, self._connected_url = [], ""
        self.model_box.clear()
        self.model_box.setEnabled(False)
        self.add_button.setEnabled(False)

    def accept(self) -> None:
        index = self.model_box.currentIndex()
        if not self._connected_url or index < 0:
            return
        card = self.cards[index]
        self.api_key = self.key_edit.text().strip()
        self.entry = ServerEntry(self._connected_url, card.id,
                                 self.api_key if self.remember.isChecked() else "",
                                 card.max_model_len)
        super().accept()
