"""The models dialog's Discover tab: the curated catalog (desktop_app.data.model_catalog)
with sizes, the memory each model needs and whether that fits this machine
(services.machine_memory), a search field over it, and a search of the Hugging Face Hub by
name (services.hub_search, on a plain thread; its answer comes back by a queued signal).

The tab only chooses: Download and Load are the dialog's (its download box, its load
path), reached through ``downloadRequested`` and ``loadRequested``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop_app.data import model_catalog
from desktop_app.dialogs.model_rows import format_parameters
from desktop_app.services import hub_search, machine_memory
from desktop_app.services.downloads import DownloadError
from desktop_app.widgets import theme
from desktop_app.widgets.vram_panel import format_bytes

CATALOG_COLUMNS = ("Model", "Parameters", "Quantization", "Download", "Context",
                   "Memory needed", "This computer", "Status")
HUB_COLUMNS = ("Repo", "Format", "Family", "Downloads")


class CatalogPanel(QWidget):
    downloadRequested = Signal(str, object)  # repo id, the .gguf file or None
    loadRequested = Signal(str)  # a source for LLM(...)
    _hub_event = Signal(str, object)  # internal: "found" / "error", payload (queued)

    def __init__(self, engine_config: Callable, installed: Callable,
                 memory: machine_memory.MachineMemory | None = None, entries=None,
                 search_hub: Callable | None = None, parent: QWidget | None = None) -> None:
        """engine_config(): the config models would load with; installed(entry): the
        source of that catalog entry when it is already on this computer, else None."""
        super().__init__(parent)
        self._engine_config, self._installed = engine_config, installed
        self.memory = memory or machine_memory.read_machine_memory()
        self.entries = tuple(entries if entries is not None else model_catalog.load_catalog())
        self._search_hub = search_hub or hub_search.search_hub
        self.shown: list = []  # the catalog entries in the table, in its order
        self.hub_results: list = []
        self._hub_event.connect(self._on_hub_event, Qt.ConnectionType.QueuedConnection)

        self.search_edit = QLineEdit()
        self.search_edit.setObjectName("catalogSearch")
        self.search_edit.setPlaceholderText("Search by name, family or size: qwen, llama 3b, "
                                            "gemma…")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.textChanged.connect(self.refresh)
        self.search_edit.returnPressed.connect(self._search_if_nothing_shown)
        self.hub_button = QPushButton(theme.icon("search"), "Search the Hub")
        self.hub_button.setObjectName("hubSearchButton")
        self.hub_button.setToolTip("Search huggingface.co by name for models Folio can load")
        self.hub_button.clicked.connect(self.search_the_hub)
        self.machine_label = QLabel(self.memory.describe())
        self.machine_label.setObjectName("machineMemory")

        self.table = _table("catalogTable", CATALOG_COLUMNS)
        memory_col = CATALOG_COLUMNS.index("Memory needed")
        self.table.horizontalHeaderItem(memory_col).setToolTip(
            "The weights plus the memory for chats (the KV cache) for the model's context, "
            "under Settings ▸ Engine: what loading it takes on this computer")
        self.table.horizontalHeaderItem(memory_col + 1).setToolTip(
            "Fits: at most 80% of this computer's memory (its GPU's, when it has one) and no "
            "more than is free now. Tight: it fits with other programs closed.")
        self.table.itemSelectionChanged.connect(self._update_action)
        self.table.doubleClicked.connect(lambda _i: self.act_on_selected())
        self.action_button = QPushButton(theme.icon("download"), "Download")
        self.action_button.setObjectName("catalogAction")
        self.action_button.clicked.connect(self.act_on_selected)

        self.hub_status = QLabel("")
        self.hub_status.setObjectName("hubStatus")
        self.hub_status.setWordWrap(True)
        self.hub_table = _table("hubTable", HUB_COLUMNS)
        self.hub_table.setVisible(False)
        self.hub_table.doubleClicked.connect(lambda _i: self.download_hub_selected())
        self.hub_download = QPushButton(theme.icon("download"), "Download from the Hub…")
        self.hub_download.setObjectName("hubDownload")
        self.hub_download.setVisible(False)
        self.hub_download.clicked.connect(self.download_hub_selected)

        top = QHBoxLayout()
        top.addWidget(self.search_edit, 1)
        top.addWidget(self.hub_button)
        actions = QHBoxLayout()
        actions.addWidget(self.machine_label, 1)
        actions.addWidget(self.action_button)
        hub_row = QHBoxLayout()
        hub_row.addWidget(self.hub_status, 1)
        hub_row.addWidget(self.hub_download)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.table, 3)
        layout.addLayout(actions)
        layout.addLayout(hub_row)
        layout.addWidget(self.hub_table, 2)
        self.refresh()

    # -- the catalog -----------------------------------------------------------------------
    def refresh(self) -> None:
        self.shown = model_catalog.search(self.entries, self.search_edit.text())
        config = self._engine_config()
        self.table.setRowCount(len(self.shown))
        for row, entry in enumerate(self.shown):
            needed = model_catalog.memory_needed(entry, config)
            verdict = machine_memory.fit(needed, self.memory)
            cells = (entry.name, format_parameters(entry.parameters, entry.active_parameters),
                     entry.quantization, format_bytes(entry.file_bytes),
                     f"{entry.context:,}", format_bytes(needed), verdict.label,
                     "downloaded" if self._installed(entry) else "")
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(f"{entry.repo}" + (f" · {entry.file}" if entry.file else ""))
                self.table.setItem(row, col, item)
        self.table.resizeColumnsToContents()
        if not self.shown and self.search_edit.text().strip():
            self.hub_status.setText("Nothing in the catalog matches: press Enter or "
                                    "Search the Hub to look on huggingface.co.")
        self._update_action()

    def selected(self) -> model_catalog.CatalogEntry | None:
        row = self.table.currentRow()
        return self.shown[row] if 0 <= row < len(self.shown) else None

    def select(self, name: str) -> None:
        for row, entry in enumerate(self.shown):
            if entry.name == name:
                self.table.selectRow(row)
                return

    def act_on_selected(self) -> None:
        """Load the selected entry when it is on this computer, else download it."""
        entry = self.selected()
        if entry is None:
            return
        source = self._installed(entry)
        if source is not None:
            self.loadRequested.emit(source)
        else:
            self.downloadRequested.emit(entry.repo, entry.file)

    def _update_action(self) -> None:
        entry = self.selected()
        installed = entry is not None and self._installed(entry) is not None
        self.action_button.setText("Load" if installed else "Download")
        self.action_button.setEnabled(entry is not None)

    # -- the Hub ---------------------------------------------------------------------------
    def search_the_hub(self) -> None:
        query = self.search_edit.text().strip()
        if not query:
            self.hub_status.setText("Type part of a model's name first, e.g. “qwen3” or "
                                    "“llama 3.2”.")
            return
        self.hub_button.setEnabled(False)
        self.hub_status.setText(f"Searching the Hub for “{query}”…")

        def run() -> None:
            try:
                answer = ("found", (query, self._search_hub(query)))
            except DownloadError as err:
                answer = ("error", err.message)
            except Exception as err:  # noqa: BLE001 - any failure is the user's to read
                answer = ("error", f"the Hub search failed: {err}")
            try:
                self._hub_event.emit(*answer)
            except RuntimeError:
                pass  # the dialog was closed while the Hub answered: no one to tell

        threading.Thread(target=run, name="folio-hub-search", daemon=True).start()

    def _search_if_nothing_shown(self) -> None:
        if not self.shown:
            self.search_the_hub()

    @Slot(str, object)
    def _on_hub_event(self, kind: str, payload) -> None:
        self.hub_button.setEnabled(True)
        if kind == "error":
            self.hub_status.setText(f"{payload[:1].upper()}{payload[1:]}. The catalog above "
                                    f"works without a connection.")
            return
        query, results = payload
        self.hub_results = list(results)
        self.hub_table.setRowCount(len(self.hub_results))
        for row, hit in enumerate(self.hub_results):
            for col, text in enumerate((hit.repo_id, hit.format, hit.architecture,
                                        f"{hit.downloads:,}")):
                self.hub_table.setItem(row, col, QTableWidgetItem(text))
        self.hub_table.resizeColumnsToContents()
        found = len(self.hub_results)
        self.hub_table.setVisible(bool(found))
        self.hub_download.setVisible(bool(found))
        self.hub_status.setText(
            f"{found} model{'s' * (found != 1)} on the Hub match “{query}” and can load "
            "in Folio." if found else f"No model on the Hub matching “{query}” can load in "
            "Folio.")

    def download_hub_selected(self) -> None:
        row = self.hub_table.currentRow()
        if not 0 <= row < len(self.hub_results):
            return
        hit = self.hub_results[row]
        # A GGUF repo holds several files: the download box asks which (it lists them).
        self.downloadRequested.emit(hit.repo_id, None)


def _table(name: str, columns: tuple[str, ...]) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setObjectName(name)
    table.setHorizontalHeaderLabels(columns)
    table.verticalHeader().setVisible(False)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return table
