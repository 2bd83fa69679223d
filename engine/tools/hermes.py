"""Hermes-style calls, as Qwen 2.5 and Qwen 3 write them::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one region per call, several regions for several calls; the templates render earlier
calls the same way and tool results as ``<tool_response>`` in a user turn."""

from __future__ import annotations

from engine.tools.format import Marker, ToolFormat

HERMES = ToolFormat(
    name="hermes",
    markers=(Marker("<tool_call>"),),
    end="</tool_call>",
    template_hints=("<tool_call>",),
    required_prefix="<tool_call>\n",
    named_prefix='<tool_call>\n{{"name": "{name}", "arguments": ',
)
