"""A format per chat template, the reply's start read from the prompt's end, and the
reader's thinking tokens and time."""

from __future__ import annotations

from engine.outputs import TextDelta
from engine.text.reasoning import (
    HARMONY,
    THINK,
    HarmonyParser,
    ThinkParser,
    has_think_switch,
    reasoning_format,
)

QWEN3 = ("{%- if enable_thinking is defined and enable_thinking is false %}"
         "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}")
GPT_OSS = "{{- '<|start|>assistant<|channel|>final<|message|>' }}"
CHATML = "{{ '<|im_start|>' + message['role'] }}"


class _Ids:
    """A tokenizer whose ids are characters."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_format_by_template():
    assert reasoning_format(QWEN3) is THINK
    assert reasoning_format(GPT_OSS) is HARMONY
    assert reasoning_format(CHATML) is None
    assert reasoning_format(None) is None
    assert has_think_switch(QWEN3) and not has_think_switch(GPT_OSS)
    assert HARMONY.keeps_special_tokens and not THINK.keeps_special_tokens


def test_reply_start_read_from_the_prompt():
    opened = THINK.reader(_Ids(), ids("<|im_start|>assistant\n<think>\n")).parser
    assert isinstance(opened, ThinkParser) and opened.thinking
    closed = THINK.reader(_Ids(), ids("assistant\n<think>\n\n</think>\n\n")).parser
    assert not closed.thinking
    final = HARMONY.parser("<|end|><|start|>assistant<|channel|>final<|message|>")
    assert isinstance(final, HarmonyParser)
    assert final.feed("Hi") == [TextDelta("Hi")]
    assert HARMONY.parser("<|end|><|start|>assistant").feed("<|channel|>final<|message|>x")


def test_reader_counts_thinking_tokens_and_time():
    reader = THINK.reader(_Ids(), ids("assistant\n"))
    for at, piece in enumerate(["<think>", "a", " b", "</think>", "\n\nanswer", " more"]):
        reader.feed(piece, 1, now=float(at))
    reader.finish(now=9.0)
    assert reader.thinking_tokens == 4  # the tags count as the thinking's tokens
    assert reader.thinking_s == 3.0  # from its first token to the closing tag
