"""The Memory dock's "Models loaded": each local model the app holds (services.model_shelf),
its weights and KV pool, whether it runs or how long it has been idle, and which one the
dock's figures and block map show (the picker's model unless another is chosen)."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QVBoxLayout, QWidget

from desktop_app.services.sources import display_name
from desktop_app.widgets.memory_rows import format_bytes


def model_line(model, main: bool = False) -> str:
    """One model's line (an engine.hosting HostedModel); ``main``: the picker's model,
    which the app holds (one lease more than its requests)."""
    if model.state != "loaded":
        return f"loading ({format_bytes(model.total_bytes)} expected)"
    running = model.running - (1 if main else 0)
    if running > 0:
        use = f"{running} request{'s' if running != 1 else ''} running"
    elif main:
        use = "the chats' model"
    else:
        use = "idle" if model.idle_s is None else f"idle {model.idle_s:.0f} s"
    return (f"weights {format_bytes(model.weights_bytes)} · KV pool "
            f"{format_bytes(model.kv_bytes)} · {use}")


class HostedModels(QWidget):
    chosen = Signal(str)  # the source whose figures the dock shows now

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("hostedModels")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        heading = QLabel("Models loaded")
        heading.setObjectName("sectionHeading")
        layout.addWidget(heading)
        self.form = QFormLayout()
        layout.addLayout(self.form)
        self.picker = QComboBox()
        self.picker.setObjectName("blockMapModel")
        self.picker.setAccessibleName("The model the memory figures show")
        self.picker.setToolTip("Show this model's KV pool and block map")
        self.picker.activated.connect(self._on_activated)
        # The model the user chose to see; None follows the picker's model (a new one
        # loaded there is shown).
        self._choice: str | None = None
        self._main: str | None = None
        layout.addWidget(self.picker)
        self.lines: dict[str, str] = {}
        self._texts: dict[str, QLabel] = {}
        self.setVisible(False)

    def _on_activated(self, _index: int) -> None:
        self._choice = self.picker.currentData()
        self.chosen.emit(self._choice)

    def show_models(self, source):
        """Lists ``source``'s hosted models (the bridge's ``hosted()``); returns what the
        dock reads its figures from: the chosen model's worker, else ``source`` itself."""
        hosted = getattr(source, "hosted", None)
        models = list(hosted()) if hosted is not None else []
        main = getattr(source, "source", None)
        self.setVisible(len(models) > 1)
        # One model: nothing to list or choose (no widgets made: the dock's layout stays).
        lines = {m.name: model_line(m, m.name == main) for m in models} \
            if len(models) > 1 else {}
        if list(lines) != list(self.lines):
            # Rebuilt only when the models change: a refresh while the engine runs only
            # sets texts (the panel makes no timers or widgets while idle).
            while self.form.rowCount():
                self.form.removeRow(0)
            self._texts = {}
            for name in lines:
                self._texts[name] = QLabel()
                self._texts[name].setWordWrap(True)
                self.form.addRow(display_name(name), self._texts[name])
            self.picker.clear()
            for name in lines:
                self.picker.addItem(display_name(name), name)
        self.lines = lines
        for name, line in lines.items():
            if self._texts[name].text() != line:
                self._texts[name].setText(line)
        if main != self._main or self._choice not in lines:
            self._choice, self._main = None, main
        index = self.picker.findData(self._choice or main)
        if index >= 0 and index != self.picker.currentIndex():
            self.picker.setCurrentIndex(index)
        chosen = self.picker.currentData()
        if chosen is None or chosen == main:
            return source
        return source.hosted_worker(chosen) or source

    def owner_tag(self, source) -> str:
        """What the bridge puts before a compared model's request ids ("" for the picker's
        model): the dock names a block's chat through it."""
        chosen = self.picker.currentData()
        main = getattr(source, "source", None)
        return "" if chosen is None or chosen == main else f"{chosen}#"
