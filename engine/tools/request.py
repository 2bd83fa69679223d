"""The tool fields of a chat request, checked: ``tools``, ``tool_choice``,
``parallel_tool_calls``, and the ``tool_calls`` / ``tool_call_id`` of its messages.

Each bad value is a 400 that names the field by its path (``tools.0.function.name``), so a
client learns what to fix; what Folio cannot do yet (``strict`` schemas, which need
constrained decoding) is refused the same way rather than ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICES = ("none", "auto", "required")
_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
_CALL_KEYS = {"id", "type", "function"}
_CALL_FUNCTION_KEYS = {"name", "arguments"}


class InvalidField(ValueError):
    """A request field set to a value Folio cannot take; ``field`` is its path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _require(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise InvalidField(where, f"{where}: {message}")


def _known_keys(value: dict, allowed: set[str], where: str) -> None:
    for key in value:
        _require(key in allowed, f"{where}.{key}", "not a field Folio knows here (an OpenAI "
                 "field it does not implement, or a typo); remove it")


@dataclass(slots=True, frozen=True)
class ToolRequest:
    tools: list[dict] = field(default_factory=list)
    choice: str = "none"  # "none", "auto", "required", or "function" for a named one
    function: str | None = None  # the function tool_choice names
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Tools shown to the model and its reply read for calls."""
        return bool(self.tools) and self.choice != "none"


def tool_request(tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> ToolRequest:
    checked = _tools(tools)
    choice, function = _choice(tool_choice, checked)
    _require(parallel_tool_calls is None or isinstance(parallel_tool_calls, bool),
             "parallel_tool_calls", "must be true or false")
    return ToolRequest(checked, choice, function, parallel_tool_calls is not False)


def _tools(tools: Any) -> list[dict]:
    if tools is None:
        return []
    _require(isinstance(tools, list), "tools", "must be a list of function tools")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        _require(isinstance(tool, dict), where, "must be an object")
        _require(tool.get("type") == "function", f"{where}.type", "Folio knows function "
                 f"tools only (type 'function'), got {tool.get('type')!r}")
        _known_keys(tool, _TOOL_KEYS, where)
        function = tool.get("function")
        _require(isinstance(function, dict), f"{where}.function", "must be an object with "
                 "the function's name, description and parameters")
        _known_keys(function, _FUNCTION_KEYS, f"{where}.function")
        name = function.get("name")
        _require(isinstance(name, str) and bool(_NAME.match(name)), f"{where}.function.name",
                 f"must be 1 to 64 letters, digits, '_' or '-', got {name!r}")
        _require(name not in names, f"{where}.function.name", f"{name!r} is defined twice")
        names.add(name)
        _require(function.get("description") is None
                 or isinstance(function.get("description"), str),
                 f"{where}.function.description", "must be a string")
        _require(function.get("parameters") is None
                 or isinstance(function.get("parameters"), dict),
                 f"{where}.function.parameters", "must be a JSON schema object")
        # Strict mode promises arguments that match the schema: only a constrained
        # decoder can keep that promise.
        _require(not function.get("strict"), f"{where}.function.strict", "strict schemas "
                 "need structured output (constrained decoding), not yet supported; leave "
                 "strict unset or false")
    return tools


def _choice(value: Any, tools: list[dict]) -> tuple[str, str | None]:
    if value is None:
        return ("auto" if tools else "none"), None
    if isinstance(value, str):
        _require(value in CHOICES, "tool_choice", f"must be one of {', '.join(CHOICES)} or "
                 f"{{'type': 'function', 'function': {{'name': ...}}}}, got {value!r}")
        _require(value == "none" or bool(tools), "tool_choice", f"{value!r} needs tools")
        return value, None
    _require(isinstance(value, dict) and value.get("type") == "function", "tool_choice",
             "an object must be {'type': 'function', 'function': {'name': ...}}")
    _known_keys(value, _TOOL_KEYS, "tool_choice")
    function = value.get("function")
    _require(isinstance(function, dict), "tool_choice.function", "must be {'name': ...}")
    _known_keys(function, {"name"}, "tool_choice.function")
    name = function.get("name")
    known = [t["function"]["name"] for t in tools]
    _require(name in known, "tool_choice.function.name", f"{name!r} is not one of the "
             f"request's tools ({', '.join(known) or 'none given'})")
    return "function", name


def check_message_tools(i: int, role: str, tool_calls: Any, tool_call_id: Any) -> None:
    where = f"messages.{i}"
    if tool_calls is not None and tool_calls != []:
        _require(role == "assistant", f"{where}.tool_calls", "only assistant messages carry "
                 "tool calls")
        _require(isinstance(tool_calls, list), f"{where}.tool_calls", "must be a list")
        for j, call in enumerate(tool_calls):
            _check_call(call, f"{where}.tool_calls.{j}")
    if role == "tool":
        _require(isinstance(tool_call_id, str) and bool(tool_call_id),
                 f"{where}.tool_call_id", "a tool message names the call it answers")
    else:
        _require(tool_call_id is None, f"{where}.tool_call_id", "only a role 'tool' "
                 "message answers a call")


def _check_call(call: Any, where: str) -> None:
    _require(isinstance(call, dict), where, "must be an object")
    _known_keys(call, _CALL_KEYS, where)
    _require(isinstance(call.get("id"), str) and bool(call.get("id")), f"{where}.id",
             "a tool call needs its id")
    _require(call.get("type", "function") == "function", f"{where}.type",
             "must be 'function'")
    function = call.get("function")
    _require(isinstance(function, dict), f"{where}.function", "must be {'name', "
             "'arguments'}")
    _known_keys(function, _CALL_FUNCTION_KEYS, f"{where}.function")
    _require(isinstance(function.get("name"), str) and bool(function.get("name")),
             f"{where}.function.name", "a tool call needs its function's name")
    arguments = function.get("arguments")
    try:
        ok = isinstance(arguments, str) and isinstance(json.loads(arguments), dict)
    except ValueError:
        ok = False
    _require(ok, f"{where}.function.arguments", "must be a JSON object as text, as the "
             "call's reply gave it")


def check_results_answer_calls(messages: list) -> None:
    """Each tool result answers a call of an earlier assistant message."""
    ids: set[str] = set()
    for i, message in enumerate(messages):
        for call in message.tool_calls or []:
            ids.add(call["id"])
        if message.role == "tool":
            _require(message.tool_call_id in ids, f"messages.{i}.tool_call_id",
                     f"{message.tool_call_id!r} answers no tool call of an earlier assistant "
                     "message")
