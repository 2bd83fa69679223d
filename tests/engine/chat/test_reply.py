"""A reply read as it streams: thinking, text and calls as typed events, the same however
it is cut into deltas, and the finished message (engine/chat/reply.py)."""

from __future__ import annotations

import pytest

from engine.chat.reply import PLAIN, ReplyPlan
from engine.outputs import CallStart, ReplyMessage, TextDelta, Thinking
from engine.text.reasoning import THINK
from engine.tools.hermes import HERMES

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
REPLY = f"<think>\nLet me look.\n</think>\n\nChecking.{CALL}"


def read(plan: ReplyPlan, text: str, cut: int, constrained: bool = False):
    reader = plan.reader(constrained)
    events = []
    for start in range(0, len(text), cut):
        events += reader.feed(text[start:start + cut], 1, 0.0)
    events += reader.finish(0.0)
    return events, reader.message()


@pytest.mark.parametrize("cut", [1, 3, 7, 1000])
def test_thinking_then_a_call_read_the_same_however_cut(cut):
    plan = ReplyPlan(tool_format=HERMES, reasoning=THINK)
    events, message = read(plan, REPLY, cut)
    assert "".join(e.text for e in events if isinstance(e, Thinking)).strip() == "Let me look."
    assert [e.name for e in events if isinstance(e, CallStart)] == ["get_weather"]
    assert message.content == "Checking."
    assert message.reasoning.strip() == "Let me look."
    assert [(c.name, c.arguments) for c in message.calls] == [
        ("get_weather", '{"city": "Paris"}')]
    assert message.thinking_tokens > 0


def test_a_plain_reply_is_its_text():
    events, message = read(PLAIN, REPLY, 5)
    assert all(isinstance(e, TextDelta) for e in events)
    assert message == ReplyMessage(REPLY)


def test_a_reply_held_to_a_schema_is_not_read_for_thinking():
    _, message = read(ReplyPlan(reasoning=THINK), '{"a": "<think>"}', 4, constrained=True)
    assert message == ReplyMessage('{"a": "<think>"}')


def test_a_forced_call_reads_its_prefix_first_and_thinks_not():
    prefix = "<tool_call>\n"
    plan = ReplyPlan(tool_format=HERMES, prefix=prefix, reasoning=THINK)
    _, message = read(plan, CALL[len(prefix):], 4)
    assert message.reasoning is None
    assert [c.name for c in message.calls] == ["get_weather"]


def test_the_last_allowed_call_ends_the_reading():
    reader = ReplyPlan(tool_format=HERMES, max_calls=1).reader()
    reader.feed(CALL + CALL, 1, 0.0)
    assert reader.done
    reader.finish(0.0)
    assert len(reader.message().calls) == 1
