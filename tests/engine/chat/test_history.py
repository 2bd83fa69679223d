"""Earlier replies' thinking as each kind of template wants it (engine/chat/history.py)."""

from __future__ import annotations

from engine.chat.history import drops_thinking, with_thinking
from engine.text.reasoning import HARMONY, THINK

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def conversation() -> list[dict]:
    return [{"role": "user", "content": "a"},
            {"role": "assistant", "content": "first", "token_ids": [1, 2],
             "reasoning_content": "why first", "tool_calls": [CALL]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            {"role": "assistant", "content": "second answer", "token_ids": [3, 4, 5],
             "reasoning_content": "why second"},
            {"role": "user", "content": "b"}]


def count(text: str) -> int:
    return len(text.split())


def test_a_template_that_drops_thinking_gets_replies_as_text_and_the_cost_counted():
    history = with_thinking(conversation(), THINK, True, count)
    first, second = history.messages[1], history.messages[3]
    assert "token_ids" not in first and "token_ids" not in second
    # The template decides where to show it (Qwen 3: the turn in progress).
    assert second["reasoning_content"] == "why second"
    assert history.recomputed == 2  # the last reply's answer, computed again


def test_a_template_that_keeps_thinking_splices_ids_or_writes_the_tags():
    messages = conversation()
    del messages[3]["token_ids"]
    history = with_thinking(messages, THINK, False, count)
    first, second = history.messages[1], history.messages[3]
    assert first["token_ids"] == [1, 2]  # its ids hold the thinking already
    assert second["content"] == "<think>\nwhy second\n</think>\n\nsecond answer"
    assert "reasoning_content" not in second and history.recomputed == 0


def test_harmony_splices_nothing_and_keeps_reasoning_with_calls_only():
    history = with_thinking(conversation(), HARMONY, True, count)
    first, second = history.messages[1], history.messages[3]
    assert "token_ids" not in first and "token_ids" not in second
    assert first["reasoning_content"] == "why first"
    assert "reasoning_content" not in second
    assert history.recomputed == 2


def test_without_a_reasoning_format_nothing_changes():
    messages = conversation()
    assert with_thinking(messages, None, False, count).messages is messages


def test_the_probe_tells_a_template_that_drops_thinking():
    assert drops_thinking(lambda conv: conv[1]["content"].split("</think>")[-1])
    assert not drops_thinking(lambda conv: conv[1]["content"])
    assert not drops_thinking(lambda conv: 1 / 0)  # a template that refuses it
