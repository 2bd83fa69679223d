"""A chat exported as JSON (chat_export.chat_json) read back in as a new chat (no Qt here).

Two steps, so that a bad file writes nothing::

    parsed = parse_chat_json(text)      # ChatImportError naming what is wrong, else a plan
    chat_id = insert_chat(conn, parsed, now)   # inside one transaction (ChatStore.import_json)

parse_chat_json checks everything the database would later refuse or a view misread: the
format marker and version, every field of the chat and of each message (import_checks:
finite numbers in range, valid Unicode text, the expected nesting; a problem is named by
its path, ``messages[3].metrics.ttft_s``), that ids are unique, that each parent and
candidate group is a message of the same file that came before it (so the tree has no
cycles and can be inserted in file order), and that the active leaf exists.
The ids in the file are the exporting database's; insert_chat gives every message a new
id and remaps parent_id, candidate_group and the active leaf.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import sqlite3
from dataclasses import dataclass, fields
from typing import Any

from desktop_app.data import chat_attachments, tool_records
from desktop_app.data import chat_schema as schema
from desktop_app.data import import_checks as check
from desktop_app.data.attachments import KINDS, Attachment, sha256_of
from desktop_app.data.chat_export import JSON_FORMAT, JSON_VERSION
from desktop_app.data.chat_schema import ROLES, STATUSES, Message
from desktop_app.data.import_checks import ChatImportError
from desktop_app.data.settings import ChatSettings

MAX_TOKEN_ID = 2**32 - 1  # token ids are stored as uint32
_CHAT_FIELDS = {"id", "title", "created_at", "updated_at", "settings", "active_leaf_id"}
_MESSAGE_FIELDS = {f.name for f in fields(Message)}
_TOOL_FIELDS = {"tool_calls", "tool_call"}  # since version 2
_THINKING_DEFAULTS = {"thinking": ""}  # since version 3
_ATTACHMENT_FIELDS = {"kind", "name", "media_type", "sha256", "size", "detail"}  # version 4
_SHA256 = re.compile(r"[0-9a-f]{64}")
# An embedded file's base64 text: a file may be 32 MiB (engine.documents.limits).
MAX_EMBEDDED_CHARS = 48 * 2**20


@dataclass(slots=True)
class ParsedChat:
    """A validated export: ids are still the file's."""

    title: str
    created_at: float
    settings: ChatSettings
    active_leaf_id: int | None
    messages: list[Message]  # parents before children; attachments with their bytes


def parse_chat_json(text: str) -> ParsedChat:
    """Validate a whole export; raises ChatImportError naming the first problem."""
    data = _load(text)
    version = _version(data)
    chat = data["chat"]
    check.fields_exactly(chat, _CHAT_FIELDS, "chat")
    chat_id = check.integer(chat["id"], "chat.id")
    title = check.text(chat["title"], "chat.title")
    created_at = check.timestamp(chat["created_at"], "chat.created_at")
    check.timestamp(chat["updated_at"], "chat.updated_at")
    settings = _settings(chat["settings"])
    files = _files(data.get("attachments", {}))

    messages: list[Message] = []
    seen: dict[int, Message] = {}
    for i, raw in enumerate(data["messages"]):
        if version == 1 and isinstance(raw, dict):
            raw = {**dict.fromkeys(_TOOL_FIELDS), **raw}
        if version <= 2 and isinstance(raw, dict):
            raw = {**_THINKING_DEFAULTS, **raw}
        if version <= 3 and isinstance(raw, dict):
            raw = {"attachments": [], **raw}
        msg = _message(raw, f"messages[{i}]", chat_id, seen, files)
        seen[msg.id] = msg
        messages.append(msg)

    leaf = chat["active_leaf_id"]
    if leaf is not None and (not check.is_int(leaf) or leaf not in seen):
        raise ChatImportError(f"chat.active_leaf_id: {check.show(leaf)} is not one of the "
                              "file's message ids")
    return ParsedChat(title=title, created_at=created_at, settings=settings,
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
        chat_attachments.insert(conn, cur.lastrowid, msg.attachments)
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


def _load(text: str) -> Any:
    try:
        return json.loads(text)
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
    except ValueError:
        # Python reads no integer of more than 4300 digits (sys.get_int_max_str_digits).
        raise ChatImportError("The file holds a number with too many digits.") from None


def _version(data: Any) -> int:
    """The export's format version, once its envelope is one this Folio reads."""
    if not isinstance(data, dict):
        raise ChatImportError(f"This is not a Folio chat export: the file holds a JSON "
                              f"{_kind(data)}, not an object with \"format\": "
                              f"\"{JSON_FORMAT}\".")
    fmt = data.get("format")
    if fmt != JSON_FORMAT:
        found = ("has no \"format\" marker" if fmt is None
                 else f"has \"format\": {check.show(fmt)}")
        raise ChatImportError(f"This is not a Folio chat export: the file {found}, expected "
                              f"\"format\": \"{JSON_FORMAT}\" (is it another app's file?).")
    version = data.get("version")
    if not check.is_int(version):
        raise ChatImportError(f"The export's \"version\" must be an integer, got "
                              f"{check.show(version)}.")
    if version > JSON_VERSION:
        raise ChatImportError(f"The export is format version {version}, written by a newer "
                              f"Folio; this Folio reads version {JSON_VERSION}: update Folio.")
    if version < 1:
        raise ChatImportError(f"The export's format version {version} is not supported "
                              f"(this Folio reads version {JSON_VERSION}).")
    check.fields_exactly(data, {"format", "version", "chat", "messages"}
                         | ({"attachments"} if version >= 4 else set()), "The export")
    if not isinstance(data["chat"], dict):
        check.fail("chat", "an object", data["chat"])
    if not isinstance(data["messages"], list):
        check.fail("messages", "a list", data["messages"])
    return version


def _settings(raw: Any) -> ChatSettings:
    where = "chat.settings"
    if not isinstance(raw, dict):
        check.fail(where, "an object", raw)
    try:
        settings = ChatSettings.from_dict(raw, strict=True)
    # RecursionError: a json_schema nested thousands deep, read by json_mode.parse_schema.
    except (ValueError, TypeError, RecursionError) as err:
        said = str(err)  # ChatSettings repeats the value, which may be a whole file
        raise ChatImportError(f"{where}: {said if len(said) <= 300 else said[:299] + '…'}"
                              ) from None
    for f in fields(settings):
        value = getattr(settings, f.name)
        if check.is_int(value):
            # The chat's settings form shows them in int32 spin boxes (Qt overflows).
            check.integer(value, check.member(where, f.name), hi=check.INT32_MAX)
        else:
            check.json_value(value, check.member(where, f.name))
    return settings


def _files(raw: Any) -> dict[str, bytes]:
    """The embedded files: sha256 -> bytes, each checked against its hash."""
    if not isinstance(raw, dict):
        check.fail("attachments", "an object of sha256 -> base64", raw)
    files: dict[str, bytes] = {}
    for sha, encoded in raw.items():
        where = check.member("attachments", sha)
        if not _SHA256.fullmatch(sha):
            raise ChatImportError(f"{where}: the key must be a sha256 (64 hex digits)")
        if not isinstance(encoded, str) or len(encoded) > MAX_EMBEDDED_CHARS:
            check.fail(where, "base64 text of at most 32 MiB", encoded)
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ChatImportError(f"{where}: not valid base64") from None
        if sha256_of(data) != sha:
            raise ChatImportError(f"{where}: the file's bytes do not match its sha256")
        files[sha] = data
    return files


def _attachments(raw: Any, where: str, files: dict[str, bytes]) -> list[Attachment]:
    if not isinstance(raw, list):
        check.fail(where, "a list", raw)
    out = []
    for n, item in enumerate(raw):
        at = f"{where}[{n}]"
        if not isinstance(item, dict):
            check.fail(at, "an object", item)
        check.fields_exactly(item, _ATTACHMENT_FIELDS, at)
        kind = check.one_of(item["kind"], f"{at}.kind", KINDS)
        name = check.text(item["name"], f"{at}.name")
        if not name.strip():
            check.fail(f"{at}.name", "a file name", name)
        media_type = check.text(item["media_type"], f"{at}.media_type")
        detail = check.text(item["detail"], f"{at}.detail")
        sha = item["sha256"]
        if not isinstance(sha, str) or sha not in files:
            raise ChatImportError(f"{at}.sha256: {check.show(sha)} is not one of the files "
                                  "embedded in \"attachments\"")
        size = check.integer(item["size"], f"{at}.size")
        if size != len(files[sha]):
            raise ChatImportError(f"{at}.size: {size} is not the embedded file's "
                                  f"{len(files[sha])} bytes")
        out.append(Attachment(kind, name, media_type, sha, size, detail, files[sha]))
    return out


def _message(raw: Any, where: str, chat_id: int, seen: dict[int, Message],
             files: dict[str, bytes]) -> Message:
    if not isinstance(raw, dict):
        check.fail(where, "an object", raw)
    check.fields_exactly(raw, _MESSAGE_FIELDS, where)
    mid = check.integer(raw["id"], f"{where}.id")
    if mid in seen:
        raise ChatImportError(f"{where}.id: {mid} is the id of an earlier message too")
    if raw["chat_id"] != chat_id or not check.is_int(raw["chat_id"]):
        check.fail(f"{where}.chat_id", f"the exported chat's id {chat_id}", raw["chat_id"])
    parent = raw["parent_id"]
    if parent is not None and (not check.is_int(parent) or parent not in seen):
        raise ChatImportError(f"{where}.parent_id: {check.show(parent)} is not an earlier "
                              "message of the file")
    role = check.one_of(raw["role"], f"{where}.role", ROLES)
    status = check.one_of(raw["status"], f"{where}.status", STATUSES)
    content = check.text(raw["content"], f"{where}.content")
    thinking = check.text(raw["thinking"], f"{where}.thinking")
    model = check.optional_text(raw["model"], f"{where}.model")
    created_at = check.timestamp(raw["created_at"], f"{where}.created_at")
    ids = raw["token_ids"]
    if ids is not None:
        if not isinstance(ids, list):
            check.fail(f"{where}.token_ids", "a list or null", ids)
        for n, token in enumerate(ids):
            check.integer(token, f"{where}.token_ids[{n}]", hi=MAX_TOKEN_ID)
    metrics = check.metrics(raw["metrics"], f"{where}.metrics")
    group = raw["candidate_group"]
    if group is not None:
        if not check.is_int(group) or (group != mid and group not in seen):
            raise ChatImportError(f"{where}.candidate_group: {check.show(group)} is not "
                                  "this or an earlier message of the file")
        if group != mid and seen[group].parent_id != parent:
            raise ChatImportError(f"{where}.candidate_group: the group's first candidate, "
                                  f"message {group}, has another parent")
    index = raw["candidate_index"]
    if index is not None:
        check.integer(index, f"{where}.candidate_index", hi=check.INT32_MAX)
    try:
        tool_records.check_tool_calls(raw["tool_calls"], where)
        tool_records.check_tool_call(raw["tool_call"], role, where)
    except ValueError as err:
        raise ChatImportError(str(err)) from None
    for name in _TOOL_FIELDS:
        check.json_value(raw[name], f"{where}.{name}")
    attachments = _attachments(raw["attachments"], f"{where}.attachments", files)
    return Message(id=mid, chat_id=0, parent_id=parent, role=role, content=content,
                   token_ids=None if ids is None else list(ids), metrics=metrics,
                   # A reply that was still streaming when exported ends there.
                   status="interrupted" if status == "streaming" else status,
                   created_at=created_at, model=model, candidate_group=group,
                   candidate_index=index, tool_calls=raw["tool_calls"],
                   tool_call=raw["tool_call"], thinking=thinking, attachments=attachments)


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)
