"""A chat as Markdown (one branch, for reading) or JSON (every branch, for keeping).

Pure formatting: ChatStore.export_markdown / export_json fetch the records and call these.
chat_import reads the JSON back (the format marker and version below are its contract).

The JSON never carries a secret: API keys live only in the app settings' server entries,
never in a chat, and a model name that is a URL has any ``user:password@`` part removed,
as has any metrics entry whose name looks like a credential.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import asdict
from pathlib import PurePath
from typing import Any

from desktop_app.data.attachments import IMAGE, Attachment, size_text
from desktop_app.data.chat_schema import Chat, Message

JSON_FORMAT = "folio-chat"
# 2: tool calls (Message.tool_calls) and results ("tool" messages); 3: a reply's thinking
# (Message.thinking), apart from its answer; 4: attachments (each message's references,
# the files' bytes once each in "attachments", base64 by sha256).
JSON_VERSION = 4

# "scheme://user:secret@host" -> "scheme://host"
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s#]*@")
_SECRET_KEY = re.compile(r"(api[_-]?key|authorization|secret|password|bearer)", re.IGNORECASE)


def branch_markdown(chat: Chat, branch: list[Message], folder: str = "") -> str:
    """branch: the messages root..leaf; empty for a chat without messages. folder: the
    folder, beside the .md, its attachments are linked in (markdown_files names them)."""
    names = {id(att): name for att, name in _named(branch)}
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
        links = "".join(_link(att, f"{folder}/{names[id(att)]}" if folder
                              else names[id(att)]) for att in msg.attachments)
        parts.append(f"## {msg.role.capitalize()}{note}\n\n{links}{_thinking(msg)}"
                     f"{msg.content}{calls}\n")
    return "\n".join(parts)


def markdown_files(branch: list[Message]) -> dict[str, Attachment]:
    """The branch's attachments by the file name each gets beside the Markdown: its own
    name, made safe, numbered where two files differ (the same file twice is written
    once)."""
    return {name: att for att, name in _named(branch)}


def _named(branch: list[Message]) -> list[tuple[Attachment, str]]:
    out: list[tuple[Attachment, str]] = []
    taken: dict[str, str] = {}  # name -> sha256
    for msg in branch:
        for att in msg.attachments:
            base = _safe_name(att.name)
            name, n = base, 1
            while name in taken and taken[name] != att.sha256:
                n += 1
                name = f"{PurePath(base).stem}-{n}{PurePath(base).suffix}"
            taken[name] = att.sha256
            out.append((att, name))
    return out


def _safe_name(name: str) -> str:
    cleaned = re.sub(r'[\\/:*?"<>|\x00-\x1f]+', "_", PurePath(name).name).strip(" .")
    return cleaned[:120] or "attachment"


def _link(att: Attachment, target: str) -> str:
    target = target.replace(" ", "%20").replace("(", "%28").replace(")", "%29")
    if att.kind == IMAGE:
        return f"![{att.name}]({target})\n\n"
    detail = f", {att.detail}" if att.detail else ""
    return f"📎 [{att.name}]({target}) ({size_text(att.size)}{detail})\n\n"


def _thinking(msg: Message) -> str:
    """A reply's thinking as a folded block before its answer, never part of it."""
    if not msg.thinking:
        return ""
    return f"<details><summary>Thinking</summary>\n\n{msg.thinking}\n\n</details>\n\n"


def chat_json(chat: Chat, messages: list[Message], files: dict[str, bytes] | None = None
              ) -> str:
    """messages: all of the chat's messages, in creation order; files: the bytes of
    their attachments by sha256, embedded once each as base64."""
    embedded = {sha: base64.b64encode(data).decode("ascii")
                for sha, data in (files or {}).items()}
    return json.dumps({"format": JSON_FORMAT, "version": JSON_VERSION, "chat": asdict(chat),
                       "messages": [_message_dict(m) for m in messages],
                       "attachments": embedded}, indent=2)


def strip_credentials(text: str | None) -> str | None:
    """A URL's ``user:password@`` part removed (model names of remote servers)."""
    return None if text is None else _USERINFO.sub(r"\g<scheme>", text)


def _message_dict(msg: Message) -> dict[str, Any]:
    data = asdict(msg)
    data["model"] = strip_credentials(msg.model)
    data["metrics"] = _scrub(msg.metrics)
    data["attachments"] = [{k: v for k, v in asdict(a).items() if k != "data"}
                           for a in msg.attachments]
    return data


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()
                if not (isinstance(k, str) and _SECRET_KEY.search(k))}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value
