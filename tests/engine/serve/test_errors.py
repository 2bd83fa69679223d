"""Bad requests get OpenAI-shaped error objects with the right status, never a traceback,
and the server goes on serving; the key check; the loopback-only default."""

from __future__ import annotations

import httpx2 as httpx
import openai
import pytest

from engine.cli import main
from engine.serve.server import UnsafeHostError, check_host, is_loopback
from tests.engine.serve.conftest import API_KEY


def post(served, path: str, body=None, content: bytes | None = None, headers=None):
    headers = {"content-type": "application/json", **(headers or {})}
    if content is None:
        return httpx.post(served.url + path, json=body, headers=headers, timeout=60)
    return httpx.post(served.url + path, content=content, headers=headers, timeout=60)


def assert_error(response, status: int, *words: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"]
    return error


def chat(served, **fields) -> dict:
    return {"model": served.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, **fields}


def test_malformed_json_is_400(tiny_served):
    assert_error(post(tiny_served, "/v1/chat/completions", content=b'{"model": '), 400, "JSON")
    assert_error(post(tiny_served, "/v1/chat/completions", content=b"[1, 2]"), 400, "object")


def test_unknown_model_is_404(tiny_served):
    error = assert_error(post(tiny_served, "/v1/chat/completions",
                              chat(tiny_served, model="gpt-9")), 404, "gpt-9")
    assert error["code"] == "model_not_found" and error["param"] == "model"


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -0.5), ("temperature", 9), ("top_p", 0), ("top_p", 1.5), ("n", 0),
    ("n", 1000), ("max_tokens", 0), ("max_tokens", "many"), ("stop", ["a", "b", "c", "d", "e"]),
    ("messages", []), ("messages", [{"role": "wizard", "content": "x"}]),
])
def test_bad_sampling_values_are_422_naming_the_field(tiny_served, field, value):
    error = assert_error(post(tiny_served, "/v1/chat/completions",
                              chat(tiny_served, **{field: value})), 422)
    assert field in error["message"]


@pytest.mark.parametrize(("field", "value"), [
    ("tools", [{"type": "function", "function": {"name": "f", "strict": True}}]),
    ("presence_penalty", 0.5), ("frequency_penalty", 1.0),
])
def test_unsupported_fields_are_400_not_ignored(tiny_served, field, value):
    assert_error(post(tiny_served, "/v1/chat/completions",
                      chat(tiny_served, **{field: value})), 400, field.split("_")[0])


def test_prompt_longer_than_the_context_is_400(tiny_served):
    long = "word " * 600  # the tiny model's context is 512 tokens
    assert_error(post(tiny_served, "/v1/chat/completions",
                      chat(tiny_served, messages=[{"role": "user", "content": long}])),
                 400, "context")
    assert_error(post(tiny_served, "/v1/completions",
                      {"model": tiny_served.model, "prompt": [10**9]}), 400, "token ids")


def test_body_over_the_limit_is_413(tiny_served):
    big = chat(tiny_served, messages=[{"role": "user", "content": "x" * (65 * 1024)}])
    assert_error(post(tiny_served, "/v1/chat/completions", big), 413, "larger than")


def test_unknown_route_and_method_are_error_objects(tiny_served):
    assert_error(httpx.get(tiny_served.url + "/v1/nothing"), 404)
    assert_error(httpx.get(tiny_served.url + "/v1/chat/completions"), 405)


def test_a_full_waiting_queue_is_429_with_retry_after(tiny_served):
    metrics = tiny_served.metrics
    metrics.waiting += 8  # as if eight requests were waiting for their first token
    try:
        response = post(tiny_served, "/v1/chat/completions", chat(tiny_served))
    finally:
        metrics.waiting -= 8
    assert_error(response, 429, "waiting")
    assert response.headers["retry-after"] == "1"


def test_the_server_serves_on_after_errors(tiny_served):
    reply = tiny_served.client().chat.completions.create(
        model=tiny_served.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        temperature=0)
    assert reply.usage.completion_tokens == 4
    assert tiny_served.worker.kv_stats().num_used == 0


def test_the_key_is_checked(keyed_served):
    with pytest.raises(openai.AuthenticationError):
        keyed_served.client(api_key="wrong").models.list()
    assert_error(httpx.get(keyed_served.url + "/v1/models"), 401, "API key")
    assert [m.id for m in keyed_served.client(api_key=API_KEY).models.list().data] == [
        keyed_served.model]
    assert httpx.get(keyed_served.url + "/health").status_code == 200


def test_loopback_only_without_a_key():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    assert not is_loopback("my-host.example")
    check_host("127.0.0.1", None)
    check_host("0.0.0.0", "a-key")
    with pytest.raises(UnsafeHostError, match="--api-key"):
        check_host("0.0.0.0", None)


def test_folio_serve_refuses_a_port_in_use_before_loading(capsys):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert main(["serve", "--port", str(port), "--model", "/no/such/model"]) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err


def test_folio_serve_refuses_an_open_host_before_loading(capsys):
    # No model is loaded: the refusal comes first, in well under a second.
    assert main(["serve", "--host", "0.0.0.0", "--model", "/no/such/model"]) == 2
    assert "--api-key" in capsys.readouterr().err


def _has_ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_serving_on_ipv6_loopback(tiny_path, capsys):
    from engine import EngineWorker
    from engine.serve.server import check_port_free, free_port, start_in_background
    from tests.engine.serve.conftest import tiny_llm_at

    check_port_free(free_port("::1"), "::1")  # a free IPv6 port is free
    worker = EngineWorker(tiny_llm_at(tiny_path)).start()
    try:
        server = start_in_background(worker, host="::1", port=free_port("::1"))
        try:
            assert server.url == f"http://[::1]:{server.port}"
            assert httpx.get(server.url + "/health").json()["status"] == "ok"
            with pytest.raises(OSError, match=f"port {server.port} on ::1 is already in use"):
                check_port_free(server.port, "::1")
            assert main(["serve", "--host", "::1", "--port", str(server.port),
                         "--model", "/no/such/model"]) == 2
            assert f"port {server.port} on ::1 is already in use" in capsys.readouterr().err
        finally:
            server.stop()
    finally:
        worker.shutdown()


def test_a_port_in_use_is_named_for_either_family():
    import socket

    from engine.serve.server import check_port_free

    families = [(socket.AF_INET, "127.0.0.1")]
    if _has_ipv6_loopback():
        families.append((socket.AF_INET6, "::1"))
    for family, host in families:
        with socket.socket(family) as sock:
            sock.bind((host, 0))
            sock.listen()
            port = sock.getsockname()[1]
            with pytest.raises(OSError, match=f"port {port} on {host} is already in use"):
                check_port_free(port, host)
        check_port_free(port, host)  # and free again once closed
    with pytest.raises(OSError, match="does not resolve"):
        check_port_free(8000, "no-such-host.invalid")
