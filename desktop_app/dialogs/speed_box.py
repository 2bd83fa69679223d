"""Settings ▸ Engine ▸ Speed: how replies are sped up by speculative decoding. Prompt
lookup (drafts copied from the chat), a draft model (a small model with the loaded
model's tokenizer: chosen as a GGUF file or a model folder), the loaded model's own MTP
head (offered only where the model ships one: greyed out with the reason otherwise), or
off. The value is EngineSettings.speculative: "ngram", "draft:PATH", "mtp" or "off"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QFileDialog, QWidget

from desktop_app.data.engine_settings import SPEED_LABELS, SPEED_MTP
from engine.sampling_params import DRAFT_PREFIX

_CHOOSE = "choose"  # the item that opens the file dialog
TIP = ("Prompt lookup: where a reply repeats the chat (code you asked to edit, quoted text), "
       "the words it is about to copy are checked in one step instead of one by one. A "
       "draft model (a small model of the same family, with the same tokenizer) guesses "
       "every next few words for the loaded model to check; so does an MTP head, a small "
       "part some models (Qwen3.5) ship to guess their own next words. The reply is the "
       "model's own either way; drafting stops by itself where the guesses keep failing.")


def choose_draft_file(parent: QWidget | None) -> str:
    """A GGUF file picked by the user ("" when cancelled)."""
    path, _ = QFileDialog.getOpenFileName(parent, "Choose a draft model", "",
                                          "GGUF (*.gguf);;Any file (*)")
    return path


class SpeedBox(QComboBox):
    def __init__(self, value: str, choose: Callable[[QWidget | None], str] = choose_draft_file,
                 parent: QWidget | None = None,
                 mtp_missing: str | None = "no model is loaded") -> None:
        """``mtp_missing``: why the loaded model cannot draft with an MTP head (the item
        is greyed out with it), None when it can."""
        super().__init__(parent)
        self.setObjectName("speedSetting")
        self.setAccessibleName("Speed")
        self.setToolTip(TIP)
        self._choose = choose
        for key, label in SPEED_LABELS.items():
            self.addItem(label, key)
        self.addItem("Draft model: choose a file…", _CHOOSE)
        if mtp_missing is not None:
            item = self.model().item(self.findData(SPEED_MTP))
            item.setEnabled(False)
            item.setToolTip(f"Not available: {mtp_missing}. A model without an MTP head "
                            "drafts with prompt lookup.")
        if value.startswith(DRAFT_PREFIX):
            self._add_draft(value)
        self.setCurrentIndex(max(0, self.findData(value)))
        self._last = self.currentIndex()
        self.activated.connect(self._picked)

    def value(self) -> str:
        return self.currentData()

    def _add_draft(self, value: str) -> None:
        name = Path(value[len(DRAFT_PREFIX):]).name or value
        self.insertItem(self.count() - 1, f"Draft model: {name}", value)
        self.setItemData(self.count() - 2, value[len(DRAFT_PREFIX):],
                         Qt.ItemDataRole.ToolTipRole)  # the whole path

    def _picked(self, index: int) -> None:
        if self.itemData(index) != _CHOOSE:
            self._last = index
            return
        path = self._choose(self)
        if not path:
            self.setCurrentIndex(self._last)  # cancelled: the earlier choice stays
            return
        value = DRAFT_PREFIX + path
        if self.findData(value) < 0:
            self._add_draft(value)
        self.setCurrentIndex(self.findData(value))
        self._last = self.currentIndex()
