"""Tool calls for a family without a call format: the reply is held to a schema instead.

With ``tool_choice: "required"`` or a named function, a model that has no call format of
its own still has to call. Its reply is constrained (structured output) to
``{"name": <one of the tools>, "arguments": <that tool's parameters>}``, one call, as
vLLM does for ``required``; ``SchemaCallParser`` reads that reply as the events of a call
streamed the OpenAI way, the arguments passed on as they come.
"""

from __future__ import annotations

import json
import re

from engine.outputs import CallArguments, CallStart
from engine.tools.events import ToolEvent
from engine.tools.format import openai_call_id

# The grammar writes the object without free whitespace, properties in schema order.
_HEAD = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')
_ANY_ARGUMENTS = {"type": "object"}


def call_schema(tools: list[dict], function: str | None = None) -> dict:
    """The JSON schema of one call to ``function``, or to any of ``tools`` when None."""
    branches = []
    for tool in tools:
        spec = tool["function"]
        if function is not None and spec["name"] != function:
            continue
        branches.append({
            "type": "object",
            "properties": {"name": {"const": spec["name"]},
                           "arguments": spec.get("parameters") or _ANY_ARGUMENTS},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


class SchemaCallParser:
    """The ``ToolParser`` interface over a reply constrained by ``call_schema``: a call's
    start once its name is written, then its arguments, holding back the closing brace
    that ends the call object rather than the arguments."""

    def __init__(self) -> None:
        self._text = ""
        self._sent = 0  # characters of the arguments passed on
        self._start = -1  # where the arguments begin, once the name is read
        self.calls = 0

    @property
    def done(self) -> bool:
        return False  # one call fills the whole reply: the reply's end is the call's

    def feed(self, text: str) -> list[ToolEvent]:
        self._text += text
        out: list[ToolEvent] = []
        if self._start < 0:
            head = _HEAD.match(self._text)
            if head is None:
                return out
            self._start, self.calls = head.end(), 1
            out.append(CallStart(0, openai_call_id(), json.loads(head.group(1))))
        upto = max(len(self._text) - 1, self._start)  # the last character may be the end
        self._pass_on(upto, out)
        return out

    def finish(self) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        if self._start >= 0:
            whole = self._text.endswith("}") and _complete(self._text)
            self._pass_on(len(self._text) - 1 if whole else len(self._text), out)
        return out

    def _pass_on(self, upto: int, out: list[ToolEvent]) -> None:
        piece = self._text[self._start + self._sent:upto]
        if piece:
            self._sent += len(piece)
            out.append(CallArguments(0, piece))


def _complete(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


_INSTRUCTION = ("You can call the functions below. To call one, reply with only a JSON object "
                '{"name": <the function\'s name>, "arguments": <its arguments>}.\nFunctions: ')


def shown_as_text(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation for a template with no place for tools: the tools described in
    the system message, each earlier call as the JSON reply that made it, each result as
    a user message. The same tools give the same text, so an agent loop's requests share
    their prefix (and the prefix cache)."""
    out: list[dict] = []
    if tools:
        text = _INSTRUCTION + json.dumps([t["function"] for t in tools], ensure_ascii=False)
        if messages and messages[0]["role"] == "system":
            out.append({"role": "system", "content": f"{messages[0]['content']}\n\n{text}"})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": text})
    names: dict[str, str] = {}
    for message in messages:
        calls = message.get("tool_calls") or []
        if calls:
            written = []
            for call in calls:
                function = call["function"]
                names[call["id"]] = function["name"]
                # As the constrained reply wrote it: json.dumps's separators are the
                # grammar's, so a re-rendered call tokenizes as it was generated.
                written.append(json.dumps({"name": function["name"],
                                           "arguments": json.loads(function["arguments"])},
                                          ensure_ascii=False))
            out.append({"role": "assistant", "content": "\n".join(written)})
        elif message["role"] == "tool":
            name = names.get(message.get("tool_call_id", ""), "the function")
            out.append({"role": "user", "content": f"Result of {name}: {message['content']}"})
        else:
            out.append({"role": message["role"], "content": message["content"]})
    return out
