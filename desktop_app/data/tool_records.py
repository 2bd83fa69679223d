"""Tool calls in the chat tree (no Qt here).

A reply that calls tools keeps its calls in ``Message.tool_calls``, each
``{"id", "name", "arguments"}`` (arguments: the JSON text the model wrote). Each call's
result is a ``"tool"`` message under the reply (the calls' results one under the other),
whose ``content`` is the result the model is shown and whose ``tool_call`` says which call
it answers::

    {"id": "call_1", "name": "add", "server": "calc", "tool": "add",
     "arguments": "{\"a\": 1}", "state": "done"}

``name`` is what the model called, ``server`` / ``tool`` the MCP server and tool that ran
it. States: ``pending`` (waiting for the user's Run), ``done``, ``error`` (the server
failed; content says how) and ``denied`` (the user said no). The reply after the results
continues the turn. No secret of a server is ever written here: only its name.
"""

from __future__ import annotations

import json
from typing import Any

PENDING, DONE, ERROR, DENIED = "pending", "done", "error", "denied"
STATES = (PENDING, DONE, ERROR, DENIED)
RESOLVED = (DONE, ERROR, DENIED)
DENIED_TEXT = "The user denied this tool call."
NOT_RUN_TEXT = "The user did not run this tool call."
_CALL_KEYS = ("id", "name", "arguments")
_RECORD_KEYS = ("id", "name", "server", "tool", "arguments", "state")


def check_tool_calls(value: Any, where: str) -> None:
    """ValueError naming the problem unless value is None or a reply's list of calls;
    where: the message's path (``messages[3]``)."""
    if value is None:
        return
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}.tool_calls: expected a non-empty list or null")
    for i, call in enumerate(value):
        if not isinstance(call, dict) or sorted(call) != sorted(_CALL_KEYS) or not all(
                isinstance(call[k], str) for k in _CALL_KEYS):
            raise ValueError(f"{where}.tool_calls[{i}]: expected an object of strings "
                             f"{', '.join(_CALL_KEYS)}")


def check_tool_call(value: Any, role: str, where: str) -> None:
    """ValueError unless a tool message has a record and no other message has one."""
    if role != "tool":
        if value is not None:
            raise ValueError(f"{where}.tool_call: expected null unless the role is tool")
        return
    if not isinstance(value, dict) or sorted(value) != sorted(_RECORD_KEYS) or not all(
            isinstance(value[k], str) for k in _RECORD_KEYS):
        raise ValueError(f"{where}.tool_call: expected an object of strings "
                         f"{', '.join(_RECORD_KEYS)}")
    if value["state"] not in STATES:
        raise ValueError(f"{where}.tool_call.state: expected one of {', '.join(STATES)}")


def record(call: dict[str, str], server: str, tool: str, state: str = PENDING) -> dict:
    return {"id": call["id"], "name": call["name"], "server": server, "tool": tool,
            "arguments": call["arguments"], "state": state}


def arguments_of(record_or_call: dict) -> dict[str, Any]:
    """The call's arguments as an object; ValueError when the model's JSON is not one."""
    try:
        value = json.loads(record_or_call["arguments"] or "{}")
    except json.JSONDecodeError as err:
        raise ValueError(f"the arguments are not valid JSON: {err.msg}") from None
    if not isinstance(value, dict):
        raise ValueError("the arguments must be a JSON object")
    return value


def for_engine(msg, item: dict[str, Any]) -> dict[str, Any]:
    """A stored message's engine chat message with its calls or its result, as chat
    templates read them (OpenAI's shape)."""
    if msg.tool_calls:
        item["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
            "name": c["name"], "arguments": c["arguments"]}} for c in msg.tool_calls]
    if msg.role == "tool" and msg.tool_call is not None:
        item["tool_call_id"] = msg.tool_call["id"]
        item["name"] = msg.tool_call["name"]
        if msg.tool_call["state"] == PENDING:  # the user wrote on without answering it
            item["content"] = NOT_RUN_TEXT
    return item
