"""Settings ▸ Engine ▸ Embedding model for documents: none (a long document's passages
found by word search alone) or an embedding model's .gguf file or folder, which ranks
them by meaning too. A pick is checked at once (engine.embeddings.probe: headers and
config files, no weights); a bad one is said in the form's message and the earlier choice
stays. The value is EngineSettings.embedding_model: a path or None."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QFileDialog, QWidget

from engine.embeddings.probe import probe

_FILE = "choose-file"  # the items that open a file or folder dialog
_FOLDER = "choose-folder"
NONE_LABEL = "None (word search alone)"
TIP = ("When a document is too long to read whole, its passages that bear on the question "
       "are found by word search (BM25). An embedding model (bge, nomic-embed-text, "
       "Qwen3-Embedding: a .gguf file or a model folder) ranks them by meaning as well. "
       "Each document is embedded once and kept on disk.")


def choose_path(parent: QWidget | None, kind: str) -> str:
    """A .gguf file or a folder picked by the user ("" when cancelled)."""
    if kind == _FOLDER:
        return QFileDialog.getExistingDirectory(parent, "Choose an embedding model folder")
    path, _ = QFileDialog.getOpenFileName(parent, "Choose an embedding model", "",
                                          "GGUF (*.gguf);;Any file (*)")
    return path


class EmbeddingBox(QComboBox):
    """``report(message)``: where a refused pick is said ("" clears it)."""

    def __init__(self, value: str | None, report: Callable[[str], None],
                 choose: Callable[[QWidget | None, str], str] = choose_path,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("embeddingModelSetting")
        self.setAccessibleName("Embedding model for documents")
        self.setToolTip(TIP)
        self._choose, self._report = choose, report
        self.addItem(NONE_LABEL, None)
        self.addItem("Choose a .gguf file…", _FILE)
        self.addItem("Choose a folder…", _FOLDER)
        if value is not None:
            self._add(value)
        self.setCurrentIndex(max(0, self.findData(value)))
        self._last = self.currentIndex()
        self.activated.connect(self._picked)

    def value(self) -> str | None:
        return self.currentData()

    def _add(self, path: str) -> None:
        self.insertItem(1, Path(path).name or path, path)
        self.setItemData(1, path, Qt.ItemDataRole.ToolTipRole)  # the whole path

    def _picked(self, index: int) -> None:
        kind = self.itemData(index)
        if kind not in (_FILE, _FOLDER):
            self._last = index
            self._report("")
            return
        path = self._choose(self, kind)
        self.setCurrentIndex(self._last)  # cancelled or refused: the earlier choice stays
        if not path:
            return
        try:
            probe(path)
        except ValueError as exc:
            self._report(f"Embedding model not changed: {exc}")
            return
        if self.findData(path) < 0:
            self._add(path)
        self.setCurrentIndex(self.findData(path))
        self._last = self.currentIndex()
        self._report("")
