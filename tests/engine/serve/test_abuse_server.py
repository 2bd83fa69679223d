"""Clients that misbehave at the server level: text that is not Unicode, request heads
sent a byte at a time, a flood of connections, the key-less reading of what a keyed
server describes of itself, and a client that leaves before its reply. After each, the
server answers a normal request and the engine holds no block."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx2 as httpx
import pytest

from engine.cli import main
from engine.serve.app import ServeSettings
from engine.serve.server import free_port
from tests.engine.serve.conftest import API_KEY, Served, tiny_llm_at

HEAD_TIMEOUT_S = 1.5
LIMIT = 4


@pytest.fixture(scope="module")
def abuse_served(tiny_llm):
    served = Served(tiny_llm, ServeSettings(head_timeout_s=HEAD_TIMEOUT_S))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def flood_served(tiny_path):
    # Its own engine (two workers must never step one LLM), and its own server: the idle
    # keep-alive connections of other tests' clients count against so small a limit.
    served = Served(tiny_llm_at(tiny_path), ServeSettings(limit_concurrency=LIMIT))
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


# -- c. slow request heads, and a flood of connections ---------------------------------------
def closed_after(sock: socket.socket, dribble: bytes, limit_s: float) -> float | None:
    """Seconds until the server closed ``sock`` while it sent ``dribble`` a byte at a time
    (then nothing); None if it was still open after ``limit_s``."""
    sock.settimeout(0.05)
    start = time.monotonic()
    pending = list(dribble)
    while time.monotonic() - start < limit_s:
        try:
            if pending:
                sock.send(bytes([pending.pop(0)]))
            if sock.recv(1024) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - start
    return None


def test_a_dribbled_request_head_is_dropped_within_the_bound(abuse_served):
    host, port = abuse_served.server.host, abuse_served.server.port
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    with socket.create_connection((host, port)) as sock:
        took = closed_after(sock, head, HEAD_TIMEOUT_S + 5)
    assert took is not None, "the server kept a connection that never finished its head"
    assert HEAD_TIMEOUT_S * 0.8 <= took <= HEAD_TIMEOUT_S + 2
    with socket.create_connection((host, port)) as sock:  # one that sends nothing at all
        took = closed_after(sock, b"", HEAD_TIMEOUT_S + 5)
    assert took is not None and took <= HEAD_TIMEOUT_S + 2
    assert_serves_on(abuse_served)


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"<closed>"
        assert not data.endswith(b"<closed>"), data
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_the_bound_is_on_the_head_alone(abuse_served):
    # A slow body, and a pause between two requests on one connection, are not a slow
    # head: both outlast the bound and are served.
    body = json.dumps({"model": abuse_served.model, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi " * 40}]}).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    with socket.create_connection((abuse_served.server.host, abuse_served.server.port)) as sock:
        sock.settimeout(30)
        sock.sendall(head)
        pieces = 8
        for i in range(pieces):  # the body over 1.5 bounds
            sock.sendall(body[i * len(body) // pieces:(i + 1) * len(body) // pieces])
            time.sleep(HEAD_TIMEOUT_S * 1.5 / pieces)
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(HEAD_TIMEOUT_S * 1.3)  # idle, inside uvicorn's keep-alive
        sock.sendall(head + body)
        assert read_response(sock).startswith(b"HTTP/1.1 200")
    assert_serves_on(abuse_served)


def test_a_flood_of_connections_gets_503(flood_served):
    host, port = flood_served.server.host, flood_served.server.port
    idle = [socket.create_connection((host, port)) for _ in range(LIMIT - 1)]
    try:
        time.sleep(0.2)  # accepted by the server
        response = httpx.get(flood_served.url + "/v1/models", timeout=10)
        assert response.status_code == 503
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 10
    while httpx.get(flood_served.url + "/health").status_code == 503:
        assert time.monotonic() < deadline, "the closed connections were never let go"
        time.sleep(0.05)
    assert_serves_on(flood_served)


def test_the_bounds_are_checked(capsys):
    for field, value in [("limit_concurrency", 1), ("head_timeout_s", 0),
                         ("keep_alive_s", -1.0)]:
        with pytest.raises(ValueError, match=field):
            ServeSettings(**{field: value})
    assert main(["serve", "--limit-concurrency", "1", "--port", str(free_port()),
                 "--model", "/no/such/model"]) == 2
    assert "limit_concurrency must be >= 2" in capsys.readouterr().err


# -- d. the key on what the server says of itself --------------------------------------------
@pytest.mark.parametrize("path", ["/metrics", "/openapi.json", "/docs", "/redoc",
                                  "/docs/oauth2-redirect"])
def test_the_key_guards_metrics_and_the_api_description(keyed_served, path):
    url = keyed_served.url + path
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"authorization": "Bearer wrong"}).status_code == 401
    response = httpx.get(url, headers={"authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 200
    assert response.json()["paths"] if path == "/openapi.json" else response.text
    # /health stays open: a liveness probe carries no key.
    assert httpx.get(keyed_served.url + "/health").status_code == 200
    assert_serves_on(keyed_served, api_key=API_KEY)


# -- e. a client that leaves before its non-streamed reply -----------------------------------
def test_a_client_leaving_a_non_streamed_reply_is_one_log_line(abuse_served, caplog):
    # uvicorn's loggers do not propagate to the root, where caplog listens.
    uvicorn_log = logging.getLogger("uvicorn")
    uvicorn_log.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    body = json.dumps({"model": abuse_served.model, "max_tokens": 480, "n": 4,
                       "ignore_eos": True, "temperature": 0,
                       "messages": [{"role": "user", "content": "go"}]}).encode()
    try:
        with socket.create_connection((abuse_served.server.host,
                                       abuse_served.server.port)) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(body) + body)
            deadline = time.monotonic() + 30
            while not abuse_served.worker.kv_stats().num_used:
                assert time.monotonic() < deadline, "the request never started"
                time.sleep(0.001)
        deadline = time.monotonic() + 10
        while "client left" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
        assert_serves_on(abuse_served)
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "Traceback" not in caplog.text
    [line] = [r for r in caplog.records if "client left" in r.getMessage()]
    assert line.levelno == logging.INFO and "cancelled" in line.getMessage()
