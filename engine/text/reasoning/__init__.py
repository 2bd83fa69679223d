"""Reasoning output: a reply's streamed text split into the model's thinking and its
answer, in the format its chat template shows (``formats.py``)."""

from engine.text.reasoning.events import SplitReply, split_reply
from engine.text.reasoning.formats import (
    HARMONY,
    THINK,
    ReasoningFormat,
    ReasoningReader,
    has_effort_setting,
    has_think_switch,
    reasoning_format,
)
from engine.text.reasoning.harmony import HarmonyParser
from engine.text.reasoning.options import REASONING_EFFORTS, TemplateOptions
from engine.text.reasoning.think import ThinkParser

__all__ = ["HARMONY", "REASONING_EFFORTS", "THINK", "HarmonyParser", "ReasoningFormat",
           "ReasoningReader", "SplitReply", "TemplateOptions", "ThinkParser",
           "has_effort_setting", "has_think_switch", "reasoning_format", "split_reply"]
