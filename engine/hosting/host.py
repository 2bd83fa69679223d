"""ModelHost: several models in one process, within one memory budget.

A caller ``lease``s a model by name for the length of a request: the model is loaded on
first use (once, however many callers ask while it loads: they wait for that load), kept
while leased, and unloaded when idle past its keep-alive (``reap``), at once when its last
lease ends with keep-alive 0, or when another model needs the memory (budget.py: idle
ones, least recently used first). Each model is its own EngineWorker, with its own KV
pool: two models never share a block, and one's preemption never touches another.

The budget counts weights and KV pools together: a model's estimate from its file's
header before it loads, its worker's measured figures once loaded. Loading and unloading
run outside the lock, so a lease of a loaded model never waits for another model's load.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.hosting.budget import ModelWontFit, Resident, plan_room
from engine.hosting.defaults import default_estimate, default_load
from engine.hosting.events import HostEvent, ModelLoaded, ModelUnloaded
from engine.hosting.keep_alive import checked_keep_alive_s

log = logging.getLogger(__name__)

__all__ = ["HostedModel", "ModelHost", "ModelLease", "ModelWontFit"]

_HOST_DEFAULT: Any = object()  # lease(): the host's own keep-alive


@dataclass(slots=True)
class HostedModel:
    """A snapshot of one model in the host, for status endpoints and the app. While it
    loads, ``total_bytes`` is the estimate and the parts are 0 (not measured yet)."""

    name: str
    state: str  # "loading" | "loaded"
    weights_bytes: int
    kv_bytes: int  # the KV pool, and a hybrid model's state pool
    total_bytes: int
    running: int  # leases held (requests running)
    idle_s: float | None  # since the last lease ended; None while leased or loading
    keep_alive_s: float | None  # None: kept until unloaded or shut down
    last_used: float  # on the host's clock


@dataclass(slots=True, eq=False)
class _Entry:
    name: str
    state: str
    total_bytes: int
    keep_alive_s: float | None
    last_used: float
    worker: Any = None
    weights_bytes: int = 0
    kv_bytes: int = 0
    running: int = 0
    error: BaseException | None = None  # why its load failed, for the callers waiting

    def resident(self) -> Resident:
        return Resident(self.name, self.total_bytes,
                        self.running > 0 or self.state == "loading", self.last_used)


class ModelLease:
    """One request's hold on a loaded model: ``with host.lease(name) as lease:`` and use
    ``lease.worker``. The model is not unloaded while a lease on it is held."""

    def __init__(self, host: ModelHost, entry: _Entry) -> None:
        self._host, self._entry = host, entry
        self.name: str = entry.name
        self.worker = entry.worker
        self._released = False

    def release(self) -> None:
        """End the lease (once; later calls do nothing). With keep-alive 0 and no other
        lease, the model is unloaded here, on the caller's thread."""
        if not self._released:
            self._released = True
            self._host._release(self._entry)

    def __enter__(self) -> ModelLease:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


class ModelHost:
    def __init__(self, config: EngineConfig, budget_bytes: int | None = None, *,
                 keep_alive_s: float | None = 300.0,
                 clock: Callable[[], float] = time.monotonic,
                 load: Callable[[str], Any] | None = None,
                 estimate: Callable[[str], int] | None = None) -> None:
        """`budget_bytes`: weights and KV pools of all loaded models; None: no limit.
        `keep_alive_s`: how long an idle model stays loaded by default (None: forever).
        `load(name)` returns a started EngineWorker; `estimate(name)` the bytes it will
        take (both default to the engine's own, by model name or path)."""
        if budget_bytes is not None and (isinstance(budget_bytes, bool)
                                         or not isinstance(budget_bytes, int)
                                         or budget_bytes <= 0):
            raise ValueError(f"budget_bytes must be a positive integer or None, "
                             f"got {budget_bytes!r}")
        self.config = config
        self.budget_bytes = budget_bytes
        self.keep_alive_s = checked_keep_alive_s(keep_alive_s, "keep_alive_s")
        self._clock = clock
        self._load = load or default_load(config)
        self._estimate = estimate or default_estimate(config)
        self._lock = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        self._estimates: dict[str, int] = {}  # measured once a model has loaded
        self._listener: Callable[[HostEvent], None] | None = None
        self._closed = False

    def set_listener(self, listener: Callable[[HostEvent], None] | None) -> None:
        """`listener` hears ModelLoaded / ModelUnloaded on the thread that did it."""
        self._listener = listener

    # ----------------------------------------------------------------- leases
    def lease(self, name: str, keep_alive_s: float | None = _HOST_DEFAULT) -> ModelLease:
        """Hold `name` for a request, loading it first if needed (blocking). Its
        keep-alive becomes `keep_alive_s` (the host's default when not given). Raises
        ModelWontFit, before anything is loaded or unloaded, when the budget cannot make
        room; the loader's error when the model cannot be found or loaded."""
        keep = self.keep_alive_s if keep_alive_s is _HOST_DEFAULT else \
            checked_keep_alive_s(keep_alive_s, "keep_alive_s")
        while True:
            with self._lock:
                held = self._join(name, keep)
                if held is not None:
                    return held
                need = self._estimates.get(name)
                if need is not None:
                    victims = self._make_room(name, need)
                    entry = _Entry(name, "loading", need, keep, self._clock())
                    self._entries[name] = entry
                    break
            need = self._estimate(name)  # reads the model's header: outside the lock
            with self._lock:
                self._estimates.setdefault(name, need)
        self._unload(victims, "room")
        return self._finish_load(entry)

    def _join(self, name: str, keep: float | None) -> ModelLease | None:
        """A lease on `name` if it is loaded, after waiting for its load if it is loading;
        None when it is not in the host. Called with the lock held."""
        while True:
            if self._closed:
                raise RuntimeError("the model host is shut down")
            entry = self._entries.get(name)
            if entry is None:
                return None
            if entry.state == "loaded":
                entry.running += 1
                entry.keep_alive_s = keep
                entry.last_used = self._clock()
                return ModelLease(self, entry)
            self._lock.wait()
            if entry.error is not None:
                raise entry.error

    def _make_room(self, name: str, need: int) -> list[_Entry]:
        residents = [e.resident() for e in self._entries.values()]
        names = plan_room(name, need, self.budget_bytes, residents)
        return [self._entries.pop(n) for n in names]

    def _finish_load(self, entry: _Entry) -> ModelLease:
        try:
            worker = self._load(entry.name)
        except BaseException as exc:
            with self._lock:
                entry.error = exc
                if self._entries.get(entry.name) is entry:
                    del self._entries[entry.name]
                self._lock.notify_all()
            raise
        stats = worker.memory_stats()
        with self._lock:
            if self._closed:
                entry.error = RuntimeError("the model host is shut down")
                self._lock.notify_all()
                closed = True
            else:
                closed = False
                entry.worker = worker
                entry.weights_bytes = stats.weights_bytes
                entry.kv_bytes = stats.kv_pool_bytes + stats.state_pool_bytes
                entry.total_bytes = entry.weights_bytes + entry.kv_bytes
                self._estimates[entry.name] = entry.total_bytes
                entry.state, entry.running, entry.last_used = "loaded", 1, self._clock()
                extra = self._room_after_measuring(entry)
                self._lock.notify_all()
        if closed:
            worker.shutdown()
            raise entry.error
        self._tell(ModelLoaded(entry.name, entry.total_bytes))
        self._unload(extra, "room")
        return ModelLease(self, entry)

    def _room_after_measuring(self, entry: _Entry) -> list[_Entry]:
        """A model that measured larger than its estimate makes room from idle ones; where
        it cannot, the host stays over budget until requests end (logged)."""
        others = [e.resident() for e in self._entries.values() if e is not entry]
        try:
            names = plan_room(entry.name, entry.total_bytes, self.budget_bytes, others)
        except ModelWontFit as exc:
            log.warning("over the memory budget after loading: %s", exc)
            return []
        return [self._entries.pop(n) for n in names]

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.running -= 1
            entry.last_used = self._clock()
            done = (entry.running == 0 and entry.keep_alive_s == 0
                    and self._entries.get(entry.name) is entry)
            if done:
                del self._entries[entry.name]
        if done:
            self._unload([entry], "keep_alive 0")

    # ------------------------------------------------------------- management
    def unload(self, name: str) -> bool:
        """Unload `name` now if it is loaded and no request holds it; whether it was."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.state != "loaded" or entry.running:
                return False
            del self._entries[name]
        self._unload([entry], "asked")
        return True

    def reap(self) -> list[str]:
        """Unload the models idle past their keep-alive; their names."""
        with self._lock:
            now = self._clock()
            expired = [e for e in self._entries.values()
                       if e.state == "loaded" and not e.running and e.keep_alive_s is not None
                       and now - e.last_used >= e.keep_alive_s]
            for entry in expired:
                del self._entries[entry.name]
        self._unload(expired, "idle")
        return [e.name for e in expired]

    def models(self) -> list[HostedModel]:
        """Every model loaded or loading, by name."""
        with self._lock:
            now = self._clock()
            return [HostedModel(e.name, e.state, e.weights_bytes, e.kv_bytes, e.total_bytes,
                                e.running,
                                now - e.last_used if e.state == "loaded" and not e.running
                                else None, e.keep_alive_s, e.last_used)
                    for e in sorted(self._entries.values(), key=lambda e: e.name)]

    def workers(self) -> dict[str, Any]:
        """The loaded models' workers by name, for their stats (not to hold: a worker
        whose model is unloaded stops; lease a model to run a request on it)."""
        with self._lock:
            return {e.name: e.worker for e in self._entries.values() if e.state == "loaded"}

    def used_bytes(self) -> int:
        with self._lock:
            return sum(e.total_bytes for e in self._entries.values())

    def shutdown(self) -> None:
        """Unload every model; leases asked for later raise RuntimeError."""
        with self._lock:
            self._closed = True
            loaded = [e for e in self._entries.values() if e.state == "loaded"]
            self._entries.clear()
            self._lock.notify_all()
        self._unload(loaded, "shutdown")

    def _unload(self, entries: list[_Entry], reason: str) -> None:
        for entry in entries:
            try:
                entry.worker.shutdown()
            except Exception:
                log.exception("unloading %s failed", entry.name)
            entry.worker = None
            self._tell(ModelUnloaded(entry.name, reason))

    def _tell(self, event: HostEvent) -> None:
        listener = self._listener
        if listener is not None:
            try:
                listener(event)
            except Exception:
                log.exception("model host listener failed")
