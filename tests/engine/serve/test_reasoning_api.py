"""Reasoning output through ``folio serve`` with the official openai client: a scripted
thinking reply as ``message.reasoning_content`` and ``content``, streamed deltas that
add up to the same, usage counting the thinking's tokens; a template that opens the
thinking in the prompt; harmony channels with a tool call; a model without reasoning keeps
its replies whole."""

from __future__ import annotations

import json

import pytest

from engine import LLM
from tests.engine.serve.conftest import Served
from tests.engine.text.reasoning.thinking_models import save_harmony_model, save_thinking_model
from tests.engine.tools.tool_models import WEATHER_TOOL, save_tool_model, scripted

QUESTION = [{"role": "user", "content": "Hi there"}]
THOUGHT = "The user greets me. I greet back."
ANSWER = "Hello! How can I help?"
REPLY = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"


def serve(path):
    llm = LLM(str(path), num_gpu_blocks=256, max_model_len=2048)
    sampler = scripted(llm)
    served = Served(llm)
    return served, sampler


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    served, sampler = serve(save_thinking_model(tmp_path_factory.mktemp("think") / "m"))
    yield served, sampler
    served.stop()


def ask(served, sampler, script: str, stream: bool = False, **fields):
    """Not streamed: the choice and usage; streamed: the thinking, answer and tool calls
    the deltas add up to, and the usage chunk."""
    sampler.script = served.llm.tokenizer.encode(script, add_special_tokens=False)
    body = {"model": served.model, "messages": QUESTION, "max_tokens": 200, **fields}
    client = served.client()
    if not stream:
        reply = client.chat.completions.create(**body)
        return reply.choices[0], reply.usage
    chunks = list(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **body))
    thinking, answer, calls = "", "", {}
    for chunk in chunks:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            thinking += extra.get("reasoning_content") or ""
            answer += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                name, args = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""),
                                     args + (call.function.arguments or ""))
    return (thinking, answer, list(calls.values())), chunks[-1].usage


def reasoning_of(choice) -> str | None:
    return (choice.message.model_extra or {}).get("reasoning_content")


def test_thinking_and_answer_streamed_or_not(thinking):
    served, sampler = thinking
    choice, usage = ask(served, sampler, REPLY)
    assert (reasoning_of(choice), choice.message.content) == (THOUGHT, ANSWER)
    assert choice.finish_reason == "stop"
    scripted_tokens = len(sampler.script) + 1  # and the end of the turn
    assert usage.completion_tokens == scripted_tokens
    thought_tokens = len(served.llm.tokenizer.encode(f"<think>\n{THOUGHT}\n</think>",
                                                     add_special_tokens=False))
    reasoning = usage.completion_tokens_details.reasoning_tokens
    assert thought_tokens <= reasoning <= thought_tokens + 3  # the blank line after it
    (streamed_thought, streamed_answer, calls), streamed_usage = ask(served, sampler, REPLY,
                                                                      stream=True)
    assert (streamed_thought, streamed_answer, calls) == (THOUGHT, ANSWER, [])
    assert streamed_usage.completion_tokens == usage.completion_tokens
    assert streamed_usage.completion_tokens_details.reasoning_tokens == reasoning


def test_n_candidates_each_split(thinking):
    served, sampler = thinking
    sampler.script = served.llm.tokenizer.encode(REPLY, add_special_tokens=False)
    reply = served.client().chat.completions.create(model=served.model, messages=QUESTION,
                                                    n=2, max_tokens=200)
    assert [(reasoning_of(c), c.message.content) for c in reply.choices] == [
        (THOUGHT, ANSWER)] * 2


def test_a_reply_cut_inside_its_thinking_has_no_answer(thinking):
    served, sampler = thinking
    choice, usage = ask(served, sampler, REPLY, max_tokens=12)
    assert choice.finish_reason == "length" and choice.message.content == ""
    assert reasoning_of(choice) == "The"
    assert usage.completion_tokens == usage.completion_tokens_details.reasoning_tokens == 12


def test_a_prompt_that_opens_the_thinking(tmp_path):
    template = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + "
                "'<|im_end|>\\n' }}{%- endfor %}{{- '<|im_start|>assistant\\n<think>\\n' }}")
    served, sampler = serve(save_tool_model(tmp_path / "r1", "qwen3", template))
    try:
        choice, _ = ask(served, sampler, f"{THOUGHT}\n</think>\n\n{ANSWER}")
        assert (reasoning_of(choice), choice.message.content) == (THOUGHT, ANSWER)
    finally:
        served.stop()


def test_harmony_thinking_answer_and_a_tool_call(tmp_path):
    served, sampler = serve(save_harmony_model(tmp_path / "harmony"))
    answer = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant"
              f"<|channel|>final<|message|>{ANSWER}")
    call = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>"
            'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
            "<|call|>")
    try:
        choice, _ = ask(served, sampler, answer)
        assert (reasoning_of(choice), choice.message.content) == (THOUGHT, ANSWER)
        assert ask(served, sampler, answer, stream=True)[0] == (THOUGHT, ANSWER, [])
        choice, _ = ask(served, sampler, call, tools=[WEATHER_TOOL])
        assert reasoning_of(choice) == THOUGHT and choice.finish_reason == "tool_calls"
        (function,) = [c.function for c in choice.message.tool_calls]
        assert (function.name, json.loads(function.arguments)) == ("get_weather",
                                                                   {"city": "Paris"})
        streamed, _ = ask(served, sampler, call, stream=True, tools=[WEATHER_TOOL])
        assert streamed == (THOUGHT, "", [("get_weather", '{"city": "Paris"}')])
    finally:
        served.stop()


def test_reasoning_effort_reaches_the_template_and_a_bad_one_is_refused(tmp_path):
    """OpenAI's reasoning_effort (and chat_template_kwargs.reasoning_effort, as vLLM's
    clients send it) renders harmony's ``Reasoning:`` line: the prompt the server ran is
    the one the chat tokenizer renders at that level; anything but low, medium, high is a
    400 naming the field and the values."""
    import openai

    from tests.engine.text.reasoning.thinking_models import save_harmony_format_model

    served, sampler = serve(save_harmony_format_model(tmp_path / "gpt-oss"))
    answer = f"<|channel|>final<|message|>{ANSWER}"
    tokenizer = served.llm.tokenizer
    try:
        prompt_tokens = {}
        for effort in (None, "low", "medium", "high"):
            fields = {} if effort is None else {"reasoning_effort": effort}
            choice, usage = ask(served, sampler, answer, **fields)
            assert choice.message.content == ANSWER
            assert usage.prompt_tokens == len(tokenizer.encode_chat(
                QUESTION, reasoning_effort=effort))
            prompt_tokens[effort] = usage.prompt_tokens
        assert prompt_tokens[None] == prompt_tokens["medium"]  # harmony's default
        assert len({prompt_tokens[e] for e in ("low", "medium", "high")}) == 3
        _, usage = ask(served, sampler, answer,
                       extra_body={"chat_template_kwargs": {"reasoning_effort": "low"}})
        assert usage.prompt_tokens == prompt_tokens["low"]
        for bad in ("max", "LOW", 3):
            with pytest.raises(openai.BadRequestError) as refused:
                ask(served, sampler, answer, extra_body={"reasoning_effort": bad})
            assert refused.value.body["param"] == "reasoning_effort"
            assert "'low', 'medium', 'high'" in refused.value.body["message"]
        with pytest.raises(openai.BadRequestError) as refused:
            ask(served, sampler, answer, extra_body={
                "chat_template_kwargs": {"reasoning_effort": "none"}})
        assert refused.value.body["param"] == "chat_template_kwargs.reasoning_effort"
    finally:
        served.stop()


def test_a_template_without_the_variable_ignores_reasoning_effort(thinking):
    served, sampler = thinking
    _, plain = ask(served, sampler, REPLY)
    choice, usage = ask(served, sampler, REPLY, reasoning_effort="high")
    assert (reasoning_of(choice), choice.message.content) == (THOUGHT, ANSWER)
    assert usage.prompt_tokens == plain.prompt_tokens


def test_a_model_without_reasoning_keeps_its_reply_whole(tmp_path):
    served, sampler = serve(save_tool_model(tmp_path / "plain", "qwen2"))
    try:
        choice, usage = ask(served, sampler, REPLY)
        assert choice.message.content == REPLY and reasoning_of(choice) is None
        assert usage.completion_tokens_details is None
    finally:
        served.stop()


def test_an_earlier_reply_sent_back_with_its_thinking(thinking):
    served, sampler = thinking
    earlier = {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}
    choice, _ = ask(served, sampler, REPLY,
                    messages=[*QUESTION, earlier, {"role": "user", "content": "Bye"}])
    assert (reasoning_of(choice), choice.message.content) == (THOUGHT, ANSWER)


def test_chat_template_kwargs_turn_the_thinking_off(thinking):
    served, sampler = thinking
    _, thinking_on = ask(served, sampler, REPLY)
    choice, usage = ask(served, sampler, ANSWER,
                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert (reasoning_of(choice), choice.message.content) == (None, ANSWER)
    empty = served.llm.tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    assert usage.prompt_tokens == thinking_on.prompt_tokens + len(empty)
    import openai

    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs.tools"):
        ask(served, sampler, ANSWER, extra_body={"chat_template_kwargs": {"tools": []}})
