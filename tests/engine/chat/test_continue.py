"""Continuing a cut-off reply (engine/chat/continued.py): the same tokens a longer
max_tokens gives, its prompt found in the prefix cache, the reader going on where it
stopped, and what cannot be continued refused by name."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.chat import ChatRequest
from engine.chat.reply import ReplyPlan
from engine.outputs import TextDelta, Thinking
from engine.text.reasoning import THINK
from tests.engine.text.reasoning.thinking_models import save_thinking_model
from tests.engine.tiny_models import peaked_weights, save_tiny_model

BLOCK = 16
ASK = [{"role": "user", "content": "Tell me a long story about the sea and its ships."}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("continue") / "tiny", init=peaked_weights)
    return LLM(str(path), num_gpu_blocks=128, max_model_len=1024, block_size=BLOCK)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def reply_of(out) -> dict:
    cand = out.outputs[0]
    return {"role": "assistant", "content": cand.text, "token_ids": list(cand.token_ids)}


def test_continuing_gives_the_tokens_of_a_longer_max_tokens(llm):
    first = llm.chat(ASK, greedy(12))
    assert first.outputs[0].finish_reason == "length"
    more = llm.chat(ChatRequest([*ASK, reply_of(first)], continue_reply=True), greedy(20))
    whole = llm.chat(ASK, greedy(32))
    assert first.outputs[0].token_ids + more.outputs[0].token_ids == whole.outputs[0].token_ids
    # The prompt is the first one plus the reply: all but its last block was cached.
    prompt = len(first.prompt_token_ids) + 12
    assert more.prompt_token_ids == first.prompt_token_ids + first.outputs[0].token_ids
    assert more.metrics.num_prompt_tokens == prompt
    assert more.metrics.num_cached_tokens >= prompt - BLOCK
    # The reply read whole; its text is the new part only.
    assert more.outputs[0].reply.content == whole.outputs[0].text
    assert first.outputs[0].text + more.outputs[0].text == whole.outputs[0].text


def test_a_reply_without_ids_continues_from_its_text(llm):
    first = llm.chat(ASK, greedy(6))
    text_only = {"role": "assistant", "content": first.outputs[0].text}
    built = llm.prompts.build(ChatRequest([*ASK, text_only], continue_reply=True))
    tail = llm.tokenizer.encode(first.outputs[0].text, add_special_tokens=False)
    assert built.ids == first.prompt_token_ids + tail


@pytest.mark.parametrize(("messages", "field"), [
    (ASK, "continue_reply: the last message must be the assistant's"),
    ([{"role": "assistant", "content": "hi"}], "needs the messages it answers"),
    ([*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     "called tools"),
])
def test_what_cannot_be_continued_is_refused_by_name(messages, field):
    with pytest.raises(ValueError, match=field):
        ChatRequest(messages, continue_reply=True)


def test_a_finished_reply_is_not_continued(llm):
    eos = next(iter(llm.tokenizer.eos_token_ids))
    done = {"role": "assistant", "content": "Hi", "token_ids": [72, 105, eos]}
    with pytest.raises(ValueError, match="ended its turn"):
        llm.prompts.build(ChatRequest([*ASK, done], continue_reply=True))


def test_the_reader_goes_on_inside_the_thinking():
    reader = ReplyPlan(reasoning=THINK, replay="<think>\nFirst I count").reader()
    events = reader.feed(" the ships.</think>\n\nSeven.") + reader.finish()
    assert [type(e) for e in events] == [Thinking, TextDelta]
    assert events[0].text == " the ships."
    message = reader.message()
    assert (message.reasoning, message.content) == ("First I count the ships.", "Seven.")


def test_a_thinking_model_continues_its_thinking(tmp_path):
    llm = LLM(str(save_thinking_model(tmp_path / "think")), num_gpu_blocks=64,
              max_model_len=512)
    thought = {"role": "assistant", "content": "", "reasoning_content": "Let me",
               "token_ids": llm.tokenizer.encode("<think>\nLet me", add_special_tokens=False)}
    built = llm.prompts.build(ChatRequest([*ASK, thought], continue_reply=True))
    assert built.plan.replay == "<think>\nLet me"
    assert built.plan.reader().reasoning.parser.thinking
    with pytest.raises(ValueError, match=r"messages\[-1\]\.token_ids"):
        llm.prompts.build(ChatRequest([*ASK, {**thought, "token_ids": None}],
                                      continue_reply=True))
