"""Response formats built to hurt, through ``folio serve`` on the tiny model: a schema
past a limit is a 400 naming what was too large (never a 500), a slow compile is a 400
for its request while the others go on, and the engine ends with no block held.

The slow compiles are xgrammar's real compile held by the test until it lets it go."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import pytest

from engine.grammar import compiler
from engine.grammar.limits import (
    MAX_ENUM_VALUES,
    MAX_LITERAL_CHARS,
    MAX_OVERDUE_COMPILES,
    MAX_SUBSCHEMAS,
)

ASK = [{"role": "user", "content": "Answer in JSON."}]
WAIT_S = 10  # how long a request that should not wait may take before the test fails


class HeldCompile:
    """xgrammar's compile, held for schemas titled in ``held`` until released."""

    def __init__(self, real) -> None:
        self.real = real
        self.calls: dict[str, int] = {}
        self.held: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}

    def hold(self, title: str) -> None:
        self.held[title], self.started[title] = threading.Event(), threading.Event()

    def release_all(self) -> None:
        for event in self.held.values():
            event.set()

    def __call__(self, compiler_, strict: bool, schema: dict):
        title = schema.get("title", "")
        self.calls[title] = self.calls.get(title, 0) + 1
        if title in self.held:
            self.started[title].set()
            assert self.held[title].wait(60)
        return self.real(compiler_, strict, schema)


@pytest.fixture
def held(monkeypatch):
    held = HeldCompile(compiler._compile)
    monkeypatch.setattr(compiler, "_compile", held)
    yield held
    held.release_all()


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "abuse", "schema": schema}}


def titled(title: str) -> dict:
    return schema_format({"title": title, "type": "object",
                          "properties": {"a": {"type": "integer"}}, "required": ["a"]})


def chat(served, response_format: dict | None = None, timeout: float = 60,
         raw: bytes | None = None) -> httpx.Response:
    body = {"model": served.model, "messages": ASK, "max_tokens": 4, "temperature": 0}
    if response_format is not None:
        body["response_format"] = response_format
    content = raw or json.dumps(body, separators=(",", ":")).encode()
    return httpx.post(served.url + "/v1/chat/completions", content=content,
                      headers={"content-type": "application/json"}, timeout=timeout)


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_a_schema_nested_900_deep_is_a_400_naming_its_depth(tiny_served) -> None:
    schema: dict = {"type": "integer"}
    for _ in range(900):
        schema = {"type": "array", "items": schema}
    error = error_of(chat(tiny_served, schema_format(schema)))
    assert error["param"] == "response_format"
    assert "nested more than 100 levels deep" in error["message"]


def test_a_body_too_deep_to_read_is_a_400_saying_so(tiny_served) -> None:
    levels = 30_000  # what fits the fixture's 64 KiB body limit; a parser stops far sooner
    raw = (f'{{"model":"{tiny_served.model}","messages":{json.dumps(ASK)},'
           '"response_format":{"type":"json_schema","json_schema":{"name":"deep",'
           f'"schema":{{"enum":[{"[" * levels}{"]" * levels}]}}}}}}}}').encode()
    error = error_of(chat(tiny_served, raw=raw))
    assert "the request body is nested too deeply" in error["message"]


@pytest.mark.parametrize(("schema", "words"), [
    ({"enum": list(range(MAX_ENUM_VALUES + 1))},
     [f"hold {MAX_ENUM_VALUES + 1} values", f"at most {MAX_ENUM_VALUES}"]),
    ({"type": "object", "properties": {f"p{i}": True for i in range(MAX_SUBSCHEMAS)}},
     [f"more than {MAX_SUBSCHEMAS} sub-schemas"]),
    ({"const": "x" * (MAX_LITERAL_CHARS + 1)},
     [f"hold more than {MAX_LITERAL_CHARS} characters"]),
])
def test_a_schema_too_large_is_a_400_naming_what(tiny_served, held, schema, words) -> None:
    error = error_of(chat(tiny_served, schema_format(schema)))
    assert error["param"] == "response_format"
    for word in words:
        assert word in error["message"]
    assert not held.calls  # refused before any compile


def test_a_compile_past_the_time_limit_is_a_400_and_is_not_started_again(
        tiny_served, held, monkeypatch) -> None:
    grammars = tiny_served.llm.engine.grammars
    monkeypatch.setattr(grammars, "compile_timeout_s", 0.3)
    held.hold("abuse-slow")
    for _ in range(3):
        error = error_of(chat(tiny_served, titled("abuse-slow"), timeout=WAIT_S))
        assert "response_format: the schema took too long to compile" in error["message"]
    assert held.calls["abuse-slow"] == 1
    held.release_all()
    assert _eventually(lambda: chat(tiny_served, titled("abuse-slow")).status_code == 200)
    assert held.calls["abuse-slow"] == 1  # the compile that ran on was cached


def test_while_a_slow_schema_compiles_other_requests_complete(tiny_served, held) -> None:
    held.hold("abuse-blocking")
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(chat, tiny_served, titled("abuse-blocking"))
        assert held.started["abuse-blocking"].wait(WAIT_S)
        assert chat(tiny_served, {"type": "json_object"}, timeout=WAIT_S).status_code == 200
        assert chat(tiny_served, timeout=WAIT_S).status_code == 200
        assert chat(tiny_served, titled("abuse-other"), timeout=WAIT_S).status_code == 200
        assert not slow.done()
        held.release_all()
        assert slow.result(60).status_code == 200
    assert tiny_served.worker.kv_stats().num_used == 0


def test_more_slow_schemas_than_the_server_has_threads_hold_up_no_other_request(
        tiny_served, held) -> None:
    # More than asyncio's default executor has threads (at most 32): a compile waited for
    # on one of them would leave none for the json_object request's checks.
    titles = [f"abuse-crowd-{i}" for i in range(40)]
    for title in titles:
        held.hold(title)
    with ThreadPoolExecutor(len(titles)) as pool:
        slow = [pool.submit(chat, tiny_served, titled(title)) for title in titles]
        assert all(held.started[title].wait(WAIT_S) for title in titles)
        assert chat(tiny_served, {"type": "json_object"}, timeout=WAIT_S).status_code == 200
        held.release_all()
        # Released at once, some find the queue full (the fixture allows 8 waiting).
        assert {f.result(60).status_code for f in slow} <= {200, 429}
    assert tiny_served.worker.kv_stats().num_used == 0


def test_schemas_still_compiling_past_the_limit_turn_new_ones_away_with_429(
        tiny_served, held, monkeypatch) -> None:
    monkeypatch.setattr(tiny_served.llm.engine.grammars, "compile_timeout_s", 0.1)
    for i in range(MAX_OVERDUE_COMPILES):
        held.hold(f"abuse-overdue-{i}")
        error_of(chat(tiny_served, titled(f"abuse-overdue-{i}"), timeout=WAIT_S))
    response = chat(tiny_served, titled("abuse-new"), timeout=WAIT_S)
    error = error_of(response, 429)
    assert "schemas that took too long to compile are still compiling" in error["message"]
    assert response.headers["retry-after"] == "1"
    assert chat(tiny_served, timeout=WAIT_S).status_code == 200
    held.release_all()
    assert _eventually(lambda: chat(tiny_served, titled("abuse-new")).status_code == 200)


def _eventually(check) -> bool:
    pause = threading.Event()
    for _ in range(WAIT_S * 10):
        if check():
            return True
        pause.wait(0.1)
    return False
