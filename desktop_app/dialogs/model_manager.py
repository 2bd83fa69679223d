"""The model manager: local models with what they need, remote servers, load/unload, add;
the Discover tab's catalog and Hub search (dialogs.catalog_panel); and download
(dialogs.download_box).

Listing reads only model headers (engine.loaders.catalog), so it runs on the GUI thread.
Loading goes through the bridge (a background thread, progress in the dialog). Errors go
through dialogs.error_dialog, which the main window uses too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop_app.dialogs.catalog_panel import CatalogPanel
from desktop_app.dialogs.download_box import DownloadBox
from desktop_app.dialogs.model_rows import (  # noqa: F401 - tests import them from here
    COLUMNS,
    ServerRow,
    download_advice,
    format_parameters,
    installed_source,
    list_local_models,
    memory_needed,
    row_name,
    source_for,
    template_cell,
)
from desktop_app.dialogs.server_dialog import AddServerDialog
from desktop_app.dialogs.template_dialog import TemplateDialog
from desktop_app.widgets import theme
from desktop_app.widgets.vram_panel import format_bytes


class ModelManagerDialog(QDialog):
    loadRequested = Signal(str)  # a source for LLM(...)

    def __init__(self, bridge, settings, persist: Callable, parent: QWidget | None = None,
                 list_models: Callable | None = None, catalog: dict | None = None) -> None:
        """catalog: CatalogPanel's keyword arguments (memory, entries, search_hub), for
        tests to give it a machine and a Hub of their own."""
        super().__init__(parent)
        self.setObjectName("modelManager")
        self.setWindowTitle("Models")
        self.resize(1000, 620)
        self.bridge, self.settings, self._persist = bridge, settings, persist
        self._list_models = list_models or list_local_models
        self.infos: list = []

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

        self.download_box = DownloadBox(self)
        self.download_box.downloaded.connect(self._on_downloaded)
        box = self.download_box
        # The box's parts under the names the dialog has always had (tests, accessibility).
        self.repo_edit, self.gguf_edit = box.repo_edit, box.gguf_edit
        self.download_button, self.cancel_button = box.download_button, box.cancel_button
        self.download_progress, self.download_status = box.download_progress, \
            box.download_status

        local = QWidget()
        local_layout = QVBoxLayout(local)
        local_layout.addWidget(self.table, 1)
        local_layout.addLayout(actions)
        self.catalog = CatalogPanel(self._engine_config, self._installed, **(catalog or {}))
        self.catalog.downloadRequested.connect(self.download_box.download)
        self.catalog.loadRequested.connect(self.loadRequested)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("modelTabs")
        self.tabs.addTab(local, "On this computer")
        self.tabs.addTab(self.catalog, "Discover")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.close_button = buttons.button(QDialogButtonBox.StandardButton.Close)
        self.close_button.setObjectName("closeModelsButton")
        buttons.rejected.connect(self.reject)  # Close and Esc

        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(box)
        layout.addWidget(buttons)

        bridge.loadStarted.connect(self._on_load_started)
        bridge.loadProgress.connect(self._on_load_progress)
        bridge.modelLoaded.connect(self._on_load_done)
        bridge.modelLoadFailed.connect(self._on_load_done)
        bridge.modelUnloaded.connect(self.refresh)
        self.refresh()

    # -- the list --------------------------------------------------------------------------
    def _engine_config(self):
        # The bridge's config once Settings ▸ Engine applied one, else the stored settings'.
        return self.bridge.engine_config or self.settings.engine.to_engine_config()

    def _installed(self, entry) -> str | None:
        return installed_source(entry, self.infos)

    def refresh(self) -> None:
        self.infos = list(self._list_models(self.settings.model_paths))
        self.infos += [ServerRow(entry) for entry in self.settings.servers]
        loaded = self.bridge.source if self.bridge.is_loaded else None
        self.table.setRowCount(len(self.infos))
        config = self._engine_config()
        for row, info in enumerate(self.infos):
            if isinstance(info, ServerRow):
                cells = info.cells(loaded == info.source)
            elif info.error:
                cells = (row_name(info), info.format, "", "", "", "", "", info.error, "")
            else:
                status = "● loaded" if loaded and loaded == source_for(info) else ""
                kind = f" ({info.layer_summary})" if info.layer_summary else ""
                cells = (row_name(info), info.format, info.architecture + kind,
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
        self.catalog.refresh()  # its "downloaded" marks follow the list

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

    # -- downloads ------------------------------------------------------------------------
    @property
    def downloading(self) -> bool:
        return self.download_box.downloading

    def start_download(self) -> None:
        self.download_box.start_download()

    def cancel_download(self) -> None:
        self.download_box.cancel_download()

    def _on_downloaded(self, result) -> None:
        self.refresh()
        gguf = self.gguf_edit.text().strip()
        self.select_source(str(result.path / gguf if gguf else result.path))
