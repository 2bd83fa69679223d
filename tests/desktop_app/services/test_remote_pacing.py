"""remote_pacing: a cut candidate's new run against the text already on screen, and the
session's memory of servers that run one request at a time."""

from __future__ import annotations

import httpx2 as httpx
import openai

from desktop_app.data.pacing_note import METRIC
from desktop_app.services.remote_pacing import RemoteMetrics, Replay, SerialServers, is_busy


def test_a_new_run_that_repeats_the_shown_text_streams_only_what_is_new():
    replay = Replay("Once upon a")
    assert [replay.take(t) for t in ("Once", " upon", " a", " time", ".")] == [
        "", "", "", " time", "."]
    assert replay.text == "Once upon a time." and not replay.diverged


def test_a_new_run_crossing_the_end_of_the_shown_text_streams_the_rest():
    replay = Replay("Once upon")
    assert replay.take("Once up") == "" and replay.text == "Once upon"
    assert replay.take("on a time") == " a time"
    assert replay.text == "Once upon a time"


def test_a_new_run_that_differs_streams_nothing_more_and_becomes_the_text():
    replay = Replay("Once upon a time")
    assert replay.take("Once") == ""
    assert replay.take(" there") == "" and replay.diverged
    assert replay.take(" was a cat that was long") == ""
    # Until it is longer, the screen's text stands; then the new run is the reply.
    assert replay.text == "Once there was a cat that was long"


def test_servers_are_remembered_by_url():
    servers = SerialServers()
    assert not servers.knows("http://a:8000/v1")
    servers.remember("http://a:8000/v1")
    assert servers.knows("http://a:8000/v1") and not servers.knows("http://b:8000/v1")


def test_busy_is_503_or_429():
    request = httpx.Request("POST", "http://a/v1/chat/completions")

    def status(code: int) -> openai.APIStatusError:
        return openai.APIStatusError("x", response=httpx.Response(code, request=request),
                                     body=None)

    assert is_busy(status(503)) and is_busy(status(429))
    assert not is_busy(status(500)) and not is_busy(status(400))
    assert not is_busy(ConnectionError("reset"))


def test_the_metrics_field_is_the_footer_notes_key():
    assert RemoteMetrics.__dataclass_fields__[METRIC].default is False
