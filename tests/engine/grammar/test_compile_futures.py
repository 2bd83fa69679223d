"""Grammars.compile: one compile per schema, shared by its requests; other schemas never
wait on it; failures are not cached; a compile past the time limit is a GrammarError for
its requests while it runs on. The xgrammar compile is replaced by a fake that a test
holds until it lets it go."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine import ResponseFormat
from engine.grammar import GrammarBusy, GrammarError, Grammars, compiler
from engine.grammar.limits import MAX_OVERDUE_COMPILES
from tests.engine.tiny_models import byte_level_tokenizer

WAIT_S = 10  # how long a test waits for what should happen at once, before it fails


class FakeCompile:
    """Stands for xgrammar's compile: schemas named in ``held`` wait until released; each
    call is counted by schema title; ``fail`` makes the next compile of a title raise."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.held: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.fail: set[str] = set()
        self.lock = threading.Lock()

    def hold(self, title: str) -> None:
        self.held[title] = threading.Event()
        self.started[title] = threading.Event()

    def release_all(self) -> None:
        for event in self.held.values():
            event.set()

    def __call__(self, compiler_, strict: bool, schema: dict):
        title = schema.get("title", "")
        with self.lock:
            self.calls[title] = self.calls.get(title, 0) + 1
        if title in self.started:
            self.started[title].set()
        if title in self.held:
            assert self.held[title].wait(WAIT_S)
        if title in self.fail:
            self.fail.discard(title)
            raise GrammarError("schema", f"the schema cannot be compiled: {title} failed")
        return f"grammar of {title}"


@pytest.fixture
def fake(monkeypatch):
    fake = FakeCompile()
    monkeypatch.setattr(compiler, "_compile", fake)
    yield fake
    fake.release_all()


@pytest.fixture
def grammars(monkeypatch):
    tokenizer = byte_level_tokenizer()
    grammars = Grammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    monkeypatch.setattr(grammars, "_ready", lambda: None)  # no tokenizer table needed
    return grammars


def fmt(title: str) -> ResponseFormat:
    return ResponseFormat("json_schema", {"title": title, "type": "integer"})


def test_a_small_schema_compiles_while_a_big_one_is_still_compiling(fake, grammars) -> None:
    fake.hold("big")
    with ThreadPoolExecutor(2) as pool:
        big = pool.submit(grammars.compile, fmt("big"))
        assert fake.started["big"].wait(WAIT_S)
        small = pool.submit(grammars.compile, fmt("small"))
        assert small.result(WAIT_S) == "grammar of small"
        assert not big.done()
        fake.release_all()
        assert big.result(WAIT_S) == "grammar of big"


def test_the_same_schema_compiled_by_two_threads_compiles_once(fake, grammars) -> None:
    fake.hold("shared")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(grammars.compile, fmt("shared"))
        assert fake.started["shared"].wait(WAIT_S)
        second = pool.submit(grammars.compile, fmt("shared"))
        fake.release_all()
        assert first.result(WAIT_S) == second.result(WAIT_S) == "grammar of shared"
    assert grammars.compile(fmt("shared")) == "grammar of shared"  # now from the cache
    assert fake.calls["shared"] == 1


def test_a_failed_compile_is_not_cached(fake, grammars) -> None:
    fake.fail.add("flaky")
    with pytest.raises(GrammarError, match="flaky failed"):
        grammars.compile(fmt("flaky"))
    assert grammars.compile(fmt("flaky")) == "grammar of flaky"
    assert fake.calls["flaky"] == 2


def test_a_schema_refused_by_its_checks_never_reaches_the_compile(fake, grammars) -> None:
    with pytest.raises(GrammarError) as info:
        grammars.compile(ResponseFormat("json_schema", {"title": "bad", "not": {}}))
    assert info.value.construct == "not" and "bad" not in fake.calls


def test_a_compile_past_the_time_limit_is_answered_and_caches_when_it_ends(
        fake, grammars) -> None:
    grammars.compile_timeout_s = 0.2
    fake.hold("slow")
    with pytest.raises(GrammarError) as info:
        grammars.compile(fmt("slow"))
    assert info.value.construct == "compile time"
    assert "the schema took too long to compile (more than 0.2 s)" in str(info.value)
    # Asked again while it runs: answered at once, by the same compile.
    with pytest.raises(GrammarError, match="took too long"):
        grammars.compile(fmt("slow"))
    assert fake.calls["slow"] == 1
    grammars.compile_timeout_s = WAIT_S
    fake.release_all()
    assert _eventually(lambda: grammars.compile(fmt("slow")) == "grammar of slow")
    assert fake.calls["slow"] == 1


def test_an_awaiting_waiter_that_gives_up_leaves_the_compile_running(fake,
                                                                      grammars) -> None:
    grammars.compile_timeout_s = 0.2
    fake.hold("awaited")
    compiling = grammars.start(fmt("awaited"))
    with pytest.raises(GrammarError, match="took too long"):
        asyncio.run(compiling.wait())
    assert not compiling.future.cancelled()
    fake.release_all()
    assert compiling.future.result(WAIT_S) == "grammar of awaited"
    assert asyncio.run(grammars.start(fmt("awaited")).wait()) == "grammar of awaited"
    assert fake.calls["awaited"] == 1


def test_overdue_compiles_turn_new_schemas_away_but_not_cached_ones(fake, grammars) -> None:
    assert grammars.compile(fmt("cached")) == "grammar of cached"
    grammars.compile_timeout_s = 0.05
    for i in range(MAX_OVERDUE_COMPILES):
        fake.hold(f"slow{i}")
        with pytest.raises(GrammarError, match="took too long"):
            grammars.compile(fmt(f"slow{i}"))
    with pytest.raises(GrammarBusy, match=f"{MAX_OVERDUE_COMPILES} schemas that took too "
                       "long to compile are still compiling"):
        grammars.compile(fmt("new"))
    assert grammars.compile(fmt("cached")) == "grammar of cached"
    assert "new" not in fake.calls
    fake.release_all()
    grammars.compile_timeout_s = WAIT_S
    assert _eventually(lambda: grammars.compile(fmt("new")) == "grammar of new")


def _eventually(check) -> bool:
    """``check()`` true within WAIT_S: a compile thread ends after its waiter is told."""
    done = threading.Event()
    for _ in range(WAIT_S * 20):
        try:
            if check():
                return True
        except (GrammarError, GrammarBusy):
            pass
        done.wait(0.05)
    return False
