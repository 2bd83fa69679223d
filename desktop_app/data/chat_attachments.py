"""The attachments' rows under ChatStore (no Qt): each file's bytes once by sha256
(``attachments``), each message's references in order (``message_attachments``); see
chat_schema's v5 migration for why they are blobs in the chat database.

Every function takes the store's connection; writes run inside the caller's transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from desktop_app.data.attachments import KINDS, Attachment, message_content, sha256_of
from desktop_app.data.chat_schema import Message, attachment_from_row

_SELECT = ("SELECT ma.message_id, ma.kind, ma.name, ma.media_type, ma.sha256, ma.detail,"
           " a.size FROM message_attachments ma JOIN attachments a ON a.sha256 = ma.sha256")
_CHUNK = 500  # ids per IN (...): under SQLite's variable limit


def insert(c: sqlite3.Connection, message_id: int, attachments: Sequence[Attachment]) -> None:
    """The message's attachments, in order; bytes stored once per hash. An attachment
    without bytes must name a hash already stored (one read back from another message)."""
    for position, att in enumerate(attachments):
        if att.kind not in KINDS:
            raise ValueError(f"attachments[{position}].kind must be one of {KINDS}, "
                             f"got {att.kind!r}")
        if att.data is not None:
            if sha256_of(att.data) != att.sha256:
                raise ValueError(f"attachments[{position}].sha256 does not match its bytes")
            c.execute("INSERT OR IGNORE INTO attachments (sha256, size, data) VALUES (?, ?, ?)",
                      (att.sha256, len(att.data), att.data))
        elif c.execute("SELECT 1 FROM attachments WHERE sha256 = ?",
                       (att.sha256,)).fetchone() is None:
            raise ValueError(f"attachments[{position}]: no stored file has sha256 "
                             f"{att.sha256} and no bytes were given")
        c.execute("INSERT INTO message_attachments (message_id, position, kind, name,"
                  " media_type, sha256, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (message_id, position, att.kind, att.name, att.media_type, att.sha256,
                   att.detail))


def fill(conn: sqlite3.Connection, messages: Iterable[Message]) -> None:
    """Sets each message's ``attachments`` (without bytes), in one query per 500."""
    by_id = {m.id: m for m in messages}
    ids = list(by_id)
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        rows = conn.execute(_SELECT + f" WHERE ma.message_id IN ({','.join('?' * len(chunk))})"
                            " ORDER BY ma.message_id, ma.position", chunk)
        for row in rows:
            by_id[row["message_id"]].attachments.append(attachment_from_row(row))


def data(conn: sqlite3.Connection, sha256: str) -> bytes:
    row = conn.execute("SELECT data FROM attachments WHERE sha256 = ?", (sha256,)).fetchone()
    if row is None:
        raise KeyError(f"no attachment with sha256 {sha256}")
    return bytes(row["data"])


def with_data(conn: sqlite3.Connection, attachments: Sequence[Attachment]) -> dict[str, bytes]:
    """sha256 -> bytes of each attachment given."""
    return {a.sha256: data(conn, a.sha256) for a in attachments}


def drop_unused(c: sqlite3.Connection) -> int:
    """Removes the bytes no message references any more (after a delete); how many."""
    return c.execute("DELETE FROM attachments WHERE sha256 NOT IN"
                     " (SELECT sha256 FROM message_attachments)").rowcount


def content(conn: sqlite3.Connection, msg: Message) -> Any:
    """The message's content for the engine: its text alone, or (with attachments) the
    engine's parts: each attachment in order, then the text."""
    return message_content(msg.content, msg.attachments, lambda sha: data(conn, sha))
