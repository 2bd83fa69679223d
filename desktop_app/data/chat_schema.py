"""The SQLite layer under ChatStore: where the file lives, opening it, tables, migrations,
and the records rows decode to.

Schema changes: append a function to MIGRATIONS; PRAGMA user_version counts those applied.
open_database runs the missing ones, each in one transaction together with its version bump.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from desktop_app.data.attachments import Attachment
from desktop_app.data.settings import ChatSettings, without_old_default

DB_FILE = "chats.sqlite3"
# Keep in step with the CHECK constraints of the messages table (its latest migration).
# A "tool" message is one tool call's result, a child of the reply that made the call.
ROLES = ("system", "user", "assistant", "tool")
STATUSES = ("complete", "streaming", "interrupted")
# Token ids are stored as little-endian uint32 blobs: 4 bytes each instead of ~6 as JSON.
assert array("I").itemsize == 4


@dataclass(slots=True)
class Chat:
    id: int
    title: str
    created_at: float
    updated_at: float  # newest activity
    settings: ChatSettings
    active_leaf_id: int | None


@dataclass(slots=True)
class Message:
    id: int
    chat_id: int
    parent_id: int | None
    role: str
    content: str
    token_ids: list[int] | None
    metrics: dict[str, Any] = field(default_factory=dict)
    status: str = "complete"
    created_at: float = 0.0
    model: str | None = None
    candidate_group: int | None = None
    candidate_index: int | None = None
    # An assistant reply's tool calls: [{"id", "name", "arguments" (JSON text)}].
    tool_calls: list[dict[str, Any]] | None = None
    # A tool message's call (data.tool_records): which call it answers, on which server,
    # and its state (pending, done, error, denied).
    tool_call: dict[str, Any] | None = None
    # A reply's thinking (reasoning models), kept apart from its answer (``content``).
    thinking: str = ""
    # Its attached images and documents, in order, without their bytes (v5).
    attachments: list[Attachment] = field(default_factory=list)


def _message_columns(table: str, roles: tuple[str, ...]) -> str:
    """The messages table's columns up to candidate_index, as v1 made them (``table``: the
    name its parent_id refers to, ``roles``: what its CHECK allows)."""
    allowed = ", ".join(f"'{r}'" for r in roles)
    return f"""
            id INTEGER PRIMARY KEY,
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            parent_id INTEGER REFERENCES {table}(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ({allowed})),
            content TEXT NOT NULL,
            token_ids BLOB,
            metrics TEXT NOT NULL DEFAULT '{{}}',
            status TEXT NOT NULL CHECK (status IN ('complete', 'streaming', 'interrupted')),
            created_at REAL NOT NULL,
            touched_at REAL NOT NULL,
            model TEXT,
            candidate_group INTEGER,
            candidate_index INTEGER"""


_MESSAGE_INDEXES = (
    "CREATE INDEX messages_by_chat ON messages(chat_id)",
    "CREATE INDEX messages_by_parent ON messages(parent_id)",
    "CREATE INDEX messages_streaming ON messages(status) WHERE status = 'streaming'",
)


def _migrate_v1(conn: sqlite3.Connection) -> None:
    # One execute per statement: executescript would commit mid-migration.
    for statement in ("""
        CREATE TABLE chats (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            settings TEXT NOT NULL,
            active_leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL
        )""", """
        CREATE TABLE messages (""" + _message_columns("messages", ROLES[:3]) + ")",
        *_MESSAGE_INDEXES,
    ):
        conn.execute(statement)


def _migrate_v2(conn: sqlite3.Connection) -> None:
    """Tool calls: the "tool" role and the tool_calls / tool_call columns. SQLite cannot
    change a CHECK constraint in place, so the messages table is rebuilt; the chats'
    active leaves are put back after the old table's ON DELETE SET NULL clears them."""
    leaves = conn.execute("SELECT id, active_leaf_id FROM chats"
                          " WHERE active_leaf_id IS NOT NULL").fetchall()
    for statement in (
        "CREATE TABLE messages_v2 (" + _message_columns("messages_v2", ROLES)
        + ", tool_calls TEXT, tool_call TEXT)",
        "INSERT INTO messages_v2 (id, chat_id, parent_id, role, content, token_ids, metrics,"
        " status, created_at, touched_at, model, candidate_group, candidate_index)"
        " SELECT id, chat_id, parent_id, role, content, token_ids, metrics, status,"
        " created_at, touched_at, model, candidate_group, candidate_index FROM messages"
        " ORDER BY id",
        "DROP TABLE messages",
        "ALTER TABLE messages_v2 RENAME TO messages",
        *_MESSAGE_INDEXES,
    ):
        conn.execute(statement)
    conn.executemany("UPDATE chats SET active_leaf_id = ? WHERE id = ?",
                     [(leaf, chat) for chat, leaf in leaves])


def _migrate_v3(conn: sqlite3.Connection) -> None:
    """Reasoning output: a reply's thinking in a column of its own (empty for older ones)."""
    conn.execute("ALTER TABLE messages ADD COLUMN thinking TEXT NOT NULL DEFAULT ''")


def _migrate_v4(conn: sqlite3.Connection) -> None:
    """Max tokens "up to the context": a chat saved with the old default (512) gets the
    new one (data.settings explains why a stored 512 is read as the default)."""
    rows = conn.execute("SELECT id, settings FROM chats").fetchall()
    changed = []
    for chat_id, text in rows:
        try:
            settings = json.loads(text)
        except ValueError:
            continue  # read leniently later, as before
        if isinstance(settings, dict) and without_old_default(settings) is not settings:
            changed.append((json.dumps(without_old_default(settings)), chat_id))
    conn.executemany("UPDATE chats SET settings = ? WHERE id = ?", changed)


def _migrate_v5(conn: sqlite3.Connection) -> None:
    """Attachments: each file's bytes once, by content hash (``attachments``), and which
    message holds which, in order, under what name (``message_attachments``). Blobs in
    this database rather than files beside it: a message and its attachments are written
    in one transaction, so a crash never leaves a message pointing at a missing file or a
    file nothing points at; deleting a chat drops the bytes no other message references in
    that same transaction (the foreign key refuses dropping bytes still referenced); and
    the chats stay one file to back up or move. Files are at most 32 MiB, far under
    SQLite's blob limit."""
    for statement in ("""
        CREATE TABLE attachments (
            sha256 TEXT PRIMARY KEY,
            size INTEGER NOT NULL,
            data BLOB NOT NULL
        )""", """
        CREATE TABLE message_attachments (
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('image', 'file')),
            name TEXT NOT NULL,
            media_type TEXT NOT NULL,
            sha256 TEXT NOT NULL REFERENCES attachments(sha256),
            detail TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (message_id, position)
        )""",
        "CREATE INDEX message_attachments_by_hash ON message_attachments(sha256)",
    ):
        conn.execute(statement)


Migration = Callable[[sqlite3.Connection], None]
# Index i upgrades a database from user_version i to i + 1; v6 is one more function here.
# A migration that rebuilds the messages table (as v2 did) must save and put back
# message_attachments: dropping the old table cascades to its rows.
MIGRATIONS: list[Migration] = [_migrate_v1, _migrate_v2, _migrate_v3, _migrate_v4,
                               _migrate_v5]

# The ancestors of message ? (itself at depth 0, the root deepest).
PATH_CTE = """WITH RECURSIVE path(id, parent_id, depth) AS (
    SELECT id, parent_id, 0 FROM messages WHERE id = ?
    UNION ALL
    SELECT m.id, m.parent_id, path.depth + 1 FROM messages m JOIN path ON m.id = path.parent_id
)"""


def default_db_path() -> Path:
    override = os.environ.get("FOLIO_DATA_DIR")
    base = Path(override) if override else Path(platformdirs.user_data_dir("folio"))
    return base / DB_FILE


def open_database(path: Path, migrations: list[Migration]) -> sqlite3.Connection:
    """Connects (creating the folder and file as needed) and brings the schema up to date."""
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)
    # Autocommit mode: transactions are explicit (see transaction), so DDL migrations are
    # atomic too.
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    migrate(conn, migrations, path)
    return conn


def user_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection, migrations: list[Migration], path: Path) -> None:
    """path only names the database in the error for one written by a newer Folio."""
    version = user_version(conn)
    if version > len(migrations):
        raise RuntimeError(f"{path} was written by a newer Folio (schema {version},"
                           f" this version knows {len(migrations)}): update Folio")
    for target, step in enumerate(migrations[version:], start=version + 1):
        with transaction(conn) as c:
            step(c)
            c.execute(f"PRAGMA user_version = {target}")


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def pack_token_ids(token_ids: list[int] | None) -> bytes | None:
    if token_ids is None:
        return None
    packed = array("I", token_ids)
    if sys.byteorder == "big":
        packed.byteswap()  # stored little-endian so a database moves between machines
    return packed.tobytes()


def unpack_token_ids(blob: bytes | None) -> list[int] | None:
    if blob is None:
        return None
    ids = array("I")
    ids.frombytes(blob)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tolist()


def chat_from_row(row: sqlite3.Row) -> Chat:
    return Chat(id=row["id"], title=row["title"], created_at=row["created_at"],
                updated_at=row["updated_at"],
                settings=ChatSettings.from_dict(json.loads(row["settings"]), strict=False),
                active_leaf_id=row["active_leaf_id"])


def message_from_row(row: sqlite3.Row) -> Message:
    return Message(id=row["id"], chat_id=row["chat_id"], parent_id=row["parent_id"],
                   role=row["role"], content=row["content"],
                   token_ids=unpack_token_ids(row["token_ids"]),
                   metrics=json.loads(row["metrics"]), status=row["status"],
                   created_at=row["created_at"], model=row["model"],
                   candidate_group=row["candidate_group"], candidate_index=row["candidate_index"],
                   tool_calls=_json_or_none(row["tool_calls"]),
                   tool_call=_json_or_none(row["tool_call"]), thinking=row["thinking"])


def attachment_from_row(row: sqlite3.Row) -> Attachment:
    return Attachment(kind=row["kind"], name=row["name"], media_type=row["media_type"],
                      sha256=row["sha256"], size=row["size"], detail=row["detail"])


def _json_or_none(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def json_or_null(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)
