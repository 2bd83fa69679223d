"""What the window shows of the model and its loading: the toolbar's progress bar, the
status bar and the empty chat's welcome, in plain steps (widgets.load_steps) rather than
the engine's stage names.

Runs on the GUI thread, on the bridge's signals; it only displays (the window keeps the
settings and the model picker up to date on the same signals).
"""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QProgressBar, QStatusBar

from desktop_app.data.servers import host_of, parse_server_source
from desktop_app.services import sources
from desktop_app.widgets.load_steps import LoadSteps
from desktop_app.widgets.welcome import ModelSummary, WelcomePanel


def model_summary(bridge) -> ModelSummary | None:
    """The loaded model as the welcome describes it; None without one."""
    if not bridge.is_loaded:
        return None
    if bridge.is_remote:
        base_url, model = parse_server_source(bridge.source)
        return ModelSummary(model, bridge.max_model_len, None, host_of(base_url))
    mem = bridge.memory_stats()
    return ModelSummary(sources.display_name(bridge.source or bridge.model_name),
                        bridge.max_model_len, mem.weights_bytes if mem is not None else None)


class LoadDisplay(QObject):
    def __init__(self, bridge, bar: QProgressBar, bar_action: QAction,
                 status_bar: QStatusBar, welcome: WelcomePanel,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge, self.bar, self.bar_action = bridge, bar, bar_action
        self.status_bar, self.welcome = status_bar, welcome
        self.steps = LoadSteps()
        self._loading = ""  # the display name of the model being loaded
        bridge.loadStarted.connect(self._on_started)
        bridge.loadProgress.connect(self._on_progress)
        bridge.modelLoaded.connect(self._on_loaded)
        bridge.modelLoadFailed.connect(self._on_failed)
        bridge.modelUnloaded.connect(self._on_unloaded)
        self.show_model()
        status_bar.showMessage(f"{bridge.model_name} ready" if bridge.is_loaded
                               else "No model loaded")

    def show_model(self) -> None:
        self.welcome.show_model(model_summary(self.bridge))

    def _show_step(self) -> None:
        self.bar.setValue(self.steps.percent)
        self.bar.setFormat(f"{self.steps.words} %p%")
        self.bar.setToolTip(f"Loading {self._loading}: {self.steps.text()}")
        self.status_bar.showMessage(f"Loading {self._loading}: {self.steps.text()}")
        self.welcome.show_loading(self._loading, self.steps.text())

    def _on_started(self, source: str) -> None:
        self._loading = sources.display_name(source)
        self.steps.reset()
        self.bar_action.setVisible(True)
        self.bar.setVisible(True)
        self._show_step()

    def _on_progress(self, stage: str, fraction: float) -> None:
        self.steps.update(stage, fraction)
        self._show_step()

    def _on_loaded(self, name: str) -> None:
        self.bar_action.setVisible(False)
        self.show_model()
        self.status_bar.showMessage(f"{name} ready · keeps {self.bridge.max_model_len:,} "
                                    "tokens of a chat in mind")

    def _on_failed(self, source: str, _message: str) -> None:
        self.bar_action.setVisible(False)
        self.show_model()  # the model still loaded, if any
        self.status_bar.showMessage(f"Could not load {sources.display_name(source)}")

    def _on_unloaded(self) -> None:
        self.show_model()
        self.status_bar.showMessage("No model loaded")
