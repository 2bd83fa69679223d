"""The models dialog's "Download from Hugging Face" box: a repo id (and one of its .gguf
files), the download's progress in bytes and percent, Cancel.

The download runs desktop_app.services.downloads.download_model on a plain thread; its
progress callback posts to the GUI thread through a queued signal, and Cancel sets the
event it polls. A cancelled or failed download keeps its bytes (the services' partial
folder), so Download again resumes it.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.dialogs import error_dialog
from desktop_app.dialogs.model_rows import download_advice
from desktop_app.services import downloads
from desktop_app.widgets import theme
from desktop_app.widgets.vram_panel import format_bytes


class DownloadBox(QGroupBox):
    downloaded = Signal(object)  # the DownloadResult, once every file is in the cache
    _download_event = Signal(str, object)  # internal: kind, payload (queued)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Download from Hugging Face", parent)
        self._cancel: threading.Event | None = None
        self._last = None  # the last DownloadProgress, for what a cancel kept
        self._download_event.connect(self._on_download_event,
                                     Qt.ConnectionType.QueuedConnection)
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
        self.download_status.setWordWrap(True)
        form = QVBoxLayout(self)
        row = QHBoxLayout()
        row.addWidget(self.repo_edit, 2)
        row.addWidget(self.gguf_edit, 1)
        row.addWidget(self.download_button)
        row.addWidget(self.cancel_button)
        form.addLayout(row)
        form.addWidget(self.download_progress)
        form.addWidget(self.download_status)

    @property
    def downloading(self) -> bool:
        return self._cancel is not None

    def download(self, repo_id: str, gguf_file: str | None) -> None:
        """Fill the fields with a model chosen elsewhere (the catalog) and download it."""
        if self.downloading:
            return
        self.repo_edit.setText(repo_id)
        self.gguf_edit.setText(gguf_file or "")
        self.start_download()

    def start_download(self) -> None:
        repo_id = self.repo_edit.text().strip()
        gguf = self.gguf_edit.text().strip() or None
        if not repo_id or self.downloading:
            return
        cancel = self._cancel = threading.Event()
        self._last = None
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
            self._last = payload
            total = max(1, payload.total_bytes)
            self.download_progress.setValue(round(1000 * payload.done_bytes / total))
            self.download_status.setText(
                f"{payload.file_name}: {format_bytes(payload.done_bytes)} of "
                f"{format_bytes(payload.total_bytes)}, "
                f"{100 * payload.done_bytes / total:.0f}% (file {payload.files_done + 1} "
                f"of {payload.files_total})")
            return
        self._cancel = None
        self.download_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        if kind == "done":
            self.download_progress.setValue(1000)
            self.download_status.setText(f"Downloaded {payload.repo_id} to {payload.path}")
            self.downloaded.emit(payload)
        elif payload.kind == "cancelled":
            self.download_status.setText(self._kept_text("Download paused"))
        elif payload.kind == "no_weights":  # a GGUF repo: its files are named, pick one
            # The message starts with the repo id, whose case is its own.
            self.download_status.setText(f"{payload.message}: type it in the second field.")
            self.gguf_edit.setFocus()
        else:
            self.download_status.setText(payload.message)
            error_dialog.show_error(self, "Download failed", download_advice(payload))

    def _kept_text(self, what: str) -> str:
        if self._last is None or not self._last.done_bytes:
            return f"{what}; nothing had arrived yet."
        return (f"{what}: {format_bytes(self._last.done_bytes)} of "
                f"{format_bytes(self._last.total_bytes)} kept. Download again to resume.")
