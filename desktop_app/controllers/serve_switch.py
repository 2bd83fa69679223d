"""The Settings switch "Serve the loaded model on localhost:PORT", between the settings,
the API server (services.api_server) and the window's status bar.

It keeps ``AppSettings.serve_enabled`` / ``serve_port`` and the server in step, turns the
switch off (and says why, through ``errorRaised``) when the port cannot be used, and
gives the status bar one line: the API's URL while serving.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from desktop_app.data.settings import AppSettings
from desktop_app.services.api_server import ApiServer


class ServeSwitch(QObject):
    errorRaised = Signal(str, str)  # title, text
    statusChanged = Signal(str)  # a line for the status bar ("" when the switch is off)

    def __init__(self, bridge, settings: AppSettings, persist: Callable[[AppSettings], object],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings, self._persist = settings, persist
        self.server = ApiServer(bridge, self)
        self.server.stateChanged.connect(self._on_state)
        self.server.failed.connect(self._on_failed)
        self.status = ""

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def enabled(self) -> bool:
        return self.server.enabled

    def start(self) -> None:
        """Follow the saved setting (at startup)."""
        self.server.configure(self.settings.serve_enabled, self.settings.serve_port)

    def apply(self, enabled: bool, port: int) -> None:
        """The user changed the switch or the port."""
        self.settings.serve_enabled, self.settings.serve_port = enabled, port
        self._persist(self.settings)
        self.server.configure(enabled, port)

    def shutdown(self) -> None:
        self.server.shutdown()

    def _on_state(self, url: str) -> None:
        note = self.server.note
        self.status = f"API: {url}" if url else (f"API: {note}" if note else "")
        self.statusChanged.emit(self.status)

    def _on_failed(self, port: int, message: str) -> None:
        self.settings.serve_enabled = False  # the switch turns itself off
        self._persist(self.settings)
        self.errorRaised.emit(
            "Could not serve the model",
            f"Folio could not serve the model on localhost:{port}:\n\n{message}\n\n"
            "Another program probably uses that port. Pick another port in Settings › "
            "Serving and turn serving on again.")
