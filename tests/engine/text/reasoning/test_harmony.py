"""``HarmonyParser`` on a scripted gpt-oss stream: thinking, answer and a tool call, the
same at every cut; calls checked whole; a prompt that chose the channel already."""

from __future__ import annotations

import json

from engine.outputs import CallArguments, CallStart, TextDelta, Thinking
from engine.text.reasoning import HarmonyParser, split_reply
from tests.engine.text.reasoning import streams

ANSWER = ("<|channel|>analysis<|message|>User asks the weather. Need the tool.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>")
CALL = ("<|channel|>analysis<|message|>Need to call get_weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>')


def run(reply: str, cuts: list[int], opened: str = "assistant"):
    return streams.run(HarmonyParser(opened), reply, cuts)


def shape(split):
    return split.thinking, split.answer, [(c.name, c.arguments) for c in split.calls]


def test_thinking_and_answer():
    assert shape(run(ANSWER, [])[0]) == (
        "User asks the weather. Need the tool.", "It is sunny in Paris.", [])


def test_thinking_and_a_tool_call():
    split, events = run(CALL, [])
    assert shape(split) == ("Need to call get_weather.", "",
                            [("get_weather", '{"city": "Paris"}')])
    assert [type(e) for e in events] == [Thinking, CallStart, CallArguments]
    assert json.loads(split.calls[0].arguments) == {"city": "Paris"}


def test_every_cut_equals_one_piece():
    for reply in (ANSWER, CALL):
        whole = shape(run(reply, [])[0])
        for cut in range(len(reply) + 1):
            assert shape(run(reply, [cut])[0]) == whole, (reply, cut)
        assert shape(run(reply, list(range(len(reply))))[0]) == whole


def test_streams_thinking_before_its_message_ends():
    parser = HarmonyParser()
    assert parser.feed("<|channel|>analysis<|message|>Hmm, ") == [Thinking("Hmm,")]
    assert parser.thinking
    assert parser.feed("ok<|en") == [Thinking(" ok")]
    assert parser.feed("d|>") == []
    assert not parser.thinking


def test_recipient_before_the_channel_and_a_malformed_call():
    reply = ('<|channel|>analysis<|message|>a<|end|><|start|>assistant to=functions.f'
             '<|channel|>commentary json<|message|>{"x": 1}<|call|>')
    assert shape(run(reply, [])[0])[2] == [("f", '{"x": 1}')]
    bad = '<|channel|>commentary to=functions.f <|message|>{"x": <|call|>'
    assert shape(run(bad, [])[0]) == ("", '{"x":', [])


def test_two_analysis_messages_join_and_a_preamble_is_answer():
    reply = ("<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis"
             "<|message|>two<|end|><|start|>assistant<|channel|>commentary<|message|>On it."
             "<|end|><|start|>assistant<|channel|>final<|message|>Done.")
    assert shape(run(reply, [])[0]) == ("one\n\ntwo", "On it.\n\nDone.", [])


def test_prompt_that_chose_the_final_channel():
    split, _ = run("Just the answer.<|return|>", [], "assistant<|channel|>final<|message|>")
    assert shape(split) == ("", "Just the answer.", [])


def test_cut_short_inside_thinking():
    split, _ = run("<|channel|>analysis<|message|>half a thou", [3, 20])
    assert shape(split) == ("half a thou", "", [])
    assert run("<|channel|>ana", [])[0] == split_reply([])
    assert run("<|channel|>final<|message|>x", [])[1] == [TextDelta("x")]


def test_thinking_answer_and_a_call_in_one_reply_at_every_cut():
    reply = ("<|channel|>analysis<|message|>Check first.<|end|><|start|>assistant"
             "<|channel|>commentary<|message|>Let me look that up.<|end|>" + CALL[
                 CALL.index("<|start|>"):])
    whole = shape(run(reply, [])[0])
    assert whole == ("Check first.", "Let me look that up.",
                     [("get_weather", '{"city": "Paris"}')])
    for cut in range(len(reply) + 1):
        assert shape(run(reply, [cut])[0]) == whole, cut
    assert shape(run(reply, list(range(len(reply))))[0]) == whole


def test_a_reply_opened_with_a_forced_calls_header():
    from engine.tools.harmony import call_opening

    arguments = '{"city": "Paris"}<|call|>'
    named = "assistant" + call_opening("get_weather")
    any_call = "assistant" + call_opening(None)
    body = "get_weather <|constrain|>json<|message|>" + arguments
    for opened, reply in ((named, arguments), (any_call, body)):
        for cut in range(len(reply) + 1):
            assert shape(run(reply, [cut], opened)[0]) == (
                "", "", [("get_weather", '{"city": "Paris"}')]), (opened, cut)
