"""The Settings switch "Serve the loaded model on localhost:PORT".

``ApiServer`` runs ``folio serve``'s OpenAI-compatible API (engine.serve) over the
bridge's own EngineWorker: one model in memory, and API requests (ids ``api-N``) join the
same continuous batch and prefix cache as the chats, so the memory panel shows their
blocks beside the chats'. The server follows the model: it stops when the worker is
retired (unload, switch, exit) and starts again over the next local model that loads.
Loopback only, with ``folio serve``'s Host and Origin checks (engine/serve/host_guard.py:
a web page that rebinds its name to 127.0.0.1 gets a 403). Starting and stopping run on
background threads; the outcome comes back to the GUI thread through a queued signal.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal, Slot

HOST = "127.0.0.1"


class ApiServer(QObject):
    stateChanged = Signal(str)  # the API's base URL while serving, "" otherwise
    failed = Signal(int, str)  # port, why it could not serve there (the switch is off now)
    _posted = Signal(int, object)  # internal: (token, (kind, value)) from the start thread

    def __init__(self, bridge, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.enabled = False
        self.port = 8000
        self._server = None
        self._token = 0  # bumped when a start in flight must be dropped when it lands
        self._starting = False
        self.note = ""  # why the switch is on but nothing serves (shown in the status bar)
        self._posted.connect(self._on_posted, Qt.ConnectionType.QueuedConnection)
        bridge.modelLoaded.connect(self._on_model_loaded)
        bridge.workerRetired.connect(self._stop)

    @property
    def url(self) -> str:
        """The base URL clients use (``http://127.0.0.1:8000/v1``), "" when not serving."""
        return f"{self._server.url}/v1" if self._server is not None else ""

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def starting(self) -> bool:
        return self._starting

    def configure(self, enabled: bool, port: int) -> None:
        """Apply the switch: start, stop, or move to another port."""
        if (enabled, port) == (self.enabled, self.port) and (
                self.serving or self._starting or not enabled):
            return
        self.enabled, self.port = enabled, port
        self._stop()
        if enabled:
            self._start()
        else:
            self.note = ""
            self.stateChanged.emit("")

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop and wait (app exit)."""
        self._token += 1
        server, self._server = self._server, None
        if server is not None:
            server.stop(timeout)

    # -- internals ---------------------------------------------------------------------------
    def _on_model_loaded(self, _name: str) -> None:
        if self.enabled and not self.serving and not self._starting:
            self._start()

    def _start(self) -> None:
        worker = self.bridge.worker
        if worker is None:
            self.note = "serving starts when a model is loaded"
        elif self.bridge.is_remote:
            self.note = "not serving: the loaded model runs on a remote server"
        if worker is None or self.bridge.is_remote:
            self.stateChanged.emit("")
            return
        self._token += 1
        token, port = self._token, self.port
        self._starting = True
        self.note = f"starting the API on localhost:{port}…"
        self.stateChanged.emit("")

        def run() -> None:
            try:
                from engine.serve.app import ServeSettings
                from engine.serve.server import start_in_background

                # The engine's embedding model (Settings ▸ Engine) answers /v1/embeddings.
                settings = ServeSettings(
                    embedding_model=worker.llm.engine.config.embedding_model)
                server = start_in_background(worker, host=HOST, port=port,
                                             settings=settings)
            except Exception as exc:  # noqa: BLE001 - OSError mostly; any failure is shown
                self._posted.emit(token, ("failed", str(exc) or type(exc).__name__))
            else:
                self._posted.emit(token, ("started", server))

        threading.Thread(target=run, name="folio-serve-start", daemon=True).start()

    @Slot(int, object)
    def _on_posted(self, token: int, payload) -> None:
        kind, value = payload
        if token != self._token:  # switched off, moved or model changed meanwhile
            if kind == "started":
                threading.Thread(target=value.stop, name="folio-serve-stop",
                                 daemon=True).start()
            return
        self._starting = False
        if kind == "started":
            self._server = value
            self.note = ""
            self.stateChanged.emit(self.url)
        else:
            self.enabled = False
            self.note = ""
            self.stateChanged.emit("")
            self.failed.emit(self.port, value)

    def _stop(self) -> None:
        self._token += 1
        self._starting = False
        server, self._server = self._server, None
        if server is not None:
            # uvicorn closes its socket at once, then waits for open streams: off thread.
            threading.Thread(target=server.stop, name="folio-serve-stop", daemon=True).start()
            self.note = "serving stopped with the model" if self.enabled else ""
            self.stateChanged.emit("")
