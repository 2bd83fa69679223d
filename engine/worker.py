"""EngineWorker: the engine's step loop on a background thread.

Callers on any thread ``submit`` requests and ``cancel`` them; the worker batches
whatever is in flight into each step (continuous batching across chats) and reports
through the request's callback, which runs on the worker thread. A request constrained
to a schema not compiled yet waits for it on a thread of its own and is queued once it is
ready: the worker thread never compiles while other requests decode. A GUI re-emits those
events as queued signals. ``kv_stats`` and ``memory_stats`` return snapshots refreshed
by the worker, so a caller never waits for a step to end. An activity listener hears an
``ActivityEvent`` when the worker starts running requests and when it falls idle (after
the last snapshots), so a view can read them then instead of polling an idle engine.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.kv_stats import KVStats
from engine.llm import LLM
from engine.outputs import ActivityEvent, ErrorEvent, Event, FinishedEvent
from engine.requests import Prompt
from engine.runner.memory import MemoryStats
from engine.sampling_params import SamplingParams
from engine.step_loop import EventCallback

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.2
# memory_stats walks the page tables of the whole KV pool (runner/resident.py): while
# requests run it is measured this seldom, and only while someone reads the snapshot;
# always once as the worker falls idle.
MEMORY_INTERVAL_S = 2.0
ActivityListener = Callable[[ActivityEvent], None]


@dataclass(slots=True)
class RequestHandle:
    request_id: str
    _worker: EngineWorker

    def cancel(self) -> None:
        self._worker.cancel(self.request_id)


class EngineWorker:
    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self._engine = llm.engine
        self._steps = llm.loop
        self._commands: queue.Queue = queue.Queue()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stats_lock = threading.Lock()
        self._kv_stats = self._engine.kv_stats()
        self._memory_stats = self._engine.memory_stats()
        self._stats_time = self._memory_time = time.monotonic()
        self._memory_read = False  # whether memory_stats was called since the last measure
        self._busy = False
        self._activity_listener: ActivityListener | None = None
        # Requests waiting for their grammar, before they are queued: whether each was
        # cancelled meanwhile. The lock orders a cancel after its request's submit.
        self._compiling: dict[str, bool] = {}
        self._compiling_lock = threading.Lock()

    # ------------------------------------------------------------- any thread
    def start(self) -> EngineWorker:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="folio-engine", daemon=True)
            self._thread.start()
        return self

    def submit(
        self, prompt: Prompt, params: SamplingParams | None, on_event: EventCallback,
        label: str = "chat", grammar=None,
    ) -> RequestHandle:
        """Queue a request; ``label`` starts its id ("chat-3", "api-7"), which the memory
        panel shows as the owner of its blocks. ``grammar``: its response format compiled
        (``llm.engine.grammars.compile``) where the caller did so; otherwise a constrained
        request is compiled first, on another thread, and a schema that cannot be
        enforced is an ErrorEvent (rejected) on the worker thread."""
        request_id = f"{label}-{next(self._ids)}"
        params = params or SamplingParams()
        if params.response_format is None or grammar is not None:
            self._commands.put(("submit", request_id, prompt, params, on_event, grammar))
        else:
            with self._compiling_lock:
                self._compiling[request_id] = False
            threading.Thread(target=self._compile_then_submit, name="folio-grammar-wait",
                             args=(request_id, prompt, params, on_event), daemon=True).start()
        return RequestHandle(request_id, self)

    def cancel(self, request_id: str) -> None:
        with self._compiling_lock:
            if request_id in self._compiling:
                # Cancelled once it is queued, so it ends as any cancelled request does.
                self._compiling[request_id] = True
                return
            self._commands.put(("cancel", request_id))

    def set_activity_listener(self, listener: ActivityListener | None) -> None:
        """`listener` runs on the worker thread: it must only hand the event on."""
        self._activity_listener = listener

    def preload(self, prompt: Prompt) -> None:
        """Load ``prompt``'s blocks found on disk ahead of its request (a chat opened
        after a restart), on the worker thread when no request runs: one queued with a
        request, or while requests run, is dropped (that request loads what it needs)."""
        self._commands.put(("preload", prompt))

    def clear_disk(self) -> None:
        """Remove the KV disk tier's files (on the worker thread, between steps)."""
        self._commands.put(("clear_disk",))

    def kv_stats(self) -> KVStats:
        with self._stats_lock:
            return self._kv_stats

    def memory_stats(self) -> MemoryStats:
        self._memory_read = True
        with self._stats_lock:
            return self._memory_stats

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._commands.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _compile_then_submit(self, request_id: str, prompt: Prompt, params: SamplingParams,
                             on_event: EventCallback) -> None:
        try:
            grammar = self._engine.grammars.compile(params.response_format)
            command = ("submit", request_id, prompt, params, on_event, grammar)
        except Exception as exc:  # told to the request on the worker thread, as a bad one
            command = ("reject", request_id, exc, on_event)
        with self._compiling_lock:
            cancelled = self._compiling.pop(request_id)
            self._commands.put(command)
            if cancelled:
                self._commands.put(("cancel", request_id))

    # ----------------------------------------------------------- worker thread
    def _loop(self) -> None:
        while not self._stop.is_set():
            # Idle: sleep until a command arrives. Busy: only pick up what is queued.
            busy = self._steps.busy
            self._note_activity(busy)
            try:
                command = self._commands.get_nowait() if busy else self._commands.get()
            except queue.Empty:
                command = None
            changed = False
            preload = None  # the last chat opened: runs after the other commands
            while command is not None:
                if command[0] == "preload":
                    preload = command[1]
                else:
                    self._handle(command)
                changed = True
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if self._stop.is_set():
                break
            if preload is not None and not self._steps.busy:
                self._preload(preload)
            if self._steps.busy:
                self._note_activity(True)
                self._step()
            elif changed:
                self._refresh_stats(force=True)
        self._steps.cancel_all()
        try:  # the cached blocks go to disk before the model unloads
            self._engine.close()
        except Exception:
            log.exception("keeping the KV cache on disk failed")
        self._refresh_stats(force=True)

    def _handle(self, command: tuple) -> None:
        kind = command[0]
        if kind == "submit":
            _, request_id, prompt, params, on_event, grammar = command
            try:
                self._steps.add(prompt, params, _Guarded(on_event, self), request_id, grammar)
            except Exception as exc:  # a bad request must not stop the worker
                self._reject(request_id, exc, on_event)
        elif kind == "reject":
            self._reject(*command[1:])
        elif kind == "cancel":
            self._steps.cancel(command[1])
        elif kind == "clear_disk":
            self._engine.clear_disk()

    def _reject(self, request_id: str, exc: Exception, on_event: EventCallback) -> None:
        rejected = isinstance(exc, ValueError)
        _Guarded(on_event, self)(ErrorEvent(request_id, str(exc), rejected))

    def _preload(self, prompt: Prompt) -> None:
        try:
            self._engine.preload(prompt)
        except Exception:  # a failed load-ahead costs the next turn its speed, nothing else
            log.exception("loading a chat's blocks ahead failed")

    def _note_activity(self, busy: bool) -> None:
        if busy == self._busy:
            return
        self._busy = busy
        if not busy:  # what the engine holds now that nothing runs, memory included
            self._refresh_stats(force=True, memory=True)
        listener = self._activity_listener
        if listener is not None:
            try:
                listener(ActivityEvent(busy))
            except Exception:
                log.exception("activity listener failed")

    def _step(self) -> None:
        try:
            self._steps.step()
        except Exception:
            # The loop has aborted every request and told each one; the worker lives on.
            log.exception("engine step failed")
            return
        self._refresh_stats(force=False)

    def _refresh_stats(self, force: bool, memory: bool = False) -> None:
        """KV stats every STATS_INTERVAL_S or when forced; memory stats every
        MEMORY_INTERVAL_S if they were read since, or when asked for (`memory`)."""
        now = time.monotonic()
        if not force and now - self._stats_time < STATS_INTERVAL_S:
            return
        kv = self._engine.kv_stats()
        mem = None
        if memory or (self._memory_read and now - self._memory_time >= MEMORY_INTERVAL_S):
            self._memory_read = False
            mem = self._engine.memory_stats()
        with self._stats_lock:
            self._kv_stats, self._stats_time = kv, now
            if mem is not None:
                self._memory_stats, self._memory_time = mem, now


class _Guarded:
    """A request's callback as the worker hands it to the loop: the stats are fresh
    before the request hears it ended (whoever hears of the end must see the freed
    blocks), and a callback that raises is logged instead of stopping the engine."""

    __slots__ = ("on_event", "worker")

    def __init__(self, on_event: EventCallback, worker: EngineWorker) -> None:
        self.on_event, self.worker = on_event, worker

    def __call__(self, event: Event) -> None:
        ended = isinstance(event, FinishedEvent | ErrorEvent)
        if ended:
            self.worker._refresh_stats(force=True)
        try:
            self.on_event(event)
        except Exception:
            log.exception("event callback failed for %s", event.request_id)
