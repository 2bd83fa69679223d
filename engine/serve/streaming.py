"""One API request's events, from the engine's thread to the server's event loop.

The EngineWorker calls back on its own thread; ``RequestStream`` hands each event to the
asyncio loop with ``call_soon_threadsafe`` and the handler awaits them in order. Leaving
the ``async with`` before the request finished (the client went away, the handler
failed) cancels it in the engine, so its blocks are freed at once; leaving it also ends
the request's hold on its model (``on_close``, run off the event loop: it may unload it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from engine.outputs import ErrorEvent, Event, FinishedEvent, PromptProgress, TokenEvent
from engine.sampling_params import SamplingParams
from engine.worker import EngineWorker


class RequestStream:
    def __init__(self, worker: EngineWorker, prompt, params: SamplingParams,
                 grammar=None, on_close: Callable[[], None] | None = None) -> None:
        self._worker = worker
        self._on_close = on_close
        self._prompt = prompt
        self._params = params
        self._grammar = grammar  # params.response_format compiled, or None
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._handle = None
        self._cancelled = False
        self.finished = False
        self.submitted_at = 0.0
        self.first_token_at: float | None = None

    async def __aenter__(self) -> RequestStream:
        loop = asyncio.get_running_loop()

        def on_event(event: Event) -> None:  # the worker's thread
            if isinstance(event, PromptProgress):
                return  # the API has no such chunk: OpenAI's stream starts at the reply
            loop.call_soon_threadsafe(self._queue.put_nowait, event)

        self.submitted_at = time.perf_counter()
        self._handle = self._worker.submit(self._prompt, self._params, on_event, label="api",
                                           grammar=self._grammar)
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.cancel()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:  # shielded: a cancelled handler still ends it
            await asyncio.shield(asyncio.to_thread(on_close))

    def cancel(self) -> None:
        """End the request in the engine; a FinishedEvent with what it had follows."""
        if not self.finished and self._handle is not None and not self._cancelled:
            self._cancelled = True
            self._handle.cancel()

    @property
    def request_id(self) -> str:
        return self._handle.request_id if self._handle else ""

    async def next_event(self) -> Event:
        event = await self._queue.get()
        if isinstance(event, TokenEvent) and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if isinstance(event, FinishedEvent | ErrorEvent):
            self.finished = True
        return event

    async def events(self) -> AsyncIterator[Event]:
        """Every event up to and including the FinishedEvent or ErrorEvent."""
        while not self.finished:
            yield await self.next_event()
