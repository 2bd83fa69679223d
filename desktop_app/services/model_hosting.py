"""Where the bridge's models come from: ``start_load`` makes a source's worker on a
thread of its own (a ``remote:`` source's RemoteWorker, or a local model leased from the
ModelShelf, services.model_shelf), and the shelf itself (built on first use with the
engine config of the time; a config change sets it aside, shut down once the picker's
model is replaced). Compared models load in the background (``prepare``) and are leased
for one request each (``lease_for``, ``hold``, ``release``).

No Qt here: what happens on a load thread reaches the GUI thread through the bridge's
queued signal, as payloads: ``("progress", stage, fraction)``, ``("failed", source,
message)``, ``("loaded", worker, source, lease or None)`` for ``start_load``'s post;
``("hosted",)`` (a model loaded or unloaded) and ``("companion", source, message or
None)`` (a compared model's load ended) for the constructor's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from desktop_app.data.servers import is_remote_source, parse_server_source
from desktop_app.services.devices import describe_memory_error
from desktop_app.services.worker_protocol import ModelWorker

if TYPE_CHECKING:
    from desktop_app.services.model_shelf import ModelShelf

LlmFactory = Callable[..., Any]  # (name_or_path, config=..., progress=...) -> LLM
WorkerFactory = Callable[[Any], ModelWorker]  # (llm) -> its worker, not started
RemoteFactory = Callable[..., ModelWorker]  # (source, api key, progress) -> its worker


def default_llm_factory(name_or_path: str, config=None, progress=None):
    from engine import LLM

    return LLM(name_or_path, config=config, progress=progress)


def default_worker_factory(llm) -> ModelWorker:
    from desktop_app.services.local_worker import LocalWorker  # imports torch: on first load

    return LocalWorker(llm)


def remote_worker_factory(source: str, api_key: str, progress=None) -> ModelWorker:
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


class ModelHosting:
    def __init__(self, config: Callable[[], Any], llm_factory: LlmFactory | None = None,
                 worker_factory: WorkerFactory | None = None,
                 remote_factory: RemoteFactory | None = None, budget_bytes=None,
                 estimate: Callable[[str], int] | None = None,
                 post: Callable[[tuple], None] = lambda _payload: None) -> None:
        """``config()``: the engine config a new shelf is built with; ``budget_bytes``:
        the one memory budget of the local models (weights and pools; None: no limit; a
        function: read when the first local model loads); ``estimate(source)``: a model's
        bytes before it loads: the engine's from the file, unless the models come from a
        factory of the caller's (tests' fakes: no file to read, measured once loaded)."""
        if estimate is None and llm_factory is not None:
            estimate = lambda _source: 0  # noqa: E731
        self._llm_factory = llm_factory or default_llm_factory
        self._worker_factory = worker_factory or default_worker_factory
        self._remote_factory = remote_factory or remote_worker_factory
        self._config, self._budget, self._estimate = config, budget_bytes, estimate
        self._post = post
        self._shelf: ModelShelf | None = None
        self._stale: ModelShelf | None = None
        self._leases: dict[str, Any] = {}  # request id -> a compared model's lease

    def shelf(self) -> ModelShelf:
        """The local models (built on first use, with the engine config of the time)."""
        if self._shelf is None:
            from desktop_app.services.model_shelf import ModelShelf

            budget = self._budget
            self._shelf = ModelShelf(self._config(), self._worker_for,
                                     budget() if callable(budget) else budget,
                                     estimate=self._estimate,
                                     on_change=lambda: self._post(("hosted",)))
        return self._shelf

    def _worker_for(self, source: str, config, progress) -> ModelWorker:
        from desktop_app.services.devices import config_for_source

        return self._worker_factory(self._llm_factory(
            source, config=config_for_source(config, source), progress=progress))

    def start_load(self, source: str, config, api_key: str,
                   post: Callable[[tuple], None]) -> None:
        """Make ``source``'s worker on a thread of its own: a remote one (``api_key``:
        what its server is sent), or a local one leased from the shelf with ``config``
        (None: the shelf's); ``post``: its progress, then "loaded" or "failed"."""
        shelf = None if is_remote_source(source) else self.shelf()

        def run() -> None:
            def progress(stage: str, frac: float) -> None:
                post(("progress", stage, float(frac)))

            try:
                if shelf is None:
                    worker, lease = self._remote_factory(source, api_key, progress), None
                else:
                    lease = shelf.lease(source, config, progress)
                    worker = lease.worker
            except BaseException as exc:  # noqa: BLE001 - any failure goes to the dialog
                post(("failed", source, describe_error(exc)))
                return
            post(("loaded", worker, source, lease))

        threading.Thread(target=run, name="folio-model-load", daemon=True).start()

    @staticmethod
    def let_go(worker: ModelWorker, lease, wait: bool = False) -> None:
        """A worker the picker no longer holds (replaced, unloaded, or a superseded load):
        a local one released, not shut down: it stays loaded while memory allows (going
        back to it is warm; the shelf unloads it when the room is needed); a remote one
        shut down, waited for only when ``wait`` (joining its loop can take a step's
        time: not on the GUI thread otherwise)."""
        if lease is not None:
            lease.release()
        elif wait:
            worker.shutdown()
        else:
            threading.Thread(target=worker.shutdown, name="folio-worker-stop",
                             daemon=True).start()

    def config_changed(self) -> None:
        """The engine settings changed: the next load builds a new shelf; the old one
        serves until ``drop_stale``."""
        if self._shelf is not None:
            self._stale, self._shelf = self._shelf, None

    def drop_stale(self) -> None:
        """The picker's model was replaced: a shelf of the old settings goes."""
        if self._stale is not None:
            threading.Thread(target=self._stale.shutdown, daemon=True).start()
            self._stale = None

    def hosted(self) -> list:
        """The local models loaded (engine.hosting's HostedModel), most recent first."""
        if self._shelf is None:
            return []
        return sorted(self._shelf.models(), key=lambda m: -m.last_used)

    def worker(self, source: str) -> ModelWorker | None:
        """A loaded local model's worker (its facts and figures), None when not loaded."""
        return None if self._shelf is None else self._shelf.worker(source)

    def unload_later(self, source: str) -> None:
        """Unload a model off the GUI thread: joining its step loop can take a step."""
        if self._shelf is not None:
            threading.Thread(target=self._shelf.unload, args=(source,),
                             name="folio-worker-stop", daemon=True).start()

    # -- compared models -------------------------------------------------------------------
    def prepare(self, source: str) -> bool:
        """Load a compared model in the background (``("companion", source, message)``
        is posted when it ends); True when it is loaded already (nothing is posted)."""
        shelf = self.shelf()
        if shelf.is_loaded(source):
            return True

        def run() -> None:
            try:
                shelf.lease(source).release()
            except BaseException as exc:  # noqa: BLE001 - any failure goes to the chat
                self._post(("companion", source, describe_error(exc)))
                return
            self._post(("companion", source, None))

        threading.Thread(target=run, name="folio-compare-load", daemon=True).start()
        return False

    def lease_for(self, source: str):
        """A loaded compared model's lease, for one request (no wait: it is loaded)."""
        shelf = self.shelf()
        if not shelf.is_loaded(source):
            raise RuntimeError(f"{source} is not loaded: it cannot answer yet.")
        return shelf.lease(source)

    def hold(self, request_id: str, lease) -> None:
        self._leases[request_id] = lease

    def holds(self, request_id: str) -> bool:
        """Whether ``request_id`` is a compared model's (leased for it)."""
        return request_id in self._leases

    def release(self, request_id: str) -> None:
        """The request ended: its model may be unloaded again when the room is needed."""
        lease = self._leases.pop(request_id, None)
        if lease is not None:
            lease.release()

    def shutdown(self) -> None:
        for lease in self._leases.values():
            lease.release()
        self._leases.clear()
        for shelf in (self._shelf, self._stale):
            if shelf is not None:
                shelf.shutdown()
        self._shelf = self._stale = None
