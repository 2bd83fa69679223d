"""The model manager: local models with what they need, remote servers, load/unload, add,
and download.

Listing reads only model headers (engine.loaders.catalog), so it runs on the GUI thread.
Loading goes through the bridge (a background thread, progress in the dialog). A download
runs desktop_app.services.downloads.download_model on a plain thread; its progress
callback posts to the GUI thread through a queued signal, and Cancel sets the event it polls.
Errors go through dialogs.error_dialog, which the main window uses too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop_app.dialogs import error_dialog
from desktop_app.dialogs.model_rows import (  # noqa: F401 - tests import them from here
    COLUMNS,
    ServerRow,
    download_advice,
    format_parameters,
    list_local_models,
    memory_needed,
    source_for,
    template_cell,
)
from desktop_app.dialogs.server_dialog import AddServerDialog
from desktop_app.dialogs.template_dialog import TemplateDialog
from desktop_app.services import downloads
from desktop_app.widgets import theme
from desktop_app.widgets.vram_panel import format_bytes


class ModelManagerDialog(QDialog):
    loadRequested = Signal(str)  # a source for LLM(...)
    _download_event = Signal(str, object)  # internal: kind, payload (queued)

    def __init__(self, bridge, settings, persist: Callable, parent: QWidget | None = None,
                 list_models: Callable | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("modelManager")
        self.setWindowTitle("Models")
        self.resize(940, 520)
        self.bridge, self.settings, self._persist = bridge, settings, persist
        self._list_models = list_models or list_local_models
        self.infos: list = []
        self._cancel: threading.Event | None = None
        self._download_event.connect(self._on_download_event,
                                     Qt.ConnectionType.QueuedConnection)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("modelTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(
            0, QHeaderView.ResizeMode.Stretch)
        self.table.doubleClicked.connect(lambda _i: self.load_selected())

        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("loadModelButton")
        self.load_button.clicked.connect(self.load_selected)
        self.unload_button = QPushButton("Unload")
        self.unload_button.setObjectName("unloadModelButton")
        self.unload_button.clicked.connect(self.bridge.unload_model)
        add_folder = QPushButton(theme.icon("folder"), "Add folder…")
        add_folder.clicked.connect(self._pick_folder)
        add_file = QPushButton(theme.icon("file"), "Add .gguf file…")
        add_file.clicked.connect(self._pick_file)
        add_server = QPushButton(theme.icon("model"), "Add a server…")
        add_server.setObjectName("addServerButton")
        add_server.setAccessibleName("Add a remote server")
        add_server.setToolTip("An OpenAI-compatible server (vLLM, SGLang, folio serve) "
                              "as a model source")
        add_server.clicked.connect(self.open_add_server)
        self.template_button = QPushButton("Chat template…")
        self.template_button.setObjectName("templateButton")
        self.template_button.setToolTip("The selected model's chat template: the file's, "
                                        "its family's, ChatML or a pasted one")
        self.template_button.clicked.connect(self.open_template_settings)
        self.load_progress = QProgressBar()
        self.load_progress.setObjectName("managerLoadProgress")
        self.load_progress.setVisible(False)
        actions = QHBoxLayout()
        for w in (self.load_button, self.unload_button, add_folder, add_file, add_server,
                  self.template_button):
            actions.addWidget(w)
        actions.addWidget(self.load_progress, 1)

        self.repo_edit = QLineEdit()
        self.repo_edit.setObjectName("downloadRepo")
        self.repo_edit.setPlaceholderText("Hugging Face repo id, e.g. HuggingFaceTB/"
                                          "SmolLM2-360M-Instruct")
        self.gguf_edit = QLineEdit()
        self.gguf_edit.setObjectName("downloadGguf")
        self.gguf_edit.setPlaceholderText("optional: one .gguf file of the repo")
        self.download_button = QPushButton(theme.icon("download"), "Download")
        self.download_button.setObjectName("downloadButton")
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("downloadCancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel_download)
        self.download_progress = QProgressBar()
        self.download_progress.setObjectName("downloadProgress")
        self.download_progress.setRange(0, 1000)
        self.download_status = QLabel("")
        self.download_status.setObjectName("downloadStatus")
        box = QGroupBox("Download from Hugging Face")
        form = QVBoxLayout(box)
        row = QHBoxLayout()
        row.addWidget(self.repo_edit, 2)
        row.addWidget(self.gguf_edit, 1)
        row.addWidget(self.download_button)
        row.addWidget(self.cancel_button)
        form.addLayout(row)
        form.addWidget(self.download_progress)
        form.addWidget(self.download_status)

        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addLayout(actions)
        layout.addWidget(box)

        bridge.loadStarted.connect(self._on_load_started)
        bridge.loadProgress.connect(self._on_load_progress)
        bridge.modelLoaded.connect(self._on_load_done)
        bridge.modelLoadFailed.connect(self._on_load_done)
        bridge.modelUnloaded.connect(self.refresh)
        self.refresh()

    # -- the list --------------------------------------------------------------------------
    def refresh(self) -> None:
        self.infos = list(self._list_models(self.settings.model_paths))
        self.infos += [ServerRow(entry) for entry in self.settings.servers]
        loaded = self.bridge.source if self.bridge.is_loaded else None
        self.table.setRowCount(len(self.infos))
        # The bridge's config once Settings ▸ Engine applied one, else the stored settings'.
        config = self.bridge.engine_config or self.settings.engine.to_engine_config()
        for row, info in enumerate(self.infos):
            if isinstance(info, ServerRow):
                cells = info.cells(loaded == info.source)
            elif info.error:
                cells = (info.name, info.format, "", "", "", "", "", info.error, "")
            else:
                status = "● loaded" if loaded and loaded == source_for(info) else ""
                kind = f" ({info.layer_summary})" if info.layer_summary else ""
                cells = (info.name, info.format, info.architecture + kind,
                         format_parameters(info.num_parameters, info.active_parameters),
                         str(info.context_length),
                         format_bytes(info.size_bytes),
                         format_bytes(memory_needed(info, config)), status,
                         template_cell(info, self.settings.model_templates.get(
                             source_for(info))))
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(str(info.path))
                self.table.setItem(row, col, item)
        self.table.resizeColumnsToContents()
        self.unload_button.setEnabled(self.bridge.is_loaded)

    def select_source(self, source: str) -> None:
        for row, info in enumerate(self.infos):
            if source_for(info) == source:
                self.table.selectRow(row)
                return

    def load_selected(self) -> None:
        row = self.table.currentRow()
        if 0 <= row < len(self.infos):
            self.loadRequested.emit(source_for(self.infos[row]))

    def open_template_settings(self) -> TemplateDialog | None:
        """The selected local model's template choice; kept (and the model reloaded when
        it is the loaded one) once it renders."""
        row = self.table.currentRow()
        if not 0 <= row < len(self.infos):
            return None
        info = self.infos[row]
        if isinstance(info, ServerRow) or info.error:
            return None
        source = source_for(info)
        dialog = TemplateDialog(info, self.settings.model_templates.get(source), self)
        dialog.accepted.connect(lambda: self.set_template(source, dialog.choice))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        self.template_dialog = dialog
        return dialog

    def set_template(self, source: str, choice) -> None:
        if choice.kind == "file":
            self.settings.model_templates.pop(source, None)
        else:
            self.settings.model_templates[source] = choice
        self._persist(self.settings)
        self.refresh()
        self.select_source(source)
        if self.bridge.is_loaded and self.bridge.source == source:
            self.loadRequested.emit(source)  # the template is read when the model loads

    def add_path(self, path: str) -> None:
        self.settings.remember_model_path(str(Path(path).expanduser()))
        self._persist(self.settings)
        self.refresh()
        self.select_source(str(Path(path).expanduser()))

    def open_add_server(self) -> AddServerDialog:
        dialog = AddServerDialog(self)
        dialog.accepted.connect(lambda: self.add_server(dialog.entry, dialog.api_key))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        self.server_dialog = dialog
        return dialog

    def add_server(self, entry, api_key: str) -> None:
        """Keep the server as a model source; the key reaches the bridge, and the settings
        only when the entry carries it (the user ticked "Remember the key")."""
        self.settings.add_server(entry)
        self.bridge.set_server_key(entry.source, api_key)
        self._persist(self.settings)
        self.refresh()
        self.select_source(entry.source)

    def _pick_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Add a model folder")
        if path:
            self.add_path(path)

    def _pick_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Add a GGUF model", "", "GGUF (*.gguf)")
        if path:
            self.add_path(path)

    def _on_load_started(self, _source: str) -> None:
        self.load_progress.setValue(0)
        self.load_progress.setVisible(True)

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        self.load_progress.setValue(round(100 * fraction))
        self.load_progress.setFormat(f"{stage} %p%")

    def _on_load_done(self, *_args) -> None:
        self.load_progress.setVisible(False)
        self.refresh()

    # -- downloads -------------------------------------------------------------------------
    @property
    def downloading(self) -> bool:
        return self._cancel is not None

    def start_download(self) -> None:
        repo_id = self.repo_edit.text().strip()
        gguf = self.gguf_edit.text().strip() or None
        if not repo_id or self.downloading:
            return
        cancel = self._cancel = threading.Event()
        self.download_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.download_progress.setValue(0)
        self.download_status.setText(f"Asking the hub about {repo_id}…")

        def run() -> None:
            def on_progress(p) -> None:
                self._download_event.emit("progress", p)

            try:
                result = downloads.download_model(repo_id, gguf_file=gguf,
                                                  on_progress=on_progress, cancel=cancel)
            except downloads.DownloadError as err:
                self._download_event.emit("error", err)
            except ValueError as err:  # a malformed repo id or file name
                self._download_event.emit("error", downloads.DownloadError("failed", str(err)))
            else:
                self._download_event.emit("done", result)

        threading.Thread(target=run, name="folio-download", daemon=True).start()

    def cancel_download(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.download_status.setText("Cancelling…")

    @Slot(str, object)
    def _on_download_event(self, kind: str, payload) -> None:
        if kind == "progress":
            total = max(1, payload.total_bytes)
            self.download_progress.setValue(round(1000 * payload.done_bytes / total))
            self.download_status.setText(
                f"{payload.file_name}: {format_bytes(payload.done_bytes)} of "
                f"{format_bytes(payload.total_bytes)} (file {payload.files_done + 1} of "
                f"{payload.files_total})")
            return
        self._cancel = None
        self.download_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        if kind == "done":
            self.download_progress.setValue(1000)
            self.download_status.setText(f"Downloaded {payload.repo_id} to {payload.path}")
            self.refresh()
            target = payload.path / self.gguf_edit.text().strip() \
                if self.gguf_edit.text().strip() else payload.path
            self.select_source(str(target))
        elif payload.kind == "cancelled":
            self.download_progress.setValue(0)
            self.download_status.setText("Download cancelled; nothing was kept.")
        else:
            self.download_status.setText(payload.message)
            error_dialog.show_error(self, "Download failed", download_advice(payload))
