"""The one QObject between the GUI and the engine.

It owns the picker's model's worker (services.worker_protocol.ModelWorker: a LocalWorker,
the engine's worker whose step loop runs on its own thread, or for a ``remote:`` source, a
server the user added (desktop_app.data.servers), a RemoteWorker: same surface, same
events, the model on another machine; its facts: services.worker_facts), has models loaded
on a background thread (services.model_hosting), and turns worker callbacks into Qt
signals. Local models live on a ModelShelf (the engine's ModelHost): the picker's model is
held; one switched away from stays loaded while memory allows (going back is warm), and
compared models (``prepare``, ``submit`` with a source) are leased per request: their
replies go on when the picker's model changes. Worker callbacks run on the worker thread,
so they only post the event object to the GUI thread through a queued connection; every
public signal is therefore emitted on the GUI thread and views may connect to it directly.

``busyChanged`` follows this app's own requests; ``activityChanged`` whether the engine
runs anything, the API's requests (the serve switch) included, from the worker's
activity events where it has them: the memory panel reads new figures only then.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.servers import is_remote_source
from desktop_app.services.devices import engine_config_for
from desktop_app.services.model_hosting import (  # noqa: F401 - describe_error: its home
    LlmFactory,
    ModelHosting,
    WorkerFactory,
    describe_error,
)
from desktop_app.services.worker_facts import WorkerFacts
from desktop_app.services.worker_protocol import ModelWorker
from engine.outputs import ActivityEvent, ErrorEvent, FinishedEvent, PromptProgress, TokenEvent


class EngineBridge(QObject, WorkerFacts):
    # Request id, candidate index, the delta as the engine read it: a tuple of
    # engine.outputs' TextDelta / Thinking / CallStart / CallArguments.
    tokenArrived = Signal(str, int, object)
    # Request id, engine.outputs.PromptProgress: a chunk of its prompt was read (a local
    # model only; before its first token).
    promptProgress = Signal(str, object)
    requestFinished = Signal(str, object)  # request id, RequestOutput
    requestFailed = Signal(str, str)  # request id, message
    loadStarted = Signal(str)  # model name or path
    loadProgress = Signal(str, float)  # stage, fraction 0..1
    modelLoaded = Signal(str)  # model name
    modelLoadFailed = Signal(str, str)  # model name or path, message
    modelUnloaded = Signal()
    companionReady = Signal(str)  # a compared model (its source) is loaded: submit to it
    companionFailed = Signal(str, str)  # its source, why it could not load
    hostedChanged = Signal()  # the local models loaded changed (the Memory dock's list)
    workerRetired = Signal()  # the worker stops (unload, switch, exit): let go of it
    busyChanged = Signal(bool)  # whether any request is in flight
    activityChanged = Signal(bool)  # whether the engine runs any request (the API's too)

    # Internal: carries objects from other threads to the GUI thread (queued).
    _posted = Signal(int, object)

    def __init__(self, llm_factory: LlmFactory | None = None,
                 worker_factory: WorkerFactory | None = None, engine_config=None,
                 parent: QObject | None = None, remote_factory=None, *,
                 budget_bytes=None, estimate=None) -> None:
        super().__init__(parent)
        # API keys of remote sources, in memory only (settings keep the remembered ones).
        self._server_keys: dict[str, str] = {}
        self.engine_config = engine_config
        self._worker: ModelWorker | None = None
        # Bumped whenever the worker is replaced: events and loads from an older
        # generation are dropped instead of reaching views that moved on.
        self._generation = 0
        self._load_token = 0
        self._loading: str | None = None
        self._source: str | None = None
        self._handles: dict[str, Any] = {}
        self._engine_busy = False  # the worker's last ActivityEvent
        self._active = False  # what activityChanged last said
        # Where models come from: the local ones on a ModelShelf, the compared ones.
        self.hosting = ModelHosting(
            lambda: self.engine_config or engine_config_for(EngineSettings()), llm_factory,
            worker_factory, remote_factory, budget_bytes, estimate,
            post=lambda payload: self._posted.emit(0, payload))
        self._lease = None  # the picker's model's lease (a local model)
        self._posted.connect(self._on_posted, Qt.ConnectionType.QueuedConnection)

    # -- state -----------------------------------------------------------------------
    @property
    def is_loading(self) -> bool:
        return self._loading is not None

    @property
    def loading_source(self) -> str | None:
        return self._loading

    @property
    def source(self) -> str | None:
        """What the loaded model was loaded from ("starter", a folder, a .gguf path)."""
        return self._source

    def set_server_key(self, source: str, api_key: str) -> None:
        """The API key to send when ``source`` (a remote server) loads."""
        self._server_keys[source] = api_key

    @property
    def busy(self) -> bool:
        return bool(self._handles)

    @property
    def active(self) -> bool:
        """Whether the engine runs any request: this app's, or its API's."""
        return self._active

    def _update_active(self) -> None:
        active = self.busy or self._engine_busy
        if active != self._active:
            self._active = active
            self.activityChanged.emit(active)

    def in_flight(self) -> list[str]:
        return list(self._handles)

    def apply_engine_settings(self, settings) -> bool:
        """Settings ▸ Engine (a data.engine_settings.EngineSettings): the config later loads
        use; a local model already loaded is reloaded with it when it changed (the current
        one keeps serving until then). Returns whether a reload started."""
        config = engine_config_for(settings)
        # No config yet (a bridge built without settings, as tests do) counts as the
        # app's automatic settings.
        changed = config != (self.engine_config or engine_config_for(EngineSettings()))
        self.engine_config = config
        if changed:
            self.hosting.config_changed()
        if not changed or self._source is None or self.is_remote:
            return False
        self.load_model(self._source)
        return True

    # -- models ----------------------------------------------------------------------
    def load_model(self, name_or_path: str, config=None) -> None:
        """Start loading in the background; modelLoaded or modelLoadFailed follows.

        The current model keeps serving until the new one is ready, so a model that
        fails to load leaves the app working with the previous one.
        """
        self._load_token += 1
        token = self._load_token
        self._loading = name_or_path
        self.loadStarted.emit(name_or_path)
        self.hosting.start_load(name_or_path, config if config is not None else
                              self.engine_config, self._server_keys.get(name_or_path, ""),
                              lambda payload: self._posted.emit(token, payload))

    def unload_model(self) -> None:
        if self._worker is None:
            return
        source = self._source
        self._retire_worker(wait=False)
        if source is not None and not is_remote_source(source):
            self.hosting.unload_later(source)  # the user's Unload frees its memory
        self.modelUnloaded.emit()
        self.hostedChanged.emit()

    # -- the local models ----------------------------------------------------------------
    def hosted(self) -> list:
        """The local models loaded (engine.hosting's HostedModel), most recent first."""
        return self.hosting.hosted()

    def hosted_worker(self, source: str) -> ModelWorker | None:
        """A loaded local model's worker (its facts and figures), None when not loaded."""
        return self.hosting.worker(source)

    def prepare(self, source: str) -> None:
        """Load a compared model in the background; companionReady or companionFailed
        follows (at once when it is loaded)."""
        if is_remote_source(source):
            self.companionFailed.emit(source, "Only local models can be compared.")
        elif self.hosting.prepare(source):
            self.companionReady.emit(source)

    def shutdown(self) -> None:
        """Stop the worker and wait for it (app exit)."""
        self._load_token += 1  # a load still running is discarded when it lands
        self._loading = None
        if self._worker is not None:
            self._retire_worker(wait=True)
        self._handles.clear()  # compared models' replies: their models shut down now
        self.hosting.shutdown()

    def _retire_worker(self, wait: bool) -> None:
        old = self._worker
        # The picker's model's replies end here; a compared model's go on (its lease
        # keeps it loaded, its events are not the retired worker's).
        for rid in [rid for rid in self._handles if not self.hosting.holds(rid)]:
            del self._handles[rid]
            self.requestFailed.emit(rid, "The model was unloaded before the reply finished.")
        self._generation += 1
        self._worker = None
        self._source = None
        lease, self._lease = self._lease, None
        self._engine_busy = False
        if not self._handles:
            self.busyChanged.emit(False)
        self._update_active()
        self.workerRetired.emit()
        if lease is not None:
            old.set_activity_listener(None)
        self.hosting.let_go(old, lease, wait=wait)

    # -- requests --------------------------------------------------------------------
    def submit(self, prompt, params, source: str | None = None) -> str:
        """Queue a chat turn (a built ``ChatPrompt``, or the messages for a model without
        a prompt builder); returns the request id the signals will carry. ``source``: a
        compared local model, loaded (``prepare``), that answers instead of the picker's."""
        if self._worker is None:
            raise RuntimeError("No model is loaded. Load one from the model picker first.")
        # Each worker numbers its own requests: a compared model's ids are the bridge's
        # with its source before them, so two models' ids never meet.
        tag = "" if source is None or source == self._source else f"{source}#"
        # A compared model's events outlive a switch of the picker's model (None: any
        # generation); the picker's model's end with it.
        generation = None if tag else self._generation

        def on_event(event) -> None:
            self._posted.emit(-1, (generation, event, tag))

        was_busy = self.busy
        lease = None
        if tag:
            lease = self.hosting.lease_for(source)  # loaded: no wait on the GUI thread
        try:
            handle = (lease.worker if lease is not None else self._worker).submit(
                prompt, params, on_event)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        request_id = tag + handle.request_id
        if lease is not None:
            self.hosting.hold(request_id, lease)
        self._handles[request_id] = handle
        if not was_busy:
            self.busyChanged.emit(True)
        self._update_active()
        return request_id

    def cancel(self, request_id: str) -> None:
        """Abort a request; its KV blocks are freed at once and requestFinished follows."""
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.cancel()

    # -- GUI-thread side ---------------------------------------------------------------
    @Slot(int, object)
    def _on_posted(self, token: int, payload) -> None:
        if token == -1:
            generation, event, tag = payload
            if generation is None or generation == self._generation:
                self._dispatch(event, tag)
            return
        if token == 0:  # the shelf's news: a model (un)loaded, or a compared one's load
            self.hostedChanged.emit()
            if payload[0] == "hosted":
                return
            _, source, message = payload
            if message is None:
                self.companionReady.emit(source)
            else:
                self.companionFailed.emit(source, message)
            return
        if token != self._load_token:
            if payload[0] == "loaded":  # a superseded load: let go of it
                self.hosting.let_go(payload[1], payload[3])
            return
        kind = payload[0]
        if kind == "progress":
            self.loadProgress.emit(payload[1], payload[2])
        elif kind == "failed":
            self._loading = None
            self.modelLoadFailed.emit(payload[1], payload[2])
        elif kind == "loaded":
            self._loading = None
            worker, lease = payload[1], payload[3]
            if self._worker is not None:
                self._retire_worker(wait=False)
            self.hosting.drop_stale()  # a shelf of older engine settings goes
            generation = self._generation
            worker.set_activity_listener(lambda event: self._posted.emit(-1, (generation,
                                                                              event, "")))
            if lease is None:
                worker.start()  # a remote worker; the shelf starts the local ones
            self._worker, self._source, self._lease = worker, payload[2], lease
            self.modelLoaded.emit(worker.model_name)
            self.hostedChanged.emit()

    def _dispatch(self, event, tag: str) -> None:
        if isinstance(event, ActivityEvent):
            self._engine_busy = event.busy
            self._update_active()
            return
        rid = tag + event.request_id
        if isinstance(event, TokenEvent):
            if rid in self._handles:
                self.tokenArrived.emit(rid, event.index, event.parts)
        elif isinstance(event, PromptProgress):
            if rid in self._handles:
                self.promptProgress.emit(rid, event)
        elif isinstance(event, FinishedEvent | ErrorEvent):
            if self._handles.pop(rid, None) is None:
                return
            self.hosting.release(rid)
            if isinstance(event, FinishedEvent):
                self.requestFinished.emit(rid, event.output)
            else:
                self.requestFailed.emit(rid, event.message)
            if not self._handles:
                self.busyChanged.emit(False)
                self._update_active()
