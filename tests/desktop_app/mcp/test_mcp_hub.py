"""McpHub against real MCP servers: over stdio (a process of tests/…/mcp_servers.py) and
over Streamable HTTP on loopback."""

from __future__ import annotations

import json
import queue
import time

import pytest

from desktop_app.mcp.config import parse_mcp_json
from desktop_app.mcp.events import FAILED, READY, CallResult, ServerStatus
from desktop_app.mcp.hub import McpHub
from tests.desktop_app.mcp.mcp_servers import serve_http, stdio_entry

WAIT_S = 30


class Recorder:
    def __init__(self) -> None:
        self.events: queue.Queue = queue.Queue()
        self.seen: list = []  # events from any server, in order: each is matched once

    def __call__(self, event) -> None:
        self.events.put(event)

    def status(self, name: str, state: str) -> ServerStatus:
        return self._next(lambda e: isinstance(e, ServerStatus) and e.name == name
                          and e.state == state)

    def result(self, call_id: str) -> CallResult:
        return self._next(lambda e: isinstance(e, CallResult) and e.call_id == call_id)

    def _next(self, match):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for i, event in enumerate(self.seen):
                if match(event):
                    return self.seen.pop(i)
            try:
                self.seen.append(self.events.get(timeout=0.1))
            except queue.Empty:
                continue
        raise AssertionError("the event never came")


@pytest.fixture
def hub():
    recorder = Recorder()
    hub = McpHub(recorder)
    hub.recorder = recorder
    yield hub
    hub.shutdown()


def config(**servers):
    return parse_mcp_json(json.dumps({"mcpServers": servers}))


def test_stdio_server_lists_tools_and_runs_a_call(hub):
    hub.configure(config(demo=stdio_entry(env={"DEMO_TOKEN": "hunter2-secret"})))
    ready = hub.recorder.status("demo", READY)
    assert {t.name for t in ready.tools} >= {"add", "token", "fail", "crash", "sleep"}
    add = next(t for t in ready.tools if t.name == "add")
    assert add.input_schema["properties"].keys() == {"a", "b"}
    hub.call("c1", "demo", "add", {"a": 2, "b": 40})
    assert hub.recorder.result("c1") == CallResult("c1", "42")
    # env reaches the process; the secret never leaves the hub in a result.
    hub.call("c2", "demo", "token", {})
    result = hub.recorder.result("c2")
    assert result.ok and "hunter2-secret" not in result.text and "•••" in result.text


def test_a_tool_error_is_an_error_result_and_the_server_goes_on(hub):
    hub.configure(config(demo=stdio_entry()))
    hub.recorder.status("demo", READY)
    hub.call("bad", "demo", "fail", {"reason": "no disk"})
    result = hub.recorder.result("bad")
    assert not result.ok and result.text.startswith("Error:")
    hub.call("good", "demo", "add", {"a": 1, "b": 1})
    assert hub.recorder.result("good").text == "2"


def test_a_server_that_exits_mid_call_fails_the_call_and_restarts_on_the_next(hub):
    hub.configure(config(demo=stdio_entry()))
    hub.recorder.status("demo", READY)
    hub.call("boom", "demo", "crash", {})
    result = hub.recorder.result("boom")
    assert result.error == "the server exited during the call"
    failed = hub.recorder.status("demo", FAILED)
    assert "exited" in failed.error and "crashing now" in failed.error  # its stderr
    hub.call("again", "demo", "add", {"a": 3, "b": 4})
    assert hub.recorder.result("again").text == "7"


def test_a_call_past_the_timeout_fails_and_later_calls_still_run(hub):
    hub.configure(config(demo=stdio_entry(timeout=0.5)))
    hub.recorder.status("demo", READY)
    started = time.monotonic()
    hub.call("slow", "demo", "sleep", {"seconds": 5})
    result = hub.recorder.result("slow")
    assert "no answer within 0.5 s" in result.error
    assert time.monotonic() - started < 4
    hub.call("next", "demo", "add", {"a": 1, "b": 2})
    assert hub.recorder.result("next").text == "3"


def test_a_server_that_cannot_start_is_failed_and_its_calls_answered(hub):
    hub.configure(config(ghost={"command": "/nonexistent/folio-mcp-server"}))
    failed = hub.recorder.status("ghost", FAILED)
    assert "could not start" in failed.error
    hub.call("c", "ghost", "anything", {})
    assert not hub.recorder.result("c").ok


def test_streamable_http_server_with_headers(hub):
    with serve_http(required_header=("Authorization", "Bearer s3cret-value")) as url:
        hub.configure(config(web={"url": url,
                                  "headers": {"Authorization": "Bearer s3cret-value"}},
                             nokey={"url": url}))
        ready = hub.recorder.status("web", READY)
        assert "add" in {t.name for t in ready.tools}
        hub.call("h1", "web", "add", {"a": 20, "b": 22})
        assert hub.recorder.result("h1").text == "42"
        failed = hub.recorder.status("nokey", FAILED)
        assert "s3cret-value" not in failed.error
        hub.shutdown()


def test_reconfiguring_stops_dropped_servers(hub):
    hub.configure(config(one=stdio_entry(), two=stdio_entry()))
    hub.recorder.status("one", READY)
    hub.recorder.status("two", READY)
    hub.configure(config(one=stdio_entry()))
    hub.recorder.status("two", "stopped")
    hub.call("c", "two", "add", {"a": 1, "b": 2})
    assert "no MCP server named 'two'" in hub.recorder.result("c").error
