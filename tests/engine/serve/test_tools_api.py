"""Tool calling through ``folio serve`` with the official openai client, on a tiny model of
each family with a tool format whose replies the test scripts: calls in
``message.tool_calls`` and, streamed, assembled by the client to the same calls; several
calls; malformed JSON as text; tool_choice; an agent loop that stays in the prefix cache."""

from __future__ import annotations

import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from engine import LLM
from engine.tools.registry import tool_format
from tests.engine.serve.conftest import Served
from tests.engine.tools.tool_models import (
    ARGUMENTS,
    BROKEN_REPLIES,
    CALL_REPLIES,
    TIME_TOOL,
    TOOL_FAMILIES,
    TWO_CALLS,
    WEATHER_TOOL,
    save_tool_model,
    scripted,
)

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [WEATHER_TOOL, TIME_TOOL]


@pytest.fixture(scope="module", params=TOOL_FAMILIES)
def family(request, tmp_path_factory):
    name = request.param
    path = save_tool_model(tmp_path_factory.mktemp(name) / "model", name)
    llm = LLM(str(path), num_gpu_blocks=256, max_model_len=2048)
    sampler = scripted(llm)
    served = Served(llm)
    yield name, served, sampler
    served.stop()


def ask(family, script: str, stream: bool = False, **fields):
    """The reply to ``fields`` when the model says ``script``; streamed: the client's own
    assembly of the chunks, and the chunks."""
    _, served, sampler = family
    sampler.script = served.llm.tokenizer.encode(script, add_special_tokens=False)
    body = {"model": served.model, "messages": QUESTION, "tools": TOOLS, "max_tokens": 300,
            **fields}
    client = served.client()
    if not stream:
        return client.chat.completions.create(**body)
    chunks = list(client.chat.completions.create(stream=True, **body))
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    return state.get_final_completion(), chunks


def calls_of(choice) -> list[tuple[str, dict]]:
    calls = choice.message.tool_calls or []
    assert all(c.type == "function" and c.id for c in calls)
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def test_a_call_streamed_assembles_to_the_call_not_streamed(family):
    name = family[0]
    reply = ask(family, CALL_REPLIES[name])
    choice = reply.choices[0]
    assert calls_of(choice) == [("get_weather", json.loads(ARGUMENTS))]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls[0].function.arguments == ARGUMENTS
    streamed, chunks = ask(family, CALL_REPLIES[name], stream=True)
    other = streamed.choices[0]
    assert calls_of(other) == calls_of(choice)
    assert (other.finish_reason, other.message.content) == ("tool_calls", None)
    # Id and name first, then the arguments in pieces.
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks
              if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    assert len(deltas) > 3 and "".join(d.function.arguments for d in deltas) == ARGUMENTS


def test_several_calls_and_parallel_calls_off(family):
    name = family[0]
    both = [("get_weather", json.loads(ARGUMENTS)), ("get_time", {"zone": "CET"})]
    assert calls_of(ask(family, TWO_CALLS[name]).choices[0]) == both
    streamed, _ = ask(family, TWO_CALLS[name], stream=True)
    assert calls_of(streamed.choices[0]) == both
    one = ask(family, TWO_CALLS[name], parallel_tool_calls=False)
    assert calls_of(one.choices[0]) == both[:1]
    assert one.choices[0].finish_reason == "tool_calls"
    streamed, chunks = ask(family, TWO_CALLS[name], stream=True, parallel_tool_calls=False,
                           stream_options={"include_usage": True})
    assert calls_of(streamed.choices[0]) == both[:1]
    assert streamed.choices[0].finish_reason == "tool_calls"
    if name not in ("mistral", "phi3"):  # there both calls are one list, read at its end
        # Generation stopped after the first call rather than write the second for nothing.
        scripted_tokens = len(family[2].script) + 1  # and the end of the turn
        assert one.usage.completion_tokens < scripted_tokens
        assert chunks[-1].usage.completion_tokens < scripted_tokens


def test_malformed_json_is_text_that_finishes_stop(family):
    broken = BROKEN_REPLIES[family[0]]
    choice = ask(family, broken).choices[0]
    assert (choice.message.content, choice.message.tool_calls) == (broken, None)
    assert choice.finish_reason == "stop"
    streamed, _ = ask(family, broken, stream=True)
    assert streamed.choices[0].message.content == broken
    assert not streamed.choices[0].message.tool_calls
    assert streamed.choices[0].finish_reason == "stop"


def test_text_replies_and_tool_choice_none_stay_text(family):
    name = family[0]
    said = "It is sunny in Paris."
    choice = ask(family, said).choices[0]
    assert (choice.message.content, choice.finish_reason) == (said, "stop")
    # "none": no tools shown, the reply not read for calls, whatever it looks like.
    none = ask(family, CALL_REPLIES[name], tool_choice="none")
    shown = ask(family, said)
    assert none.choices[0].message.tool_calls is None
    assert none.usage.prompt_tokens < shown.usage.prompt_tokens
    # No tools at all: the same.
    plain = ask(family, CALL_REPLIES[name], tools=None)
    assert plain.choices[0].message.tool_calls is None
    assert '"get_weather"' in plain.choices[0].message.content


@pytest.mark.parametrize("choice", ["required", "named"])
def test_tool_choice_starts_the_reply_with_a_call(family, choice):
    name, served, _ = family
    fmt = tool_format(name, served.llm.tokenizer.hf.chat_template)
    if choice == "required":
        script = CALL_REPLIES[name][len(fmt.required_prefix):]
        tool_choice = "required"
        expected = [("get_weather", json.loads(ARGUMENTS))]
    else:
        script = {"hermes": '{"zone": "CET"}}\n</tool_call>', "llama3_json": '{"zone": "CET"}}',
                  "mistral": '{"zone": "CET"}}]',
                  "phi4_mini": '{"zone": "CET"}}]<|/tool_call|>'}[fmt.name]
        tool_choice = {"type": "function", "function": {"name": "get_time"}}
        expected = [("get_time", {"zone": "CET"})]
    reply = ask(family, script, tool_choice=tool_choice)
    assert calls_of(reply.choices[0]) == expected
    assert reply.choices[0].finish_reason == "tool_calls"
    streamed, _ = ask(family, script, stream=True, tool_choice=tool_choice)
    assert calls_of(streamed.choices[0]) == expected


def test_an_agent_loop_finds_its_first_request_and_call_cached(family):
    name, served, _ = family
    first = ask(family, CALL_REPLIES[name])
    call = first.choices[0].message
    history = [*QUESTION, call.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.tool_calls[0].id,
                "content": '{"temperature": 18}'}]
    second = ask(family, "It is 18 degrees in Paris.", messages=history)
    assert second.choices[0].message.content == "It is 18 degrees in Paris."
    assert second.choices[0].finish_reason == "stop"
    block = served.llm.engine.config.block_size
    cached = second.usage.prompt_tokens_details.cached_tokens
    earlier = first.usage.prompt_tokens + first.usage.completion_tokens
    assert cached / earlier >= 0.9  # the target for an agent's round trip
    if name == "mistral":  # its template ends the call with an id the model never wrote
        assert cached >= first.usage.prompt_tokens // block * block
        return
    # Everything the first request computed (its prompt, its reply but the last token),
    # in whole blocks.
    assert cached >= (earlier - 1) // block * block


def test_logprobs_come_with_every_token_of_a_streamed_call(family):
    name = family[0]
    streamed, chunks = ask(family, CALL_REPLIES[name], stream=True, logprobs=True,
                           stream_options={"include_usage": True})
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]
    assert len(entries) == chunks[-1].usage.completion_tokens
    assert calls_of(streamed.choices[0]) == [("get_weather", json.loads(ARGUMENTS))]
