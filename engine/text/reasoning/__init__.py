"""Reasoning output: a reply's streamed text split into the model's thinking and its
answer, in the format its chat template shows (``formats.py``)."""

from engine.text.reasoning.events import SplitReply, Thinking, split_reply
from engine.text.reasoning.formats import (
    HARMONY,
    THINK,
    ReasoningFormat,
    ReasoningReader,
    has_think_switch,
    reasoning_format,
)
from engine.text.reasoning.harmony import HarmonyParser
from engine.text.reasoning.think import ThinkParser

__all__ = ["HARMONY", "THINK", "HarmonyParser", "ReasoningFormat", "ReasoningReader",
           "SplitReply", "ThinkParser", "Thinking", "has_think_switch", "reasoning_format",
           "split_reply"]
