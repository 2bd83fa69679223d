"""Chats and their message trees in SQLite (no Qt here; use from the GUI thread only).

A chat's messages form a tree: each message has a parent (None for the first turn), and
alternates of a turn (regenerations, the n candidates of one request, edited user messages)
are siblings sharing a parent. The chat remembers its *active leaf*: the end of the branch
on screen. Typical turn::

    store = ChatStore()                                # default_db_path(); marks dead streams
    chat = store.create_chat("New chat", ChatSettings())
    user = store.add_message(chat.id, None, "user", "Hi")         # becomes the active leaf
    messages = store.messages_for_engine(user.id)      # system prompt + branch, for the engine
    reply = store.add_message(chat.id, user.id, "assistant", "", status="streaming")
    store.set_partial(reply.id, "Hel")                 # a few times a second while streaming
    store.finish_message(reply.id, "Hello!", token_ids, metrics)

Candidates: ``add_candidates(chat_id, parent_id, n)`` makes n streaming siblings sharing a
candidate group. Switching branch: ``siblings(id)`` / ``sibling_position(id)`` for "2 / 3",
then ``set_active_leaf(chat_id, leaf_of(sibling_id))`` shows that branch's later turns.

Every write is its own short transaction (WAL, synchronous=NORMAL): a crash loses at most
the last partial update, and the next open turns 'streaming' messages into 'interrupted'.
A message's attachments (images, documents) are stored by content hash, once however many
messages hold them, and dropped with the last message that does (chat_attachments).
Tables, migrations and row records live in chat_schema; Markdown/JSON exports in chat_export,
the JSON import in chat_import.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from desktop_app.data import chat_attachments, chat_import, tool_records
from desktop_app.data import chat_schema as schema
from desktop_app.data.attachments import Attachment
from desktop_app.data.chat_export import branch_markdown, chat_json, markdown_files
from desktop_app.data.chat_schema import DB_FILE as DB_FILE  # re-exported from before the split
from desktop_app.data.chat_schema import MIGRATIONS, ROLES, STATUSES, Chat, Message, default_db_path
from desktop_app.data.chat_schema import _migrate_v1 as _migrate_v1  # tests build v1 databases
from desktop_app.data.settings import ChatSettings


class ChatStore:
    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self._last_stamp = 0.0
        # Read here at call time, so swapping chat_store.MIGRATIONS (tests add a v2) works.
        self._conn = schema.open_database(self.path, MIGRATIONS)
        self.mark_interrupted_on_startup()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return schema.user_version(self._conn)

    # ---- chats -------------------------------------------------------------------------

    def create_chat(self, title: str, settings: ChatSettings | None = None) -> Chat:
        _check_title(title)
        settings = settings if settings is not None else ChatSettings()
        now = self._stamp()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO chats (title, created_at, updated_at, settings) VALUES (?, ?, ?, ?)",
                (title, now, now, json.dumps(settings.to_dict())))
        return self.get_chat(cur.lastrowid)

    def get_chat(self, chat_id: int) -> Chat:
        row = self._conn.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise KeyError(f"no chat with id {chat_id}")
        return schema.chat_from_row(row)

    def rename_chat(self, chat_id: int, title: str) -> None:
        _check_title(title)
        self._update_one("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id), chat_id)

    def update_chat_settings(self, chat_id: int, settings: ChatSettings) -> None:
        self._update_one("UPDATE chats SET settings = ? WHERE id = ?",
                         (json.dumps(settings.to_dict()), chat_id), chat_id)

    def delete_chat(self, chat_id: int) -> None:
        """Deletes the chat and, by cascade, all its messages; an attachment's bytes go
        too unless another chat's message still holds the same file."""
        with self._tx() as c:
            if c.execute("DELETE FROM chats WHERE id = ?", (chat_id,)).rowcount != 1:
                raise KeyError(f"no chat with id {chat_id}")
            chat_attachments.drop_unused(c)

    def list_chats(self, search: str = "") -> list[Chat]:
        """Newest activity first; search matches titles and message text, ignoring case."""
        search = search.strip()
        if not search:
            rows = self._conn.execute("SELECT * FROM chats ORDER BY updated_at DESC, id DESC")
            return [schema.chat_from_row(r) for r in rows]
        pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._conn.execute(
            "SELECT * FROM chats c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS ("
            " SELECT 1 FROM messages m WHERE m.chat_id = c.id AND m.content LIKE ?1 ESCAPE '\\')"
            " ORDER BY updated_at DESC, id DESC", (pattern,))
        return [schema.chat_from_row(r) for r in rows]

    # ---- messages ----------------------------------------------------------------------

    def add_message(self, chat_id: int, parent_id: int | None, role: str, content: str,
                    token_ids: list[int] | None = None, status: str = "complete",
                    metrics: dict[str, Any] | None = None, *, model: str | None = None,
                    candidate_group: int | None = None, candidate_index: int | None = None,
                    activate: bool = True, tool_call: dict[str, Any] | None = None,
                    attachments: Sequence[Attachment] = ()) -> Message:
        """Append a message under parent_id (None: a first turn). activate: make it the
        chat's active leaf. tool_call: a "tool" message's call (data.tool_records).
        attachments: its images and documents (with their bytes, or without them when
        the same file is stored already: an edited message keeps its attachments)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if not isinstance(content, str):
            raise ValueError(f"content must be a string, got {type(content).__name__}")
        if (role == "tool") != (tool_call is not None):
            raise ValueError("tool_call must be given for a tool message and only for one")
        self.get_chat(chat_id)
        if parent_id is not None and self.get_message(parent_id).chat_id != chat_id:
            raise ValueError(f"parent_id {parent_id} belongs to another chat than {chat_id}")
        now = self._stamp()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO messages (chat_id, parent_id, role, content, token_ids, metrics,"
                " status, created_at, touched_at, model, candidate_group, candidate_index,"
                " tool_call) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (chat_id, parent_id, role, content, schema.pack_token_ids(token_ids),
                 json.dumps(metrics or {}), status, now, now, model, candidate_group,
                 candidate_index, schema.json_or_null(tool_call)))
            chat_attachments.insert(c, cur.lastrowid, attachments)
            c.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))
            if activate:
                self._activate(c, chat_id, cur.lastrowid, now)
        return self.get_message(cur.lastrowid)

    def add_candidates(self, chat_id: int, parent_id: int, n: int, *,
                       model: str | None = None) -> list[Message]:
        """n empty streaming assistant siblings in one candidate group; the first is active."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        first = self.add_message(chat_id, parent_id, "assistant", "", status="streaming",
                                 model=model, candidate_index=0)
        with self._tx() as c:
            c.execute("UPDATE messages SET candidate_group = ? WHERE id = ?", (first.id, first.id))
        rest = [self.add_message(chat_id, parent_id, "assistant", "", status="streaming",
                                 model=model, candidate_group=first.id, candidate_index=i,
                                 activate=False) for i in range(1, n)]
        return [self.get_message(first.id), *rest]

    def get_message(self, message_id: int) -> Message:
        row = self._conn.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(f"no message with id {message_id}")
        return self._filled([schema.message_from_row(row)])[0]

    def attachment_data(self, sha256: str) -> bytes:
        """The bytes of a stored attachment (KeyError when none has that hash)."""
        return chat_attachments.data(self._conn, sha256)

    def set_partial(self, message_id: int, content: str, thinking: str = "") -> None:
        """Replace a streaming message's text; cheap enough for several calls a second."""
        with self._tx() as c:
            c.execute("UPDATE messages SET content = ?, thinking = ? WHERE id = ?"
                      " AND status = 'streaming'", (content, thinking, message_id))

    def finish_message(self, message_id: int, content: str, token_ids: list[int] | None = None,
                       metrics: dict[str, Any] | None = None, status: str = "complete",
                       tool_calls: list[dict[str, Any]] | None = None,
                       thinking: str = "") -> None:
        """tool_calls: the calls the reply made, [{"id", "name", "arguments"}]; thinking:
        a reasoning model's thinking before its answer (``content``)."""
        if status not in ("complete", "interrupted"):
            raise ValueError(f"status must be 'complete' or 'interrupted', got {status!r}")
        now = self._stamp()
        with self._tx() as c:
            row = c.execute("SELECT chat_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise KeyError(f"no message with id {message_id}")
            c.execute("UPDATE messages SET content = ?, token_ids = ?, metrics = ?, status = ?,"
                      " tool_calls = ?, thinking = ? WHERE id = ?",
                      (content, schema.pack_token_ids(token_ids), json.dumps(metrics or {}),
                       status, schema.json_or_null(tool_calls or None), thinking, message_id))
            c.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, row["chat_id"]))

    def set_tool_result(self, message_id: int, content: str, tool_call: dict[str, Any]) -> None:
        """A tool message's result (content) and its call's new state."""
        msg = self.get_message(message_id)
        if msg.role != "tool":
            raise ValueError(f"message {message_id} is not a tool message")
        with self._tx() as c:
            c.execute("UPDATE messages SET content = ?, tool_call = ? WHERE id = ?",
                      (content, schema.json_or_null(tool_call), message_id))
            c.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (self._stamp(), msg.chat_id))

    def delete_message(self, message_id: int) -> None:
        """Deletes the message and its whole subtree."""
        msg = self.get_message(message_id)
        with self._tx() as c:
            c.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            chat_attachments.drop_unused(c)
            c.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (self._stamp(), msg.chat_id))

    def mark_interrupted_on_startup(self) -> int:
        """Messages left 'streaming' by a previous run become 'interrupted'; returns how many."""
        with self._tx() as c:
            return c.execute("UPDATE messages SET status = 'interrupted'"
                             " WHERE status = 'streaming'").rowcount

    # ---- the tree ----------------------------------------------------------------------

    def roots(self, chat_id: int) -> list[Message]:
        rows = self._conn.execute("SELECT * FROM messages WHERE chat_id = ? AND parent_id IS NULL"
                                  " ORDER BY id", (chat_id,))
        return self._filled(schema.message_from_row(r) for r in rows)

    def children(self, message_id: int) -> list[Message]:
        rows = self._conn.execute("SELECT * FROM messages WHERE parent_id = ? ORDER BY id",
                                  (message_id,))
        return self._filled(schema.message_from_row(r) for r in rows)

    def siblings(self, message_id: int) -> list[Message]:
        """The alternates of this turn, itself included, oldest first."""
        msg = self.get_message(message_id)
        return self.children(msg.parent_id) if msg.parent_id is not None else self.roots(
            msg.chat_id)

    def sibling_position(self, message_id: int) -> tuple[int, int]:
        """(index among its siblings, number of siblings), e.g. (1, 3) shows as "2 / 3"."""
        ids = [m.id for m in self.siblings(message_id)]
        return ids.index(message_id), len(ids)

    def path_to(self, leaf_id: int) -> list[Message]:
        rows = self._conn.execute(schema.PATH_CTE + " SELECT m.* FROM path JOIN messages m"
                                  " ON m.id = path.id ORDER BY path.depth DESC", (leaf_id,))
        path = self._filled(schema.message_from_row(r) for r in rows)
        if not path:
            raise KeyError(f"no message with id {leaf_id}")
        return path

    def leaf_of(self, message_id: int) -> int:
        """Follow the most recently active (or created) child down to a leaf."""
        current = self.get_message(message_id).id
        while True:
            row = self._conn.execute("SELECT id FROM messages WHERE parent_id = ?"
                                     " ORDER BY touched_at DESC, id DESC LIMIT 1",
                                     (current,)).fetchone()
            if row is None:
                return current
            current = row["id"]

    def active_leaf(self, chat_id: int) -> int | None:
        """The end of the branch on screen; None for a chat without messages."""
        chat = self.get_chat(chat_id)
        if chat.active_leaf_id is not None:
            return chat.active_leaf_id
        row = self._conn.execute("SELECT id FROM messages WHERE chat_id = ? AND parent_id IS NULL"
                                 " ORDER BY touched_at DESC, id DESC LIMIT 1",
                                 (chat_id,)).fetchone()
        return None if row is None else self.leaf_of(row["id"])

    def set_active_leaf(self, chat_id: int, message_id: int) -> None:
        if self.get_message(message_id).chat_id != chat_id:
            raise ValueError(f"message_id {message_id} is not in chat {chat_id}")
        with self._tx() as c:
            self._activate(c, chat_id, message_id, self._stamp())

    def messages_for_engine(self, leaf_id: int, model: str | None = None
                            ) -> list[dict[str, Any]]:
        """The chat's system prompt, then the branch root..leaf, as engine chat messages
        (engine.chat.request): "token_ids" where the message's exact tokens are known,
        "reasoning_content" where a reply has thinking (the prompt builder shows it as the
        model's template wants). ``model``: the model the prompt is for; a reply another
        model wrote goes as text, its ids being that model's vocabulary. A message with
        attachments has the engine's content parts (chat_attachments.content)."""
        path = self.path_to(leaf_id)
        prompt = self.get_chat(path[0].chat_id).settings.system_prompt
        out: list[dict[str, Any]] = [{"role": "system", "content": prompt}] if prompt else []
        for msg in path:
            item: dict[str, Any] = {"role": msg.role,
                                    "content": chat_attachments.content(self._conn, msg)}
            if msg.token_ids is not None and (model is None or msg.model in (None, model)):
                item["token_ids"] = msg.token_ids
            if msg.thinking:
                item["reasoning_content"] = msg.thinking
            out.append(tool_records.for_engine(msg, item))
        return out

    # ---- export ------------------------------------------------------------------------

    def export_markdown(self, chat_id: int, leaf_id: int | None = None,
                        folder: str = "") -> str:
        """One branch (the active one by default) as Markdown; ``folder``: where its
        attachments are written beside it (``markdown_attachments``), linked from it."""
        chat = self.get_chat(chat_id)
        leaf_id = leaf_id if leaf_id is not None else self.active_leaf(chat_id)
        return branch_markdown(chat, self.path_to(leaf_id) if leaf_id is not None else [],
                               folder)

    def markdown_attachments(self, chat_id: int, leaf_id: int | None = None
                             ) -> dict[str, bytes]:
        """The files export_markdown links: their names in the folder -> bytes."""
        leaf_id = leaf_id if leaf_id is not None else self.active_leaf(chat_id)
        branch = self.path_to(leaf_id) if leaf_id is not None else []
        return {name: self.attachment_data(att.sha256)
                for name, att in markdown_files(branch).items()}

    def export_json(self, chat_id: int) -> str:
        """The whole chat with every branch, messages in creation order."""
        chat = self.get_chat(chat_id)
        rows = self._conn.execute("SELECT * FROM messages WHERE chat_id = ? ORDER BY id",
                                  (chat_id,))
        messages = self._filled(schema.message_from_row(r) for r in rows)
        hashes = {a.sha256 for m in messages for a in m.attachments}
        return chat_json(chat, messages, {h: self.attachment_data(h) for h in sorted(hashes)})

    def import_json(self, text: str) -> Chat:
        """An export_json text back in as a new chat, every id new. The whole file is
        checked first and written in one transaction: a bad file raises
        chat_import.ChatImportError (a ValueError naming the problem) and writes nothing."""
        parsed = chat_import.parse_chat_json(text)
        with self._tx() as c:
            # Read back inside the transaction: should that fail, nothing stays either.
            return self.get_chat(chat_import.insert_chat(c, parsed, self._stamp()))

    # ---- internals ---------------------------------------------------------------------

    def _filled(self, messages) -> list[Message]:
        """The messages with their attachments read."""
        out = list(messages)
        chat_attachments.fill(self._conn, out)
        return out

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return schema.transaction(self._conn)

    def _stamp(self) -> float:
        # Strictly increasing, so "newest first" orders are exact even within one clock tick.
        self._last_stamp = max(time.time(), self._last_stamp + 1e-6)
        return self._last_stamp

    def _activate(self, c: sqlite3.Connection, chat_id: int, leaf_id: int, now: float) -> None:
        c.execute("UPDATE chats SET active_leaf_id = ? WHERE id = ?", (leaf_id, chat_id))
        # leaf_of follows touched_at, so the branch shown last is the one a switch returns to.
        c.execute(schema.PATH_CTE + " UPDATE messages SET touched_at = ? WHERE id IN"
                  " (SELECT id FROM path)", (leaf_id, now))

    def _update_one(self, sql: str, args: tuple[Any, ...], chat_id: int) -> None:
        with self._tx() as c:
            if c.execute(sql, args).rowcount != 1:
                raise KeyError(f"no chat with id {chat_id}")


def _check_title(title: str) -> None:
    if not isinstance(title, str):
        raise ValueError(f"title must be a string, got {type(title).__name__}")
