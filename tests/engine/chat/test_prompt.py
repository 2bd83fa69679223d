"""The prompt builder: content parts, what reading a reply asks of sampling, and the
prompt's request kept with it (engine/chat/prompt.py)."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.chat import ChatRequest
from engine.tools.request import tool_request
from tests.engine.tools.tool_models import WEATHER_TOOL, save_tool_model

QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = save_tool_model(tmp_path_factory.mktemp("qwen") / "model", "qwen3")
    return LLM(str(path), num_gpu_blocks=64, max_model_len=1024)


def test_text_parts_are_the_text(llm):
    as_text = llm.prompts.build(ChatRequest([{"role": "user", "content": QUESTION}]))
    as_parts = llm.prompts.build(ChatRequest([{"role": "user", "content": [
        {"type": "text", "text": "What is the weather"}, {"type": "text", "text": " in Paris?"}]}]))
    assert as_parts.ids == as_text.ids


def test_a_part_that_is_not_text_is_refused_by_its_place(llm):
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[1\]\.type"):
        llm.prompts.build(ChatRequest([{"role": "user", "content": [
            {"type": "text", "text": "look"}, image]}]))


def test_reading_calls_keeps_their_markers_and_stops_at_their_end(llm):
    prompt = llm.prompts.build(ChatRequest([{"role": "user", "content": QUESTION}],
                                           tool_request([WEATHER_TOOL], "auto", None)))
    assert prompt.plan.tool_format is not None
    params = SamplingParams(stop_token_ids=[7])
    once = prompt.sampling(params)
    assert once.skip_special_tokens is False
    assert once.stop_token_ids[0] == 7 and set(prompt.stop_ids) <= set(once.stop_token_ids)
    assert prompt.sampling(once) is once  # twice changes nothing
    assert params.skip_special_tokens is True  # the caller's params are left alone


def test_a_plain_chat_asks_nothing_of_sampling(llm):
    prompt = llm.prompts.build(ChatRequest([{"role": "user", "content": QUESTION}]))
    params = SamplingParams()
    assert prompt.sampling(params) is params
    assert prompt.request.messages[0]["content"] == QUESTION
