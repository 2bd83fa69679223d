"""A chat exported as JSON (chat_export.chat_json) read back in as a new chat (no Qt here).

Two steps, so that a bad file writes nothing::

    parsed = parse_chat_json(text)      # ChatImportError naming what is wrong, else a plan
    chat_id = insert_chat(conn, parsed, now)   # inside one transaction (ChatStore.import_json)

parse_chat_json checks everything the database would later refuse or misread: the format
marker and version, every field of the chat and of each message, that ids are unique, that
each parent and candidate group is a message of the same file that came before it (so the
tree has no cycles and can be inserted in file order), and that the active leaf exists.
The ids in the file are the exporting database's; insert_chat gives every message a new
id and remaps parent_id, candidate_group and the active leaf.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, fields
from typing import Any

from desktop_app.data import chat_schema as schema
from desktop_app.data import tool_records
from desktop_app.data.chat_export import JSON_FORMAT, JSON_VERSION
from desktop_app.data.chat_schema import ROLES, STATUSES, Message
from desktop_app.data.settings import ChatSettings

MAX_TOKEN_ID = 2**32 - 1  # token ids are stored as uint32
_CHAT_FIELDS = {"id", "title", "created_at", "updated_at", "settings", "active_leaf_id"}
_MESSAGE_FIELDS = {f.name for f in fields(Message)}
_TOOL_FIELDS = {"tool_calls", "tool_call"}  # since version 2
_THINKING_DEFAULTS = {"thinking": ""}  # since version 3


class ChatImportError(ValueError):
    """The file is not a chat this Folio can import; the message says why."""


@dataclass(slots=True)
class ParsedChat:
    """A validated export: ids are still the file's."""

    title: str
    created_at: float
    settings: ChatSettings
    active_leaf_id: int | None
    messages: list[Message]  # parents before children


def parse_chat_json(text: str) -> ParsedChat:
    """Validate a whole export; raises ChatImportError naming the first problem."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        # Cut at the end, inside a string, or inside a literal ("nu" of null).
        rest = text[err.pos:].strip()
        truncated = (err.msg.startswith("Unterminated") or len(rest) <= 1
                     or any(word.startswith(rest) for word in ("null", "true", "false")))
        hint = " (the file looks truncated)" if truncated else ""
        raise ChatImportError(f"The file is not valid JSON{hint}: {err.msg} at line "
                              f"{err.lineno}, column {err.colno}.") from None
    except RecursionError:
        raise ChatImportError("The file is not valid JSON: it is nested too deeply.") from None
    if not isinstance(data, dict):
        raise ChatImportError(f"This is not a Folio chat export: the file holds a JSON "
                              f"{_kind(data)}, not an object with \"format\": "
                              f"\"{JSON_FORMAT}\".")
    fmt = data.get("format")
    if fmt != JSON_FORMAT:
        found = "has no \"format\" marker" if fmt is None else f"has \"format\": {fmt!r}"
        raise ChatImportError(f"This is not a Folio chat export: the file {found}, expected "
                              f"\"format\": \"{JSON_FORMAT}\" (is it another app's file?).")
    version = data.get("version")
    if not _is_int(version):
        raise ChatImportError(f"The export's \"version\" must be an integer, got {version!r}.")
    if version > JSON_VERSION:
        raise ChatImportError(f"The export is format version {version}, written by a newer "
                              f"Folio; this Folio reads version {JSON_VERSION}: update Folio.")
    if version < 1:
        raise ChatImportError(f"The export's format version {version} is not supported "
                              f"(this Folio reads version {JSON_VERSION}).")
    extra = sorted(set(data) - {"format", "version", "chat", "messages"})
    if extra:
        raise ChatImportError(f"The export has unknown top-level field(s): {', '.join(extra)}.")
    chat = data.get("chat")
    if not isinstance(chat, dict):
        raise ChatImportError(f"The export's \"chat\" must be an object, got {_kind(chat)}.")
    raw_messages = data.get("messages")
    if not isinstance(raw_messages, list):
        raise ChatImportError(f"The export's \"messages\" must be a list, got "
                              f"{_kind(raw_messages)}.")

    _fields_exactly(chat, _CHAT_FIELDS, "The chat")
    title = chat["title"]
    if not isinstance(title, str):
        raise ChatImportError(f"The chat's title must be a string, got {_kind(title)}.")
    for name in ("created_at", "updated_at"):
        if not _is_number(chat[name]):
            raise ChatImportError(f"The chat's {name} must be a number, got {chat[name]!r}.")
    try:
        settings = ChatSettings.from_dict(chat["settings"], strict=True)
    except (ValueError, TypeError) as err:
        raise ChatImportError(f"The chat's settings are not valid: {err}.") from None
    chat_id = chat["id"]

    messages: list[Message] = []
    seen: dict[int, Message] = {}
    for i, raw in enumerate(raw_messages):
        if version == 1 and isinstance(raw, dict):
            raw = {**dict.fromkeys(_TOOL_FIELDS), **raw}
        if version <= 2 and isinstance(raw, dict):
            raw = {**_THINKING_DEFAULTS, **raw}
        msg = _message(raw, i, chat_id, seen)
        seen[msg.id] = msg
        messages.append(msg)

    leaf = chat["active_leaf_id"]
    if leaf is not None and (not _is_int(leaf) or leaf not in seen):
        raise ChatImportError(f"The chat's active_leaf_id {leaf!r} is not one of its "
                              "messages.")
    return ParsedChat(title=title, created_at=float(chat["created_at"]), settings=settings,
                      active_leaf_id=leaf, messages=messages)


def insert_chat(conn: sqlite3.Connection, parsed: ParsedChat, now: float) -> int:
    """Write a parsed chat as a new chat; call inside one transaction. Returns its id."""
    cur = conn.execute(
        "INSERT INTO chats (title, created_at, updated_at, settings) VALUES (?, ?, ?, ?)",
        (parsed.title, parsed.created_at, now, json.dumps(parsed.settings.to_dict())))
    chat_id = cur.lastrowid
    new_id: dict[int, int] = {}
    for msg in parsed.messages:
        cur = conn.execute(
            "INSERT INTO messages (chat_id, parent_id, role, content, token_ids, metrics,"
            " status, created_at, touched_at, model, candidate_group, candidate_index,"
            " tool_calls, tool_call, thinking)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
            (chat_id, None if msg.parent_id is None else new_id[msg.parent_id], msg.role,
             msg.content, schema.pack_token_ids(msg.token_ids), json.dumps(msg.metrics),
             msg.status, msg.created_at, msg.created_at, msg.model, msg.candidate_index,
             schema.json_or_null(msg.tool_calls), schema.json_or_null(msg.tool_call),
             msg.thinking))
        new_id[msg.id] = cur.lastrowid
    for msg in parsed.messages:
        if msg.candidate_group is not None:
            conn.execute("UPDATE messages SET candidate_group = ? WHERE id = ?",
                         (new_id[msg.candidate_group], new_id[msg.id]))
    if parsed.active_leaf_id is not None:
        leaf = new_id[parsed.active_leaf_id]
        conn.execute("UPDATE chats SET active_leaf_id = ? WHERE id = ?", (leaf, chat_id))
        # The branch that was on screen is the one leaf_of follows (see ChatStore._activate).
        conn.execute(schema.PATH_CTE + " UPDATE messages SET touched_at = ? WHERE id IN"
                     " (SELECT id FROM path)", (leaf, now))
    return chat_id


def _message(raw: Any, i: int, chat_id: Any, seen: dict[int, Message]) -> Message:
    where = f"Message {i + 1}"
    if not isinstance(raw, dict):
        raise ChatImportError(f"{where} must be an object, got {_kind(raw)}.")
    _fields_exactly(raw, _MESSAGE_FIELDS, where)
    mid = raw["id"]
    if not _is_int(mid):
        raise ChatImportError(f"{where}'s id must be an integer, got {mid!r}.")
    where = f"Message {i + 1} (id {mid})"
    if mid in seen:
        raise ChatImportError(f"{where}: the id is used by an earlier message too.")
    if raw["chat_id"] != chat_id:
        raise ChatImportError(f"{where} belongs to chat {raw['chat_id']!r}, not to the "
                              f"exported chat {chat_id!r}.")
    parent = raw["parent_id"]
    if parent is not None and (not _is_int(parent) or parent not in seen):
        raise ChatImportError(f"{where}'s parent_id {parent!r} is not an earlier message "
                              "of the file.")
    if raw["role"] not in ROLES:
        raise ChatImportError(f"{where}'s role must be one of {', '.join(ROLES)}, got "
                              f"{raw['role']!r}.")
    for name in ("content", "thinking"):
        if not isinstance(raw[name], str):
            raise ChatImportError(f"{where}'s {name} must be a string, got "
                                  f"{_kind(raw[name])}.")
    ids = raw["token_ids"]
    if ids is not None and not (isinstance(ids, list) and all(
            _is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in ids)):
        raise ChatImportError(f"{where}'s token_ids must be a list of integers in "
                              f"[0, {MAX_TOKEN_ID}] or null.")
    if not isinstance(raw["metrics"], dict):
        raise ChatImportError(f"{where}'s metrics must be an object, got "
                              f"{_kind(raw['metrics'])}.")
    status = raw["status"]
    if status not in STATUSES:
        raise ChatImportError(f"{where}'s status must be one of {', '.join(STATUSES)}, got "
                              f"{status!r}.")
    if not _is_number(raw["created_at"]):
        raise ChatImportError(f"{where}'s created_at must be a number, got "
                              f"{raw['created_at']!r}.")
    if raw["model"] is not None and not isinstance(raw["model"], str):
        raise ChatImportError(f"{where}'s model must be a string or null.")
    group, index = raw["candidate_group"], raw["candidate_index"]
    if group is not None:
        if not _is_int(group) or (group != mid and group not in seen):
            raise ChatImportError(f"{where}'s candidate_group {group!r} is not this or an "
                                  "earlier message of the file.")
        if group != mid and seen[group].parent_id != parent:
            raise ChatImportError(f"{where} is in candidate group {group}, whose first "
                                  "candidate has another parent.")
    if index is not None and not (_is_int(index) and index >= 0):
        raise ChatImportError(f"{where}'s candidate_index must be an integer >= 0 or null, "
                              f"got {index!r}.")
    try:
        tool_records.check_tool_calls(raw["tool_calls"], where)
        tool_records.check_tool_call(raw["tool_call"], raw["role"], where)
    except ValueError as err:
        raise ChatImportError(f"{err}.") from None
    return Message(id=mid, chat_id=0, parent_id=parent, role=raw["role"],
                   content=raw["content"], token_ids=None if ids is None else list(ids),
                   metrics=raw["metrics"],
                   # A reply that was still streaming when exported ends there.
                   status="interrupted" if status == "streaming" else status,
                   created_at=float(raw["created_at"]), model=raw["model"],
                   candidate_group=group, candidate_index=index,
                   tool_calls=raw["tool_calls"], tool_call=raw["tool_call"],
                   thinking=raw["thinking"])


def _fields_exactly(data: dict[str, Any], expected: set[str], what: str) -> None:
    missing = sorted(expected - set(data))
    if missing:
        raise ChatImportError(f"{what} lacks the field(s): {', '.join(missing)}.")
    extra = sorted(set(data) - expected)
    if extra:
        raise ChatImportError(f"{what} has unknown field(s): {', '.join(extra)}.")


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
