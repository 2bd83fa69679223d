"""StepLoop: the one loop that steps an LLMEngine and routes what each step produced.

``LLM`` (blocking calls), ``folio chat``, the ``EngineWorker`` thread and ``folio bench`` all
step the engine through one StepLoop, so three things live in one place: which callback
hears which request's events, what a failed step does (every request it was running is
aborted and told why, then the error goes on to the caller), and the per-step hooks that
observers such as the bench read instead of the engine's private state.

Not thread-safe, like the engine: one thread drives it (the worker's, or the caller's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.llm_engine import LLMEngine
from engine.outputs import ErrorEvent, Event, FinishedEvent, RequestOutput
from engine.requests import Prompt
from engine.sampling_params import SamplingParams

EventCallback = Callable[[Event], None]
log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class StepReport:
    """What one step did, handed to each step hook after the step's events went out."""

    time: float  # time.perf_counter() when the step returned
    new_tokens: dict[str, int]  # request id -> tokens its candidates sampled in this step
    finished: tuple[str, ...]  # requests that ended in this step


StepHook = Callable[[StepReport], None]


class StepLoop:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._callbacks: dict[str, EventCallback] = {}
        self._hooks: list[StepHook] = []

    # ---------------------------------------------------------------- requests
    def add(self, prompt: Prompt, params: SamplingParams | None, on_event: EventCallback,
            request_id: str | None = None, grammar=None) -> str:
        """Queue a request whose events go to ``on_event``; raises ValueError on bad input,
        with nothing queued. ``grammar``: see ``LLMEngine.add_request``."""
        request_id = self.engine.add_request(prompt, params, request_id, grammar)
        self._callbacks[request_id] = on_event
        return request_id

    def cancel(self, request_id: str) -> RequestOutput | None:
        """End a request now; its callback hears a FinishedEvent with what it had (an
        ErrorEvent if ending it failed: the callback always hears)."""
        on_event = self._callbacks.pop(request_id, None)
        try:
            output = self.engine.abort(request_id)
        except Exception as exc:
            log.exception("cancelling %s failed", request_id)
            _tell(on_event, ErrorEvent(request_id, f"cancelling failed: {exc}"))
            return None
        if output is not None:
            _tell(on_event, FinishedEvent(request_id, output))
        return output

    def cancel_all(self) -> None:
        for request_id in list(self._callbacks):
            self.cancel(request_id)

    @property
    def busy(self) -> bool:
        return self.engine.has_unfinished_requests()

    # ------------------------------------------------------------------- steps
    def add_hook(self, hook: StepHook) -> Callable[[], None]:
        """Call ``hook`` after every step; returns a function that removes it."""
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook)

    def step(self) -> list[Event]:
        """One engine step; each event goes to its request's callback, then the hooks run.

        A step that raises ends every request in flight: each callback hears an
        ErrorEvent and the exception propagates."""
        try:
            events = self.engine.step()
        except Exception as exc:
            self._fail_all(f"generation failed: {exc}")
            raise
        now = time.perf_counter()
        finished = []
        for event in events:
            if isinstance(event, FinishedEvent):
                finished.append(event.request_id)
                on_event = self._callbacks.pop(event.request_id, None)
            else:
                on_event = self._callbacks.get(event.request_id)
            if on_event is not None:
                on_event(event)
        if self._hooks:
            report = StepReport(now, dict(self.engine.last_step_tokens), tuple(finished))
            for hook in list(self._hooks):
                hook(report)
        return events

    def _fail_all(self, reason: str) -> None:
        """After a failed step: every request the engine holds ends, and every callback
        hears ``reason``. One abort or callback that raises stops none of the others."""
        failed, self._callbacks = self._callbacks, {}
        for request_id in dict.fromkeys([*failed, *self.engine.request_ids()]):
            try:
                self.engine.abort(request_id)
            except Exception:
                log.exception("aborting %s after a failed step failed", request_id)
        for request_id, on_event in failed.items():
            _tell(on_event, ErrorEvent(request_id, reason))

    def run(self, prompts: list[Prompt], params: SamplingParams | None,
            on_event: EventCallback | None = None) -> list[RequestOutput]:
        """Queue ``prompts`` and step until all of them finish; outputs in their order.

        Anything that interrupts the loop (an error, Ctrl+C) aborts the requests that did
        not finish, so no block stays held."""
        done: dict[str, RequestOutput] = {}

        def collect(event: Event) -> None:
            if isinstance(event, FinishedEvent):
                done[event.request_id] = event.output
            if on_event is not None:
                on_event(event)

        request_ids: list[str] = []
        try:
            for prompt in prompts:
                request_ids.append(self.add(prompt, params, collect))
            while len(done) < len(request_ids):
                self.step()
        except BaseException:
            for request_id in request_ids:
                if request_id not in done:
                    self._callbacks.pop(request_id, None)
                    self.engine.abort(request_id)
            raise
        return [done[r] for r in request_ids]


def _tell(on_event: EventCallback | None, event: Event) -> None:
    """Hand ``event`` to its callback; one that raises is logged, so the next is told."""
    if on_event is None:
        return
    try:
        on_event(event)
    except Exception:
        log.exception("event callback failed for %s", event.request_id)
