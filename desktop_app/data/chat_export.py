"""A chat as Markdown (one branch, for reading) or JSON (every branch, for keeping).

Pure formatting: ChatStore.export_markdown / export_json fetch the records and call these.
chat_import reads the JSON back (the format marker and version below are its contract).

The JSON never carries a secret: API keys live only in the app settings' server entries,
never in a chat, and a model name that is a URL has any ``user:password@`` part removed,
as has any metrics entry whose name looks like a credential.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import Any

from desktop_app.data.chat_schema import Chat, Message

JSON_FORMAT = "folio-chat"
# 2: tool calls (Message.tool_calls) and results ("tool" messages); 3: a reply's thinking
# (Message.thinking), apart from its answer.
JSON_VERSION = 3

# "scheme://user:secret@host" -> "scheme://host"
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s#]*@")
_SECRET_KEY = re.compile(r"(api[_-]?key|authorization|secret|password|bearer)", re.IGNORECASE)


def branch_markdown(chat: Chat, branch: list[Message]) -> str:
    """branch: the messages root..leaf; empty for a chat without messages."""
    parts = [f"# {chat.title}\n"]
    if chat.settings.system_prompt:
        parts.append(f"**System:** {chat.settings.system_prompt}\n")
    for msg in branch:
        note = " (interrupted)" if msg.status == "interrupted" else ""
        if msg.role == "tool" and msg.tool_call:
            call = msg.tool_call
            parts.append(f"## Tool {call['name']} ({call['state']})\n\nArguments: "
                         f"`{call['arguments']}`\n\n{msg.content}\n")
            continue
        calls = "".join(f"\n\nCalls `{c['name']}` with `{c['arguments']}`"
                        for c in msg.tool_calls or ())
        parts.append(f"## {msg.role.capitalize()}{note}\n\n{_thinking(msg)}{msg.content}"
                     f"{calls}\n")
    return "\n".join(parts)


def _thinking(msg: Message) -> str:
    """A reply's thinking as a folded block before its answer, never part of it."""
    if not msg.thinking:
        return ""
    return f"<details><summary>Thinking</summary>\n\n{msg.thinking}\n\n</details>\n\n"


def chat_json(chat: Chat, messages: list[Message]) -> str:
    """messages: all of the chat's messages, in creation order."""
    return json.dumps({"format": JSON_FORMAT, "version": JSON_VERSION, "chat": asdict(chat),
                       "messages": [_message_dict(m) for m in messages]}, indent=2)


def strip_credentials(text: str | None) -> str | None:
    """A URL's ``user:password@`` part removed (model names of remote servers)."""
    return None if text is None else _USERINFO.sub(r"\g<scheme>", text)


def _message_dict(msg: Message) -> dict[str, Any]:
    data = asdict(msg)
    data["model"] = strip_credentials(msg.model)
    data["metrics"] = _scrub(msg.metrics)
    return data


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()
                if not (isinstance(k, str) and _SECRET_KEY.search(k))}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value
