"""Driving an LLMEngine by hand in the engine tests."""

from __future__ import annotations

from collections.abc import Callable

from engine import LLMEngine
from engine.outputs import FinishedEvent, RequestOutput


def run_to_end(engine: LLMEngine,
               after_step: Callable[[LLMEngine], None] | None = None) -> RequestOutput:
    """Step `engine` until nothing is left and return the (last) finished request's output;
    `after_step` sees the engine after every step."""
    output = None
    while engine.has_unfinished_requests():
        for event in engine.step():
            if isinstance(event, FinishedEvent):
                output = event.output
        if after_step is not None:
            after_step(engine)
    assert output is not None, "no request finished"
    return output
