"""Tools, calls and results into a model's own chat template.

Templates read what transformers' ``apply_chat_template(..., tools=...)`` gives them: the
tools in OpenAI's shape, assistant ``tool_calls`` whose ``function.arguments`` is a mapping
(they ``tojson`` it), ``role: "tool"`` messages with their ``tool_call_id``. Whether a
template can show them at all is read from its source, since a template that never names
them drops them without a word.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass

from engine.tools.format import ToolFormat

_TOOLS = re.compile(r"\btools\b")


class TemplateToolError(ValueError):
    """A request the chat template cannot show to the model; ``field`` names the part."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(slots=True, frozen=True)
class TemplateTools:
    takes_tools: bool  # names ``tools`` (the variable, or Phi-4-mini's message['tools'])
    renders_calls: bool  # names ``tool_calls``

    @classmethod
    def of(cls, source: str | None) -> TemplateTools:
        source = source or ""
        return cls(bool(_TOOLS.search(source)), "tool_calls" in source)


def prepare(messages: list[dict], tools: list[dict] | None, fmt: ToolFormat | None,
            caps: TemplateTools) -> list[dict]:
    """Messages as the template reads them; TemplateToolError where it cannot show them."""
    if tools and not caps.takes_tools:
        raise TemplateToolError("tools", "tools: the model's chat template has no place for "
                                "tools, so the model would never see them")
    out = []
    for i, message in enumerate(messages):
        message = dict(message)
        calls = message.get("tool_calls")
        if (calls or message["role"] == "tool") and not caps.takes_tools:
            what = "tool_calls" if calls else "role"
            raise TemplateToolError(f"messages.{i}.{what}", f"messages.{i}.{what}: the model's "
                                    "chat template has no place for tool calls or results")
        if calls:
            calls = [_with_mapping_arguments(call) for call in calls]
            message["tool_calls"] = calls
            if not caps.renders_calls:
                if fmt is None:
                    raise TemplateToolError(f"messages.{i}.tool_calls", f"messages.{i}."
                                            "tool_calls: the model's chat template has no "
                                            "place for tool calls")
                # Shown as the model wrote them, so it still sees what it called.
                message["content"] += fmt.render_calls([c["function"] for c in calls])
                del message["tool_calls"]
        out.append(message)
    if tools and fmt is not None and fmt.system_tools:
        out = _tools_on_system_message(out, tools)
    return out


def _with_mapping_arguments(call: dict) -> dict:
    call = copy.deepcopy(call)
    arguments = call["function"].get("arguments")
    if isinstance(arguments, str):
        call["function"]["arguments"] = json.loads(arguments)
    return call


def _tools_on_system_message(messages: list[dict], tools: list[dict]) -> list[dict]:
    text = json.dumps([t["function"] for t in tools], ensure_ascii=False)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "tools": text}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": text}, *messages]
