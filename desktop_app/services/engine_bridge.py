"""The one QObject between the GUI and the engine.

It owns the loaded model's worker (services.worker_protocol.ModelWorker: a LocalWorker,
the engine's worker whose step loop runs on its own thread, or for a ``remote:`` source, a
server the user added (desktop_app.data.servers), a RemoteWorker: same surface, same
events, the model on another machine), loads models on a background thread, and turns
worker callbacks into Qt signals. Local models live on a ModelShelf (services.model_shelf,
the engine's ModelHost): the picker's model is held; one switched away from stays loaded
while memory allows (going back is warm), and compared models (``prepare``, ``submit``
with a source) are leased per request. Worker callbacks run on the worker thread, so they only
post the event object to the GUI thread through a queued connection; every public signal
is therefore emitted on the GUI thread and views may connect to it directly.

``busyChanged`` follows this app's own requests; ``activityChanged`` whether the engine
runs anything, the API's requests (the serve switch) included, from the worker's
activity events where it has them: the memory panel reads new figures only then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, Signal, Slot

from desktop_app.data.engine_settings import EngineSettings
from desktop_app.data.servers import is_remote_source, parse_server_source
from desktop_app.services.devices import describe_memory_error, engine_config_for
from desktop_app.services.worker_protocol import ModelWorker

if TYPE_CHECKING:
    from desktop_app.services.model_shelf import ModelShelf
from engine.outputs import ActivityEvent, ErrorEvent, FinishedEvent, PromptProgress, TokenEvent

LlmFactory = Callable[..., Any]  # (name_or_path, config=..., progress=...) -> LLM
WorkerFactory = Callable[[Any], ModelWorker]  # (llm) -> its worker, not started


def _default_llm_factory(name_or_path: str, config=None, progress=None):
    from engine import LLM

    return LLM(name_or_path, config=config, progress=progress)


def _default_worker_factory(llm) -> ModelWorker:
    from desktop_app.services.local_worker import LocalWorker  # imports torch: on first load

    return LocalWorker(llm)


def _remote_factory(source: str, api_key: str, progress=None) -> ModelWorker:
    """The RemoteWorker of a ``remote:`` source; raises RemoteError (an OSError)."""
    from desktop_app.services.remote import RemoteLLM, RemoteWorker

    base_url, model = parse_server_source(source)
    return RemoteWorker(RemoteLLM.connect(base_url, model, api_key, progress=progress))


def describe_error(exc: BaseException) -> str:
    """A one-paragraph message for a dialog: user errors say what to do already."""
    memory = describe_memory_error(exc)
    if memory is not None:
        return memory
    text = str(exc).strip()
    if isinstance(exc, (ValueError, FileNotFoundError, OSError)) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class EngineBridge(QObject):
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
        self._llm_factory = llm_factory or _default_llm_factory
        self._worker_factory = worker_factory or _default_worker_factory
        self._remote_factory = remote_factory or _remote_factory
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
        # The local models (built with the engine config of its first load; a config
        # change builds another, the old one shut down once its model is replaced).
        self._shelf: ModelShelf | None = None
        self._stale_shelf: ModelShelf | None = None
        # The one memory budget of the local models (weights and pools; None: no limit;
        # a function: read when the first local model loads),
        # and their estimate before loading: the engine's from the file, unless the
        # models come from a factory of the caller's (tests' fakes: no file to read,
        # measured once loaded).
        self._budget = budget_bytes
        self._estimate = estimate if estimate is not None or llm_factory is None else \
            (lambda _source: 0)
        self._lease = None  # the picker's model's lease (a local model)
        self._leases: dict[str, Any] = {}  # request id -> a compared model's lease
        self._posted.connect(self._on_posted, Qt.ConnectionType.QueuedConnection)

    # -- state -----------------------------------------------------------------------
    @property
    def is_loaded(self) -> bool:
        return self._worker is not None

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

    @property
    def model_name(self) -> str | None:
        return None if self._worker is None else self._worker.model_name

    @property
    def max_model_len(self) -> int | None:
        return None if self._worker is None else self._worker.max_model_len

    @property
    def tokenizer(self):
        return None if self._worker is None else self._worker.tokenizer

    @property
    def prompts(self):
        """The loaded model's prompt builder (engine.chat.PromptBuilder): what the context
        planner measures with and the prompts it submits come from; None for a remote
        model or none loaded (the planner estimates, the messages are sent)."""
        return None if self._worker is None else self._worker.prompts

    @property
    def worker(self) -> ModelWorker | None:
        """The running worker (a LocalWorker, or a RemoteWorker), None when unloaded."""
        return self._worker

    @property
    def is_remote(self) -> bool:
        return self._worker is not None and self._worker.is_remote

    def set_server_key(self, source: str, api_key: str) -> None:
        """The API key to send when ``source`` (a remote server) loads."""
        self._server_keys[source] = api_key

    def remote_status(self):
        """The server's figures (services.remote_metrics.RemoteStatus) for a remote model,
        None for a local one."""
        return None if self._worker is None else self._worker.remote_status()

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
        if changed and self._shelf is not None:
            self._stale_shelf, self._shelf = self._shelf, None
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
        cfg = config if config is not None else self.engine_config

        def run() -> None:
            def progress(stage: str, frac: float) -> None:
                self._posted.emit(token, ("progress", stage, float(frac)))

            try:
                if is_remote_source(name_or_path):
                    worker = self._remote_factory(
                        name_or_path, self._server_keys.get(name_or_path, ""), progress)
                    lease = None
                else:
                    lease = shelf.lease(name_or_path, cfg, progress)
                    worker = lease.worker
            except BaseException as exc:  # noqa: BLE001 - any failure goes to the dialog
                self._posted.emit(token, ("failed", name_or_path, describe_error(exc)))
                return
            self._posted.emit(token, ("loaded", worker, name_or_path, lease))

        shelf = None if is_remote_source(name_or_path) else self.shelf()

        threading.Thread(target=run, name="folio-model-load", daemon=True).start()

    def unload_model(self) -> None:
        if self._worker is None:
            return
        source, shelf = self._source, self._shelf
        self._retire_worker(wait=False)
        if shelf is not None and source is not None:
            # The user's Unload frees its memory, not just its hold; joining the worker's
            # step loop can take a step's time, so not on the GUI thread.
            threading.Thread(target=shelf.unload, args=(source,), name="folio-worker-stop",
                             daemon=True).start()
        self.modelUnloaded.emit()
        self.hostedChanged.emit()

    # -- the local models ----------------------------------------------------------------
    def shelf(self) -> ModelShelf:
        """The local models (built on first use, with the engine config of the time)."""
        if self._shelf is None:
            from desktop_app.services.model_shelf import ModelShelf

            budget = self._budget

            def worker_for(source, config, progress):
                return self._worker_factory(self._llm_factory(source, config=config,
                                                              progress=progress))

            self._shelf = ModelShelf(self.engine_config or engine_config_for(EngineSettings()),
                                     worker_for, budget() if callable(budget) else budget,
                                     estimate=self._estimate,
                                     on_change=lambda: self._posted.emit(0, ("hosted",)))
        return self._shelf

    def hosted(self) -> list:
        """The local models loaded (engine.hosting's HostedModel), most recent first."""
        if self._shelf is None:
            return []
        return sorted(self._shelf.models(), key=lambda m: -m.last_used)

    def hosted_worker(self, source: str) -> ModelWorker | None:
        """A loaded local model's worker (its facts and figures), None when not loaded."""
        return None if self._shelf is None else self._shelf.worker(source)

    def prepare(self, source: str) -> None:
        """Load a compared model in the background; companionReady or companionFailed
        follows (at once when it is loaded)."""
        if is_remote_source(source):
            self.companionFailed.emit(source, "Only local models can be compared.")
            return
        shelf = self.shelf()
        if shelf.is_loaded(source):
            self.companionReady.emit(source)
            return

        def run() -> None:
            try:
                shelf.lease(source).release()
            except BaseException as exc:  # noqa: BLE001 - any failure goes to the chat
                self._posted.emit(0, ("companion", source, describe_error(exc)))
                return
            self._posted.emit(0, ("companion", source, None))

        threading.Thread(target=run, name="folio-compare-load", daemon=True).start()

    def shutdown(self) -> None:
        """Stop the worker and wait for it (app exit)."""
        self._load_token += 1  # a load still running is discarded when it lands
        self._loading = None
        if self._worker is not None:
            self._retire_worker(wait=True)
        for shelf in (self._shelf, self._stale_shelf):
            if shelf is not None:
                shelf.shutdown()
        self._shelf = self._stale_shelf = None

    def _retire_worker(self, wait: bool) -> None:
        old = self._worker
        for rid in list(self._handles):
            self.requestFailed.emit(rid, "The model was unloaded before the reply finished.")
        self._handles.clear()
        for lease in self._leases.values():
            lease.release()
        self._leases.clear()
        self._generation += 1
        self._worker = None
        self._source = None
        lease, self._lease = self._lease, None
        self._engine_busy = False
        self.busyChanged.emit(False)
        self._update_active()
        self.workerRetired.emit()
        if lease is not None:
            # Released, not shut down: it stays loaded while memory allows (going back to
            # it is warm); the shelf unloads it when the room is needed.
            old.set_activity_listener(None)
            lease.release()
        elif wait:
            old.shutdown()
        else:
            # Joining the step loop can take a step's time; keep the GUI thread free.
            threading.Thread(target=old.shutdown, name="folio-worker-stop", daemon=True).start()

    # -- requests --------------------------------------------------------------------
    def submit(self, prompt, params, source: str | None = None) -> str:
        """Queue a chat turn (a built ``ChatPrompt``, or the messages for a model without
        a prompt builder); returns the request id the signals will carry. ``source``: a
        compared local model, loaded (``prepare``), that answers instead of the picker's."""
        if self._worker is None:
            raise RuntimeError("No model is loaded. Load one from the model picker first.")
        generation = self._generation

        # Each worker numbers its own requests: a compared model's ids are the bridge's
        # with its source before them, so two models' ids never meet.
        tag = "" if source is None or source == self._source else f"{source}#"

        def on_event(event) -> None:
            self._posted.emit(-1, (generation, event, tag))

        was_busy = self.busy
        lease = None
        if tag:
            if not self.shelf().is_loaded(source):
                raise RuntimeError(f"{source} is not loaded: it cannot answer yet.")
            lease = self.shelf().lease(source)  # loaded: no wait on the GUI thread
        try:
            handle = (lease.worker if lease is not None else self._worker).submit(
                prompt, params, on_event)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        request_id = tag + handle.request_id
        if lease is not None:
            self._leases[request_id] = lease
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

    def kv_stats(self):
        return None if self._worker is None else self._worker.kv_stats()

    def memory_stats(self):
        return None if self._worker is None else self._worker.memory_stats()

    def kv_format(self) -> str | None:
        return None if self._worker is None else self._worker.kv_format()

    def preload(self, prompt) -> None:
        """A chat was opened: its history's blocks on disk are loaded ahead of its next
        turn, when the engine has nothing else to do (a remote worker does nothing)."""
        if self._worker is not None:
            self._worker.preload(prompt)

    def clear_disk(self) -> None:
        """Remove the KV cache's disk tier files (the memory panel's Clear)."""
        if self._worker is not None:
            self._worker.clear_disk()

    # -- GUI-thread side ---------------------------------------------------------------
    @Slot(int, object)
    def _on_posted(self, token: int, payload) -> None:
        if token == -1:
            generation, event, tag = payload
            if generation == self._generation:
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
                if payload[3] is not None:
                    payload[3].release()
                else:
                    threading.Thread(target=payload[1].shutdown, daemon=True).start()
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
            if self._stale_shelf is not None:  # the engine settings changed: the old goes
                threading.Thread(target=self._stale_shelf.shutdown, daemon=True).start()
                self._stale_shelf = None
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
            lease = self._leases.pop(rid, None)
            if lease is not None:
                lease.release()
            if isinstance(event, FinishedEvent):
                self.requestFinished.emit(rid, event.output)
            else:
                self.requestFailed.emit(rid, event.message)
            if not self._handles:
                self.busyChanged.emit(False)
                self._update_active()
