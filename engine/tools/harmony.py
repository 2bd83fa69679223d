"""Harmony's calls (gpt-oss): a ``commentary`` message to ``functions.NAME``::

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":
    "Paris"}<|call|>

They are read where the reply is read for its channels
(``engine.text.reasoning.harmony.HarmonyParser`` emits them as ``CallStart`` /
``CallArguments``), so no ``ToolFormat`` of this package parses them; this module says how
a reply is started with one, for ``tool_choice`` "required" or a named function: the
prompt ends with the header up to the function's name (the model writes the name), or the
whole header of the named function's call (the model writes its arguments)."""

from __future__ import annotations

CALL_HEADER = "<|channel|>commentary to=functions."
ARGUMENTS = " <|constrain|>json<|message|>"


def call_opening(function: str | None) -> str:
    """What follows the generation prompt ``<|start|>assistant`` so the reply is a call:
    of any function (None), or of ``function``."""
    return CALL_HEADER if function is None else CALL_HEADER + function + ARGUMENTS
