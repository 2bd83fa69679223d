"""Llama 3.1+ calls: the reply is one JSON object, ``{"name": ..., "parameters": {...}}``,
optionally after ``<|python_tag|>``; several are separated by ``;``. A bare object counts
only at the start of the reply (or right after a call), so a brace in prose stays prose.
A ``<|python_tag|>`` turn ends with ``<|eom_id|>``, which is not end-of-text, hence a stop
marker. The templates render one call per assistant message and results as ``ipython``.
"""

from __future__ import annotations

from engine.tools.format import Marker, ToolFormat

LLAMA3_JSON = ToolFormat(
    name="llama3_json",
    markers=(Marker("<|python_tag|>"), Marker("{", in_body=True, leading_only=True)),
    end=None,
    template_hints=("<|python_tag|>",),
    required_prefix='{"name": "',
    named_prefix='{{"name": "{name}", "parameters": ',
    separators=";",
    stop_markers=("<|eom_id|>",),
    arguments_key="parameters",
)
