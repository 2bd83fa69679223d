"""The tool fields of a chat request: each bad one a 400 that names it; what needs
constrained decoding refused, saying so; a template with no place for tools refused; and
on a model without a tool format, text that looks like a call stays text."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from engine import LLM
from engine.tools.request import InvalidField, tool_request
from tests.engine.serve.conftest import Served
from tests.engine.tools.tool_models import (
    CALL_REPLIES,
    HERMES_TEMPLATE,
    WEATHER_TOOL,
    save_tool_model,
    scripted,
)

USER = {"role": "user", "content": "hi"}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def post(served, **fields) -> httpx.Response:
    body = {"model": served.model, "messages": [USER], "max_tokens": 4, **fields}
    return httpx.post(served.url + "/v1/chat/completions", json=body, timeout=60)


def assert_400(response, field: str, *words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field, error
    assert field in error["message"] and all(w in error["message"] for w in words), error


@pytest.fixture(scope="module")
def no_format_served(tmp_path_factory):
    """A llama-family model whose template takes tools in Hermes' way: Folio has no
    tool format for that pair, so its replies stay text."""
    path = save_tool_model(tmp_path_factory.mktemp("hermes-llama") / "model", "llama",
                           template=HERMES_TEMPLATE)
    llm = LLM(str(path), num_gpu_blocks=128, max_model_len=1024)
    sampler = scripted(llm)
    served = Served(llm)
    yield served, sampler
    served.stop()


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"tools": {"type": "function"}}, "tools", ["list"]),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type", ["function tools only"]),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]},
     "tools.0.function.name", ["letters, digits"]),
    ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools.1.function.name", ["twice"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools.0.function.parameters", ["schema"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "cache": 1}}]},
     "tools.0.function.cache", ["remove it"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]},
     "tools.0.function.strict", ["structured output"]),
    ({"tools": [WEATHER_TOOL], "tool_choice": "always"}, "tool_choice", ["one of"]),
    ({"tool_choice": "required"}, "tool_choice", ["needs tools"]),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function",
                                                "function": {"name": "get_time"}}},
     "tool_choice.function.name", ["not one of"]),
    ({"tools": [WEATHER_TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls", []),
    ({"messages": [USER, {"role": "tool", "content": "18"}]}, "messages.1.tool_call_id",
     ["names the call"]),
    ({"messages": [USER, {"role": "tool", "content": "18", "tool_call_id": "nope"}]},
     "messages.1.tool_call_id", ["answers no tool call"]),
    ({"messages": [{"role": "user", "content": "hi", "tool_call_id": "c"}]},
     "messages.0.tool_call_id", ["only a role 'tool'"]),
    ({"messages": [USER, {"role": "user", "content": "", "tool_calls": [CALL]}]},
     "messages.1.tool_calls", ["only assistant"]),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c1"}]}]},
     "messages.1.tool_calls.0.function", []),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "f", "arguments": "{city"}}]}]},
     "messages.1.tool_calls.0.function.arguments", ["JSON object"]),
])
def test_bad_tool_fields_are_400s_naming_them(tiny_served, fields, field, words):
    assert_400(post(tiny_served, **fields), field, *words)


def test_a_template_with_no_place_for_tools_gets_them_as_text(tiny_served):
    plain = post(tiny_served).json()["usage"]["prompt_tokens"]
    shown = post(tiny_served, tools=[WEATHER_TOOL])
    assert shown.status_code == 200, shown.text
    assert shown.json()["usage"]["prompt_tokens"] > plain + 100  # the tools, described
    history = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
               {"role": "tool", "content": "18", "tool_call_id": "call_1"}]
    assert post(tiny_served, messages=history, tools=[WEATHER_TOOL]).status_code == 200


def test_text_that_looks_like_a_call_stays_text_without_a_tool_format(no_format_served):
    served, sampler = no_format_served
    looks_like = CALL_REPLIES["qwen2"]
    sampler.script = served.llm.tokenizer.encode(looks_like, add_special_tokens=False)
    reply = served.client().chat.completions.create(
        model=served.model, messages=[USER], tools=[WEATHER_TOOL], max_tokens=200)
    choice = reply.choices[0]
    assert (choice.message.content, choice.message.tool_calls) == (looks_like, None)
    assert choice.finish_reason == "stop"
    # The tools did reach the model: its template took them.
    assert reply.usage.prompt_tokens > 100


def test_defaults_and_none_pass():
    assert not tool_request(None, None, None).active
    assert tool_request([WEATHER_TOOL], None, None).choice == "auto"
    assert not tool_request([WEATHER_TOOL], "none", True).active
    with pytest.raises(InvalidField) as error:
        tool_request([], "auto", None)
    assert error.value.field == "tool_choice"
