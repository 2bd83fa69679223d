"""PromptProgress: one event per prefill chunk of a request's prompt, before its first
token, with the prefix cache's tokens counted as done from the start."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import FinishedEvent, PromptProgress, TokenEvent
from engine.step_loop import StepLoop
from tests.engine.tiny_models import random_prompt

CHUNK = 16
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return LLMEngine(str(tiny_dir), EngineConfig(num_gpu_blocks=64,
                                                  max_num_batched_tokens=CHUNK))


def run(engine: LLMEngine, prompt: list[int], params: SamplingParams = GREEDY):
    """Every event of one request, in order, and its finished output."""
    events = []
    loop = StepLoop(engine)
    loop.add(prompt, params, events.append)
    while engine.has_unfinished_requests():
        loop.step()
    finished = [e for e in events if isinstance(e, FinishedEvent)]
    return events, finished[0].output


def test_one_event_per_chunk_then_the_first_token(engine):
    prompt = random_prompt(11, 50)
    events, output = run(engine, prompt)
    progress = [e for e in events if isinstance(e, PromptProgress)]
    assert [(p.done, p.total, p.cached) for p in progress] == [
        (16, 50, 0), (32, 50, 0), (48, 50, 0), (50, 50, 0)]
    assert all(p.request_id == output.request_id for p in progress)
    # The prompt is read before the reply starts, and once: no progress after a token.
    first_token = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent))
    assert events.index(progress[-1]) == first_token - 1
    assert len(output.outputs[0].token_ids) == 4


def test_cached_tokens_count_as_done_from_the_start(engine):
    prompt = random_prompt(12, 40)
    run(engine, prompt)
    longer = prompt + random_prompt(13, 30)
    events, output = run(engine, longer)
    cached = output.metrics.num_cached_tokens
    assert cached >= 32  # the first prompt's full blocks, at least
    progress = [e for e in events if isinstance(e, PromptProgress)]
    expected = [min(cached + CHUNK * k, 70) for k in range(1, 1 + -(-(70 - cached) // CHUNK))]
    assert [p.done for p in progress] == expected
    assert {(p.total, p.cached) for p in progress} == {(70, cached)}


def test_candidates_share_one_progress_stream(engine):
    params = SamplingParams(n=3, max_tokens=3, temperature=1.0, seed=5, ignore_eos=True)
    events, output = run(engine, random_prompt(14, 40), params)
    progress = [e for e in events if isinstance(e, PromptProgress)]
    assert [p.done for p in progress] == [16, 32, 40]
    assert len(output.outputs) == 3


def test_generate_and_its_callback_still_work(engine):
    """LLM.generate's callers see the new events and lose nothing of the old ones."""
    seen = []
    loop = StepLoop(engine)
    [out] = loop.run([random_prompt(15, 33)], GREEDY, seen.append)
    assert len(out.outputs[0].token_ids) == 4
    assert sum(isinstance(e, TokenEvent) for e in seen) == 4
    assert [e.done for e in seen if isinstance(e, PromptProgress)] == [16, 32, 33]
