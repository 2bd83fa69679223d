"""Tools through ``folio serve`` for gpt-oss, with the official openai client: a tiny
random gpt-oss GGUF without a chat template (so the harmony format renders its prompts)
scripted at the sampler. Its reply's analysis comes back as the thinking and its
``commentary to=functions.NAME`` message as ``tool_calls``; the result sent back renders as
harmony's ``functions.NAME to=assistant`` message and the next prompt extends the first
one and its reply (the prefix cache holds both); ``tool_choice`` "required" and a named
function open the reply with the call's header."""

from __future__ import annotations

import json

import pytest

from engine import LLM
from tests.engine.harmony_gguf import write_harmony_gguf
from tests.engine.serve.conftest import Served
from tests.engine.tools.tool_models import WEATHER_TOOL, scripted

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
THOUGHT = "The user wants the weather. I call get_weather."
ARGUMENTS = '{"city": "Paris"}'
CALL = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather <|constrain|>json<|message|>{ARGUMENTS}<|call|>")
ANSWER = "It is sunny in Paris."
FINAL = f"<|channel|>analysis<|message|>Sunny.<|end|><|start|>assistant<|channel|>final" \
        f"<|message|>{ANSWER}<|return|>"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = write_harmony_gguf(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss.gguf")
    llm = LLM(str(path), num_gpu_blocks=256, max_model_len=1024, block_size=16)
    sampler = scripted(llm)
    server = Served(llm)
    yield server, sampler
    server.stop()


def ask(served, script: str, messages=QUESTION, stream: bool = False, **fields):
    server, sampler = served
    sampler.script = server.llm.tokenizer.encode(script, add_special_tokens=False)
    body = {"model": server.model, "messages": messages, "max_tokens": 300,
            "tools": [WEATHER_TOOL], **fields}
    client = server.client()
    if not stream:
        return client.chat.completions.create(**body)
    thinking, calls = "", {}
    for chunk in client.chat.completions.create(stream=True, **body):
        for choice in chunk.choices:
            thinking += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for call in choice.delta.tool_calls or []:
                name, args = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""),
                                     args + (call.function.arguments or ""))
    return thinking, list(calls.values())


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def test_a_call_its_result_and_the_answer(served):
    server, _ = served
    tokenizer = server.llm.tokenizer
    first = ask(served, CALL)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and reasoning_of(choice.message) == THOUGHT
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather",
                                                                         {"city": "Paris"})
    prompt = tokenizer.encode_chat(QUESTION, tools=[WEATHER_TOOL])
    assert first.usage.prompt_tokens == len(prompt)
    assert "namespace functions {" in tokenizer.decode(prompt, skip_special_tokens=False)

    reply = {"role": "assistant", "content": None, "reasoning_content": THOUGHT,
             "tool_calls": [{"id": call.id, "type": "function",
                             "function": {"name": "get_weather", "arguments": ARGUMENTS}}]}
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'}
    second = ask(served, FINAL, [*QUESTION, reply, result])
    assert second.choices[0].message.content == ANSWER
    assert reasoning_of(second.choices[0].message) == "Sunny."
    assert second.choices[0].finish_reason == "stop"
    # The call's turn, the model's own reply and its result: the first prompt and reply
    # again, so the prefix cache has them.
    generated = tokenizer.encode(CALL, add_special_tokens=False)
    again = tokenizer.encode_chat([*QUESTION, {**reply, "content": ""}, result],
                                  tools=[WEATHER_TOOL])
    assert again[:len(prompt) + len(generated)] == prompt + generated
    assert tokenizer.decode(again[len(prompt) + len(generated):],
                            skip_special_tokens=False) == (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>'
        '{"sky": "sunny"}<|end|><|start|>assistant')
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= (len(prompt) + len(generated)) // 16 * 16 - 16


def test_the_call_streamed(served):
    assert ask(served, CALL, stream=True) == (THOUGHT, [("get_weather", ARGUMENTS)])


@pytest.mark.parametrize(("choice", "script"), [
    ("required", f"get_weather <|constrain|>json<|message|>{ARGUMENTS}<|call|>"),
    ({"type": "function", "function": {"name": "get_weather"}}, f"{ARGUMENTS}<|call|>"),
], ids=["required", "named"])
def test_a_forced_call_opens_the_reply_with_its_header(served, choice, script):
    reply = ask(served, script, tool_choice=choice)
    (call,) = reply.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", ARGUMENTS)
    assert reply.choices[0].finish_reason == "tool_calls"
