"""Phi-4-mini calls: ``<|tool_call|>[{"name": ..., "arguments": {...}}]<|/tool_call|>``.
Its template takes the tools as JSON text on the system message (``<|tool|>...<|/tool|>``)
and has no place for earlier calls, which are shown to it as the text the model wrote."""

from __future__ import annotations

from engine.tools.format import Marker, ToolFormat

PHI4_MINI = ToolFormat(
    name="phi4_mini",
    markers=(Marker("<|tool_call|>"),),
    end="<|/tool_call|>",
    template_hints=("<|tool|>",),
    required_prefix="<|tool_call|>",
    named_prefix='<|tool_call|>[{{"name": "{name}", "arguments": ',
    list_per_region=True,
    system_tools=True,
)
