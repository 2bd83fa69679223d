"""``ThinkParser`` on scripted streams: the same reply cut at every offset (tags split
across deltas) splits as it does in one piece; a reply that starts inside its thinking;
tags that are not the reply's opening stay answer text."""

from __future__ import annotations

import pytest

from engine.outputs import TextDelta, Thinking
from engine.text.reasoning import ThinkParser, split_reply
from tests.engine.text.reasoning import streams

REPLY = "<think>\nThe user greets me.\nI should greet back.\n</think>\n\nHello! How can I help?"


def run(reply: str, cuts: list[int], in_thinking: bool = False):
    return streams.run(ThinkParser(in_thinking), reply, cuts)


def test_one_piece():
    split, _ = run(REPLY, [])
    assert split.thinking == "The user greets me.\nI should greet back."
    assert split.answer == "Hello! How can I help?"


@pytest.mark.parametrize("in_thinking", [False, True])
def test_every_single_cut_and_every_character_equals_one_piece(in_thinking):
    reply = REPLY.removeprefix("<think>") if in_thinking else REPLY
    whole, _ = run(reply, [], in_thinking)
    assert whole.thinking and whole.answer
    for cut in range(len(reply) + 1):
        assert run(reply, [cut], in_thinking)[0] == whole, cut
    split, events = run(reply, list(range(len(reply))), in_thinking)
    assert split == whole
    assert all(e.text for e in events)


def test_thinking_streams_before_it_closes():
    parser = ThinkParser()
    assert parser.feed("<think>Let me ") == [Thinking("Let me")]
    assert parser.thinking
    assert parser.feed("see</th") == [Thinking(" see")]
    assert parser.feed("ink>Yes.") == [TextDelta("Yes.")]
    assert not parser.thinking


def test_prompt_opened_thinking_and_the_model_repeats_the_tag():
    split, _ = run("<think>\nhmm\n</think>ok", [], in_thinking=True)
    assert (split.thinking, split.answer) == ("hmm", "ok")


def test_a_tag_later_in_the_answer_is_text():
    reply = "Use <think> and </think> tags, like <think>this</think>."
    assert run(reply, [])[0].answer == reply
    assert run(reply, [])[0].thinking == ""


def test_unclosed_thinking_is_all_thinking_and_no_answer():
    split, _ = run("<think>still going", [5])
    assert (split.thinking, split.answer) == ("still going", "")


def test_empty_thinking_and_half_an_opening_tag():
    assert run("<think>\n\n</think>\n\nHi", [])[0] == split_reply([TextDelta("Hi")])
    assert run("<thi", [])[0].answer == "<thi"
    assert run("", [])[0] == split_reply([])
