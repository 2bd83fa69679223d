"""A chat as Markdown (one branch, for reading) or JSON (every branch, for keeping).

Pure formatting: ChatStore.export_markdown / export_json fetch the records and call these.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from desktop_app.data.chat_schema import Chat, Message

JSON_FORMAT = "folio-chat"
JSON_VERSION = 1


def branch_markdown(chat: Chat, branch: list[Message]) -> str:
    """branch: the messages root..leaf; empty for a chat without messages."""
    parts = [f"# {chat.title}\n"]
    if chat.settings.system_prompt:
        parts.append(f"**System:** {chat.settings.system_prompt}\n")
    for msg in branch:
        note = " (interrupted)" if msg.status == "interrupted" else ""
        parts.append(f"## {msg.role.capitalize()}{note}\n\n{msg.content}\n")
    return "\n".join(parts)


def chat_json(chat: Chat, messages: list[Message]) -> str:
    """messages: all of the chat's messages, in creation order."""
    return json.dumps({"format": JSON_FORMAT, "version": JSON_VERSION, "chat": asdict(chat),
                       "messages": [asdict(m) for m in messages]}, indent=2)
