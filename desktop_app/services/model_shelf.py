"""The app's local models on the engine's ModelHost (engine.hosting): several loaded at once
in one memory budget, weights and KV pools counted together.

The model picker's model is leased for as long as it is the chats' model, so it is never
unloaded under the user. A compared model (controllers.compare_turns) is leased for each
request only: between turns it is idle, kept while memory allows, and the least recently
used idle model goes first when another needs the room. A model switched away from is
released, not shut down, so going back to it finds its prefix cache warm. Nothing is
unloaded for being idle (keep-alive forever): only the budget, or the user, unloads.

``lease`` blocks while a model loads: the bridge calls it on its load threads, and on the
GUI thread only for a model ``is_loaded`` says is there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from desktop_app.services.worker_protocol import ModelWorker

# (source, engine config, progress callback or None) -> the model's worker, not started.
WorkerFor = Callable[[str, Any, Callable[[str, float], None] | None], ModelWorker]


class ModelShelf:
    def __init__(self, config, worker_for: WorkerFor, budget_bytes: int | None = None, *,
                 estimate: Callable[[str], int] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[], None] | None = None) -> None:
        """``estimate(source)``: its bytes before it loads (the engine's estimate from the
        file by default); ``on_change()``: a model loaded or unloaded (on the thread that
        did it)."""
        from engine.hosting.events import ModelUnloaded
        from engine.hosting.host import ModelHost

        self.config = config
        self._worker_for = worker_for
        self._lock = threading.Lock()
        self._configs: dict[str, Any] = {}  # source -> the config it loads (or loaded) with
        self._progress: dict[str, Callable[[str, float], None]] = {}
        self._workers: dict[str, ModelWorker] = {}  # every worker the host has loaded
        extra = {} if estimate is None else {"estimate": estimate}
        self.host = ModelHost(config, budget_bytes, keep_alive_s=None, clock=clock,
                              load=self._load, **extra)

        def heard(event) -> None:
            if isinstance(event, ModelUnloaded):
                with self._lock:
                    self._workers.pop(event.name, None)
            if on_change is not None:
                on_change()

        self.host.set_listener(heard)

    def _load(self, source: str) -> ModelWorker:
        with self._lock:
            config = self._configs.get(source, self.config)
            progress = self._progress.get(source)
        worker = self._worker_for(source, config, progress).start()
        with self._lock:
            self._workers[source] = worker
        return worker

    def lease(self, source: str, config=None, progress=None):
        """The model's lease (engine.hosting's ModelLease: ``.worker``, ``release()``),
        loading it first when it is not loaded. ``config``: the one it must run with (a
        template chosen for it); a model loaded with another is unloaded first, when idle.
        Raises the host's ModelWontFit, or what loading raised."""
        with self._lock:
            changed = config is not None and self._configs.get(source, config) != config
            if config is not None:
                self._configs[source] = config
            if progress is not None:
                self._progress[source] = progress
        if changed:
            self.host.unload(source)
        try:
            return self.host.lease(source)
        finally:
            with self._lock:
                self._progress.pop(source, None)

    def loaded_names(self) -> list[str]:
        """The sources loaded now (not the ones loading), most recently used first."""
        models = sorted(self.host.models(), key=lambda m: -m.last_used)
        return [m.name for m in models if m.state == "loaded"]

    def is_loaded(self, source: str) -> bool:
        return source in self.loaded_names()

    def worker(self, source: str) -> ModelWorker | None:
        """The loaded model's worker, to read its figures (None when it is not loaded)."""
        if not self.is_loaded(source):
            return None
        with self._lock:
            return self._workers.get(source)

    def models(self) -> list:
        """engine.hosting's HostedModel snapshots: names, memory, running requests."""
        return self.host.models()

    def unload(self, source: str) -> bool:
        return self.host.unload(source)

    def shutdown(self) -> None:
        self.host.shutdown()
