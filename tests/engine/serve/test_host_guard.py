"""DNS rebinding and CORS: a foreign Host gets a 403 on every route, streaming ones
included, before anything runs; loopback names and the bound address pass, with any port
or none; only --allowed-origins get CORS headers (preflights too), other cross-origin
requests a 403."""

from __future__ import annotations

import httpx2 as httpx
import pytest
from fastapi.routing import APIRoute

from engine.cli import main
from engine.serve.app import ServeSettings
from engine.serve.host_guard import AccessPolicy, host_name
from tests.engine.serve.conftest import Served, tiny_llm_at

EVIL = "evil.example:8765"
ORIGINS = "http://localhost:3000, http://app.example:*"
CORS_HEADERS = ("access-control-allow-origin", "access-control-allow-methods",
                "access-control-allow-headers")


@pytest.fixture(scope="module")
def open_served(tiny_path):
    # Its own engine: two workers must never step one LLM.
    served = Served(tiny_llm_at(tiny_path), ServeSettings(allowed_hosts="box.local",
                                                          allowed_origins=ORIGINS))
    yield served
    served.stop()


def request(served, method: str, path: str, host: str | None = None, body=None, **headers):
    if host is not None:
        headers["host"] = host
    return httpx.request(method, served.url + path, json=body, headers=headers, timeout=60)


def chat_body(served, stream: bool = False) -> dict:
    return {"model": served.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, "stream": stream}


def text_body(served, stream: bool = False) -> dict:
    return {"model": served.model, "prompt": "hi", "max_tokens": 4, "stream": stream}


def every_route(served) -> list[tuple[str, str, dict | None]]:
    """(method, path, body) for each route of the app, and the streamed forms of the two
    completions routes: a route added later is covered without editing this test."""
    calls = []
    for route in served.server.app.routes:
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            if method == "HEAD":
                continue
            body = None
            if isinstance(route, APIRoute) and route.path == "/v1/chat/completions":
                body = chat_body(served)
            elif isinstance(route, APIRoute) and route.path == "/v1/completions":
                body = text_body(served)
            calls.append((method, route.path, body))
    calls += [("POST", "/v1/chat/completions", chat_body(served, stream=True)),
              ("POST", "/v1/completions", text_body(served, stream=True)),
              ("GET", "/no/such/route", None)]
    return calls


def assert_refused(response, code: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == "permission_error"
    assert not any(h in response.headers for h in CORS_HEADERS)


@pytest.mark.parametrize(("header", "name"), [
    ("localhost", "localhost"), ("LocalHost:8000", "localhost"), ("127.0.0.1:1", "127.0.0.1"),
    ("[::1]:8000", "::1"), ("[::1]", "::1"), ("localhost.", "localhost"),
    ("localhost:", "localhost"), ("evil.example:8765", "evil.example"),
    ("::1", None), ("[::1", None), ("a:b", None), ("", None), ("localhost:80:80", None),
])
def test_host_names(header, name):
    assert host_name(header) == name


def test_which_hosts_a_policy_accepts():
    loopback = AccessPolicy("127.0.0.1")
    for host in ("localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "[::1]",
                 "[0:0:0:0:0:0:0:1]:8000", None):
        assert loopback.host_allowed(host), host
    for host in (EVIL, "evil.example", "127.0.0.1.evil.example", "192.168.1.5:8000",
                 "localhost.evil.example", "box.local", "", "[::1"):
        assert not loopback.host_allowed(host), host
    lan = AccessPolicy("192.168.1.5", allowed_hosts=("Box.Local",))
    assert lan.host_allowed("192.168.1.5:8000") and lan.host_allowed("box.local:8000")
    assert lan.host_allowed("localhost") and not lan.host_allowed("10.0.0.7:8000")
    assert not lan.host_allowed(EVIL)
    # A wildcard bind answers on every address: any IP literal, but still no foreign name.
    for bind in ("0.0.0.0", "::"):
        everywhere = AccessPolicy(bind, allowed_hosts="box.local")
        assert everywhere.host_allowed("10.0.0.7:8000") and everywhere.host_allowed("[fe80::1]")
        assert everywhere.host_allowed("box.local") and not everywhere.host_allowed(EVIL)


def test_origins_and_names_are_checked_when_configured():
    policy = AccessPolicy(allowed_origins=ORIGINS + ", http://x.example/")
    assert policy.allowed_origins == ("http://localhost:3000", "http://app.example:*",
                                      "http://x.example")
    assert policy.origin_allowed("http://localhost:3000")
    assert policy.origin_allowed("http://app.example:5173")
    assert not policy.origin_allowed("http://localhost:3001")
    assert not policy.origin_allowed("http://evil.example")
    assert not AccessPolicy().origin_allowed("http://localhost:3000")  # none by default
    assert AccessPolicy(allowed_origins="*").origin_allowed("https://any.example")
    with pytest.raises(ValueError, match="allowed_origins"):
        AccessPolicy(allowed_origins="localhost:3000")
    with pytest.raises(ValueError, match="allowed_hosts"):
        ServeSettings(allowed_hosts="http://box.local")
    with pytest.raises(ValueError, match="allowed_hosts"):
        ServeSettings(allowed_hosts="box.local:8000")


def test_a_foreign_host_is_refused_on_every_route(tiny_served):
    calls = every_route(tiny_served)
    paths = {path for _, path, _ in calls}
    assert {"/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions",
            "/openapi.json", "/docs"} <= paths
    finished = tiny_served.metrics.requests.labels("chat", "finished")._value.get()
    for method, path, body in calls:
        for host in (EVIL, "evil.example", "localhost.evil.example:8000"):
            response = request(tiny_served, method, path, host, body)
            assert_refused(response, "host_not_allowed")
            assert "evil.example" in response.json()["error"]["message"]
    # Nothing reached the engine.
    assert tiny_served.metrics.requests.labels("chat", "finished")._value.get() == finished
    assert tiny_served.worker.kv_stats().num_used == 0


def test_loopback_names_pass_with_or_without_the_port(tiny_served):
    port = tiny_served.server.port
    for host in ("localhost", f"localhost:{port}", "127.0.0.1", f"127.0.0.1:{port}",
                 "[::1]", f"[::1]:{port}", f"localhost:{port + 1}"):
        assert request(tiny_served, "GET", "/health", host).status_code == 200, host
    streamed = request(tiny_served, "POST", "/v1/chat/completions", f"localhost:{port}",
                       chat_body(tiny_served, stream=True))
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")


def test_names_passed_with_allowed_hosts_pass(open_served):
    assert request(open_served, "GET", "/v1/models", "box.local:8000").status_code == 200
    assert_refused(request(open_served, "GET", "/v1/models", EVIL), "host_not_allowed")


def test_cross_origin_requests_are_refused_by_default(tiny_served):
    for method, path, body in every_route(tiny_served):
        response = request(tiny_served, method, path, body=body, origin="http://evil.example")
        assert_refused(response, "origin_not_allowed")
    preflight = request(tiny_served, "OPTIONS", "/v1/chat/completions",
                        origin="http://localhost:3000",
                        **{"access-control-request-method": "POST"})
    assert_refused(preflight, "origin_not_allowed")
    # The server's own pages (FastAPI's /docs) send their own origin: same-origin, no CORS.
    own = request(tiny_served, "GET", "/v1/models", origin=tiny_served.url)
    assert own.status_code == 200 and "access-control-allow-origin" not in own.headers


def test_an_allowed_origin_gets_cors_headers(open_served):
    origin = "http://localhost:3000"
    preflight = request(open_served, "OPTIONS", "/v1/chat/completions", origin=origin, **{
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os"})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == origin
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "x-stainless-os" in preflight.headers["access-control-allow-headers"]
    assert "origin" in preflight.headers["vary"].lower()
    for method, path, body in every_route(open_served):
        response = request(open_served, method, path, body=body, origin="http://app.example:5173")
        assert response.headers.get("access-control-allow-origin") == \
            "http://app.example:5173", (method, path)
        assert response.status_code != 403
    streamed = request(open_served, "POST", "/v1/completions", body=text_body(
        open_served, stream=True), origin=origin)
    assert streamed.status_code == 200 and streamed.headers["access-control-allow-origin"] == \
        origin
    for other in ("http://localhost:3001", "https://localhost:3000", "null"):
        assert_refused(request(open_served, "POST", "/v1/completions",
                               body=text_body(open_served), origin=other), "origin_not_allowed")
        assert_refused(request(open_served, "OPTIONS", "/v1/completions", origin=other, **{
            "access-control-request-method": "POST"}), "origin_not_allowed")


def test_folio_serve_refuses_a_bad_origin_before_loading(capsys):
    assert main(["serve", "--allowed-origins", "localhost:3000", "--model", "/no/such"]) == 2
    assert "allowed_origins" in capsys.readouterr().err
