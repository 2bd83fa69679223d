"""Admission is a transaction: a request that fails at any stage leaves the engine exactly
as if it had never been sent, whatever else is running; a failed step or abort still
tells every request's caller."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.requests as requests_module
from engine import SamplingParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import ErrorEvent, FinishedEvent
from engine.sampling_params import SEED_MAX, SEED_MIN, ResponseFormat
from engine.step_loop import StepLoop
from engine.text.candidate import CandidateText
from tests.engine.tiny_models import random_prompt

# Three prompts that share their first two blocks, so failed and live requests meet in
# the prefix cache.
SHARED = random_prompt(7, 32)
PROMPTS = [SHARED + random_prompt(i, 9 + i) for i in range(3)]
UNENFORCEABLE = ResponseFormat("json_schema", {"type": "string", "not": {}})
STAGES = ("encode", "token ids", "grammar", "generator", "candidate text", "scheduler")


def new_engine(tiny_dir) -> LLMEngine:
    return LLMEngine(str(tiny_dir), EngineConfig(num_gpu_blocks=48, max_model_len=128))


@pytest.fixture(scope="module")
def twins(tiny_dir):
    """Two engines that must stay equal: one sees the failing requests, one never does."""
    return new_engine(tiny_dir), new_engine(tiny_dir)


def params(n: int = 1, seed: int | None = 3, **extra) -> SamplingParams:
    return SamplingParams(n=n, max_tokens=5, temperature=0.9, seed=seed, ignore_eos=True,
                          **extra)


@contextmanager
def failing(monkeypatch, engine: LLMEngine, stage: str):
    """Make ``stage`` of the next admission fail; yields the prompt and params to send."""
    prompt, extra, request_id = PROMPTS[0], {}, None
    with monkeypatch.context() as m:
        if stage == "encode":
            m.setattr(engine, "build", _raise("the template failed"))
        elif stage == "token ids":
            prompt = [*PROMPTS[0], 10**6]
        elif stage == "grammar":
            extra = {"response_format": UNENFORCEABLE}
        elif stage == "generator":
            real = requests_module.make_generator
            # The last candidate's generator fails: the fork's parts are made up front.
            m.setattr(requests_module, "make_generator",
                      lambda seed, i: _raise("no generator")() if i == 2 else real(seed, i))
        elif stage == "candidate text":
            m.setattr(CandidateText, "start", classmethod(_raise("no detokenizer")))
        elif stage == "scheduler":
            request_id = "taken"  # the id of a request that is running
        yield prompt, params(n=3, **extra), request_id


def _raise(message: str):
    def fail(*args, **kwargs):
        raise ValueError(message)
    return fail


def pool_state(engine: LLMEngine) -> list:
    """Every block's id, references and prefix key, and the free queue's order."""
    return [([(b.block_id, b.ref_count, b.block_hash) for b in pool.blocks],
             [b.block_id for b in pool.free_queue], sorted(pool.cached))
            for pool in engine.kv_cache.pools]


def drain(engine: LLMEngine) -> dict[str, list[list[int]]]:
    done = {}
    while engine.has_unfinished_requests():
        for event in engine.step():
            if isinstance(event, FinishedEvent):
                done[event.request_id] = [o.token_ids for o in event.output.outputs]
    return done


def assert_idle(engine: LLMEngine) -> None:
    scheduler = engine.scheduler
    assert engine.request_ids() == [] and scheduler.requests == {}
    assert not (scheduler.waiting or scheduler.running or scheduler.swapped
                or scheduler.loading)
    assert engine.kv_stats().num_used == 0


@pytest.mark.parametrize("stage", STAGES)
def test_a_failed_admission_leaves_nothing_while_others_run(twins, monkeypatch, stage):
    engine, twin = twins
    for e in (engine, twin):
        e.add_request(PROMPTS[1], params(n=2), "taken")
        e.step()
    before = pool_state(engine)
    with failing(monkeypatch, engine, stage) as (prompt, p, request_id):
        with pytest.raises(ValueError):
            engine.add_request(prompt, p, request_id)
    assert pool_state(engine) == before
    assert engine.request_ids() == ["taken"]
    assert drain(engine) == drain(twin)  # the running request never noticed
    assert pool_state(engine) == pool_state(twin)
    assert_idle(engine)


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=st.lists(st.tuples(st.sampled_from(range(len(PROMPTS))),
                                   st.integers(1, 3), st.sampled_from((None, *STAGES)),
                                   st.integers(0, 3)),
                         min_size=1, max_size=6))
def test_random_admission_failures_equal_a_run_without_them(twins, monkeypatch, workload):
    """Requests sent to both engines, failures (at a random stage, between random steps)
    to one: the outputs, every block's state and the free queue's order stay the same."""
    engine, twin = twins
    for i, (prompt, n, stage, steps) in enumerate(workload):
        if stage is None:
            for e in (engine, twin):
                e.add_request(PROMPTS[prompt], params(n=n, seed=i), f"r{i}")
        else:
            if stage == "scheduler" and "taken" not in engine.request_ids():
                for e in (engine, twin):
                    e.add_request(PROMPTS[prompt], params(n=n, seed=i), "taken")
            with failing(monkeypatch, engine, stage) as (bad, p, request_id):
                with pytest.raises(ValueError):
                    engine.add_request(bad, p, request_id)
        for _ in range(steps):
            engine.step()
            twin.step()
    assert drain(engine) == drain(twin)
    assert pool_state(engine) == pool_state(twin)
    assert_idle(engine)


def test_seeds_at_the_ends_of_the_range_fork_into_candidates(twins):
    engine, _ = twins
    for seed in (SEED_MIN, -1, SEED_MAX):
        engine.add_request(PROMPTS[2], params(n=3, seed=seed))
        [outputs] = drain(engine).values()
        assert [len(tokens) for tokens in outputs] == [5, 5, 5]
    assert_idle(engine)


@pytest.mark.parametrize("seed", [SEED_MAX + 1, SEED_MIN - 1, 2**64, "7", 1.5, True])
def test_a_seed_outside_the_range_is_refused_by_name(seed):
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=seed)


def test_a_failed_step_tells_every_caller_even_when_an_abort_or_a_callback_fails(
        tiny_dir, monkeypatch):
    engine = new_engine(tiny_dir)
    loop = StepLoop(engine)
    heard: dict[str, list] = {"a": [], "b": [], "c": []}

    def listener(name):
        def on_event(event):
            heard[name].append(event)
            if name == "a":
                raise RuntimeError("a broken callback")
        return on_event

    for name in heard:
        loop.add(PROMPTS[0], params(), listener(name), name)
    engine.add_request(PROMPTS[1], params(), "no-callback")  # the engine's alone
    monkeypatch.setattr(engine.runner, "execute", _raise("the forward failed"))
    real_abort = engine.abort

    def abort(request_id):
        if request_id == "b":
            real_abort(request_id)
            raise RuntimeError("an abort that fails")
        return real_abort(request_id)

    monkeypatch.setattr(engine, "abort", abort)
    with pytest.raises(ValueError, match="the forward failed"):
        loop.step()
    for name in heard:
        [event] = heard[name]
        assert isinstance(event, ErrorEvent) and "the forward failed" in event.message
    monkeypatch.undo()
    assert_idle(engine)
    # The engine goes on: a new request runs to its end.
    done = []
    loop.add(PROMPTS[2], params(), done.append)
    while loop.busy:
        loop.step()
    assert isinstance(done[-1], FinishedEvent)


def test_a_cancel_whose_abort_fails_still_tells_the_caller(tiny_dir, monkeypatch):
    engine = new_engine(tiny_dir)
    loop = StepLoop(engine)
    heard = []
    request_id = loop.add(PROMPTS[0], params(), heard.append)
    monkeypatch.setattr(engine, "abort", _raise("cannot abort"))
    assert loop.cancel(request_id) is None
    [event] = heard
    assert isinstance(event, ErrorEvent) and "cannot abort" in event.message
