"""ChatSettings' JSON mode: validated, round-tripped, and sent to the engine or a server."""

from __future__ import annotations

import json

import pytest

from desktop_app.data.json_mode import openai_response_format, reply_label
from desktop_app.data.settings import ChatSettings
from desktop_app.services.remote_request import request_body

SCHEMA = {"title": "Answer", "type": "object", "properties": {"a": {"type": "integer"}}}


def test_json_mode_becomes_the_engine_s_response_format() -> None:
    assert ChatSettings().to_sampling_params().response_format is None
    fmt = ChatSettings(json_mode=True).to_sampling_params().response_format
    assert fmt.type == "json_object"
    fmt = ChatSettings(json_mode=True, json_schema=json.dumps(SCHEMA)).to_sampling_params(
    ).response_format
    assert (fmt.type, fmt.schema, fmt.name) == ("json_schema", SCHEMA, "Answer")
    # Off, a schema's text is kept as it is, unread.
    assert ChatSettings(json_schema="{not json").to_sampling_params().response_format is None


@pytest.mark.parametrize(("text", "words"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"type": "string", "format": "hostname"}', "hostname"),
])
def test_a_bad_schema_is_a_value_error_naming_the_field(text, words) -> None:
    with pytest.raises(ValueError, match="ChatSettings.json_schema") as info:
        ChatSettings(json_mode=True, json_schema=text)
    assert words in str(info.value)


def test_json_mode_round_trips_and_a_bad_stored_value_falls_back() -> None:
    settings = ChatSettings(json_mode=True, json_schema=json.dumps(SCHEMA))
    assert ChatSettings.from_dict(settings.to_dict()) == settings
    dropped: list[str] = []
    loaded = ChatSettings.from_dict({"json_mode": "yes"}, strict=False, dropped=dropped)
    assert loaded.json_mode is False and dropped == ["json_mode"]


def test_a_remote_server_gets_openai_s_response_format() -> None:
    params = ChatSettings(json_mode=True, json_schema=json.dumps(SCHEMA)).to_sampling_params()
    body = request_body("m", [], params, 1, None)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "Answer", "schema": SCHEMA, "strict": True}}
    assert openai_response_format(ChatSettings(json_mode=True).to_sampling_params()
                                  .response_format) == {"type": "json_object"}
    assert "response_format" not in request_body("m", [], ChatSettings().to_sampling_params(),
                                                 1, None)


def test_the_reply_label() -> None:
    assert reply_label({"response_format": "json_object"}) == "JSON"
    assert reply_label({"response_format": "json_schema"}) == "JSON (schema)"
    assert reply_label({}) == reply_label(None) == ""
