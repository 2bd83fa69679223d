"""Clients that misbehave at the server level: text that is not Unicode, request heads
sent a byte at a time, a flood of connections, the key-less reading of what a keyed
server describes of itself, and a client that leaves before its reply. After each, the
server answers a normal request and the engine holds no block."""

from __future__ import annotations

import time

import httpx2 as httpx
import pytest

from engine.serve.app import ServeSettings
from tests.engine.serve.conftest import Served


@pytest.fixture(scope="module")
def abuse_served(tiny_llm):
    served = Served(tiny_llm, ServeSettings())
    yield served
    served.stop()


def assert_serves_on(served, api_key: str = "unused") -> None:
    with served.client(api_key=api_key) as client:
        reply = client.chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            temperature=0)
    assert reply.usage.completion_tokens == 4
    deadline = time.monotonic() + 10
    while served.worker.kv_stats().num_used and time.monotonic() < deadline:
        time.sleep(0.02)
    assert served.worker.kv_stats().num_used == 0


def post_raw(served, path: str, body: str | bytes) -> httpx.Response:
    content = body.encode() if isinstance(body, str) else body
    return httpx.post(served.url + path, content=content, timeout=60,
                      headers={"content-type": "application/json"})


# -- a. lone surrogates --------------------------------------------------------------------
# JSON text with "\ud800" escapes written out: json.dumps of a Python str would escape the
# backslash. Each names the field that holds the surrogate.
CHAT = '{"model": "%s", "max_tokens": 2, "messages": %s%s}'
USER = '[{"role": "user", "content": "hi"}]'
SURROGATE_CASES = [
    ("/v1/chat/completions", CHAT % ("{m}", '[{"role": "user", "content": "a\\ud800b"}]', ""),
     "messages.0.content"),
    ("/v1/chat/completions",
     CHAT % ("{m}", '[{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]',
             ""), "messages.0.content.0.text"),
    ("/v1/chat/completions", CHAT % ("{m}", USER, ', "stop": ["x", "\\ud83d"]'), "stop.1"),
    ("/v1/chat/completions",
     CHAT % ("{m}", USER, ', "tools": [{"type": "function", "function": {"name": "f", '
             '"description": "\\ud800", "parameters": {"type": "object"}}}]'),
     "tools.0.function.description"),
    ("/v1/chat/completions",
     CHAT % ("{m}", '[{"role": "user", "content": "hi"}, {"role": "assistant", '
             '"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", '
             '"arguments": "{\\"a\\": \\"\\\\ud800\\"}x\\ud800"}}]}]', ""),
     "messages.1.tool_calls.0.function.arguments"),
    ("/v1/chat/completions",
     CHAT % ("{m}", USER, ', "response_format": {"type": "json_schema", "json_schema": '
             '{"name": "s", "schema": {"type": "object", "properties": {"\\ud800": {}}}}}'),
     "response_format.json_schema.schema.properties"),
    ("/v1/chat/completions", CHAT % ("{m}", USER, ', "user": "\\ud800"'), "user"),
    ("/v1/completions", '{"model": "{m}", "max_tokens": 2, "prompt": "a\\ud800"}', "prompt"),
    ("/v1/completions", '{"model": "{m}", "max_tokens": 2, "prompt": "a", "suffix": '
     '"\\udc00"}', "suffix"),
]


@pytest.mark.parametrize(("path", "body", "field"), SURROGATE_CASES)
def test_a_lone_surrogate_is_a_400_naming_the_field(abuse_served, path, body, field):
    response = post_raw(abuse_served, path, body.replace("{m}", abuse_served.model))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (field, "invalid_value")
    assert error["message"].startswith(f"{field}: ") and "surrogate" in error["message"]
    assert_serves_on(abuse_served)


def test_utf8_bytes_of_a_surrogate_are_refused_and_a_pair_is_text(abuse_served):
    # Bytes that encode a surrogate as UTF-8 would (not valid UTF-8) come to the same.
    head = f'{{"model": "{abuse_served.model}", "max_tokens": 2, "prompt": "a'.encode()
    response = post_raw(abuse_served, "/v1/completions", head + b'\xed\xa0\x80"}')
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    pair = CHAT % (abuse_served.model, '[{"role": "user", "content": "\\ud83d\\ude00"}]', "")
    assert post_raw(abuse_served, "/v1/chat/completions", pair).status_code == 200
    assert_serves_on(abuse_served)
