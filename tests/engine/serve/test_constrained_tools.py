"""Tool calls from a model that cannot call tools on its own: the starter (no call format,
a template with no place for tools) with ``tool_choice`` naming a function or
``required``, its reply constrained to the tools' schemas; streamed chunks assemble to
the non-streamed call; a two-step agent loop whose second request hits the cache."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from engine.outputs import CallArguments, CallStart
from engine.tools.constrained import SchemaCallParser, call_schema, shown_as_text
from engine.tools.events import assemble
from tests.engine.serve.conftest import Served
from tests.engine.tools.tool_models import TIME_TOOL, WEATHER_TOOL

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [WEATHER_TOOL, TIME_TOOL]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def served(starter_llm):
    server = Served(starter_llm)
    yield server
    server.stop()


def ask(served, stream: bool = False, **fields):
    body = {"model": served.model, "messages": QUESTION, "tools": TOOLS, "max_tokens": 120,
            "temperature": 0, **fields}
    client = served.client()
    if not stream:
        return client.chat.completions.create(**body)
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **body):
        state.handle_chunk(chunk)
    return state.get_final_completion()


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_the_starter_calls_with_arguments_that_validate(served, choice) -> None:
    reply = ask(served, tool_choice=choice)
    [call] = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.content is None
    tool = {t["function"]["name"]: t for t in TOOLS}[call.function.name]
    if choice == NAMED:
        assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    streamed = ask(served, stream=True, tool_choice=choice)
    [again] = streamed.choices[0].message.tool_calls
    assert (again.function.name, again.function.arguments) == (call.function.name,
                                                              call.function.arguments)
    assert streamed.choices[0].finish_reason == "tool_calls"


def test_an_agent_loop_stays_in_the_prefix_cache(served) -> None:
    first = ask(served, tool_choice=NAMED)
    call = first.choices[0].message.tool_calls[0]
    history = [*QUESTION, {"role": "assistant", "content": None,
                           "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    second = ask(served, messages=history, max_tokens=30)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content
    cached = second.usage.prompt_tokens_details.cached_tokens
    earlier = first.usage.prompt_tokens + first.usage.completion_tokens
    assert cached / earlier >= 0.9  # the target for an agent's round trip


def test_a_constrained_call_with_response_format_is_refused(served) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        ask(served, tool_choice="required", response_format={"type": "json_object"})
    assert info.value.body["param"] == "response_format"


def test_the_call_schema_names_one_tool_or_any() -> None:
    one = call_schema(TOOLS, "get_time")
    assert one["properties"]["name"] == {"const": "get_time"}
    both = call_schema(TOOLS)
    assert [b["properties"]["name"]["const"] for b in both["anyOf"]] == ["get_weather",
                                                                          "get_time"]


def test_the_parser_streams_arguments_and_drops_the_closing_brace() -> None:
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    whole = SchemaCallParser()
    events = whole.feed(text) + whole.finish()
    pieces = SchemaCallParser()
    cut = [pieces.feed(text[i:i + 3]) for i in range(0, len(text), 3)]
    cut_events = [e for chunk in cut for e in chunk] + pieces.finish()
    for got in (events, cut_events):
        _, [call] = assemble(got)
        assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert isinstance(cut_events[0], CallStart)
    assert sum(isinstance(e, CallArguments) for e in cut_events) > 3
    cut_short = SchemaCallParser()
    short = cut_short.feed('{"name": "get_weather", "arguments": {"ci') + cut_short.finish()
    assert assemble(short)[1][0].arguments == '{"ci'  # cut by max_tokens: all it wrote


def test_calls_and_results_are_shown_as_text_for_a_template_without_tools() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    shown = shown_as_text([{"role": "system", "content": "Be brief."}, *QUESTION,
                           {"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": "call_1", "content": "18"}],
                          TOOLS)
    assert shown[0]["content"].startswith("Be brief.\n\nYou can call")
    assert '"get_time"' in shown[0]["content"]
    assert shown[2] == {"role": "assistant",
                        "content": '{"name": "get_weather", "arguments": {"city": "Paris"}}'}
    assert shown[3] == {"role": "user", "content": "Result of get_weather: 18"}
