import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from desktop_app.data import chat_store
from desktop_app.data.chat_export import JSON_VERSION
from desktop_app.data.chat_store import ChatStore, default_db_path
from desktop_app.data.settings import ChatSettings

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def _turns(store, chat_id, *texts):
    """Alternating user/assistant messages in a chain; returns them."""
    parent, out = None, []
    for i, text in enumerate(texts):
        msg = store.add_message(chat_id, parent, ("user", "assistant")[i % 2], text)
        out.append(msg)
        parent = msg.id
    return out


def test_pragmas_and_schema_version(store):
    conn = store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert store.schema_version == len(chat_store.MIGRATIONS) == 5


def test_default_path_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FOLIO_DATA_DIR", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "chats.sqlite3"
    with ChatStore() as s:
        assert s.path == tmp_path / "data" / "chats.sqlite3"
    assert (tmp_path / "data" / "chats.sqlite3").is_file()


def test_create_rename_settings_roundtrip(store):
    settings = ChatSettings(system_prompt="Be terse.", temperature=0.2, seed=7, num_candidates=3)
    chat = store.create_chat("First", settings)
    assert chat.title == "First" and chat.settings == settings and chat.active_leaf_id is None
    store.rename_chat(chat.id, "Renamed")
    store.update_chat_settings(chat.id, ChatSettings(top_k=5))
    again = store.get_chat(chat.id)
    assert again.title == "Renamed"
    assert again.settings == ChatSettings(top_k=5)
    with pytest.raises(KeyError):
        store.rename_chat(999, "x")
    with pytest.raises(ValueError, match="title"):
        store.create_chat(None)


def test_message_fields_roundtrip(store):
    chat = store.create_chat("c")
    user = store.add_message(chat.id, None, "user", "Hi")
    metrics = {"num_prompt_tokens": 12, "num_cached_tokens": 8, "ttft_s": 0.25,
               "decode_tok_s": 31.5}
    reply = store.add_message(chat.id, user.id, "assistant", "Hello", token_ids=[1, 70000, 2**31],
                              metrics=metrics, model="smollm2")
    got = store.get_message(reply.id)
    assert got.parent_id == user.id and got.role == "assistant" and got.content == "Hello"
    assert got.token_ids == [1, 70000, 2**31]
    assert got.metrics == metrics and got.model == "smollm2" and got.status == "complete"
    assert store.get_message(user.id).token_ids is None


def test_add_message_validates(store):
    chat = store.create_chat("c")
    other = store.create_chat("d")
    foreign = store.add_message(other.id, None, "user", "x")
    with pytest.raises(ValueError, match="role"):
        store.add_message(chat.id, None, "robot", "x")
    with pytest.raises(ValueError, match="status"):
        store.add_message(chat.id, None, "user", "x", status="done")
    with pytest.raises(ValueError, match="parent_id"):
        store.add_message(chat.id, foreign.id, "assistant", "x")
    with pytest.raises(KeyError):
        store.add_message(12345, None, "user", "x")
    with pytest.raises(ValueError, match="status"):
        store.finish_message(foreign.id, "x", status="streaming")


def test_streaming_partial_then_finish(store):
    chat = store.create_chat("c")
    user = store.add_message(chat.id, None, "user", "Count")
    reply = store.add_message(chat.id, user.id, "assistant", "", status="streaming")
    store.set_partial(reply.id, "1 2")
    store.set_partial(reply.id, "1 2 3")
    assert store.get_message(reply.id).content == "1 2 3"
    store.finish_message(reply.id, "1 2 3 4", [16, 17], {"ttft_s": 0.1})
    done = store.get_message(reply.id)
    assert (done.content, done.token_ids, done.metrics, done.status) == (
        "1 2 3 4", [16, 17], {"ttft_s": 0.1}, "complete")
    store.set_partial(reply.id, "late update")  # ignored once finished
    assert store.get_message(reply.id).content == "1 2 3 4"


def test_tree_siblings_and_paths(store):
    chat = store.create_chat("c")
    u1, a1, u2, a2 = _turns(store, chat.id, "q1", "a1", "q2", "a2")
    a1b = store.add_message(chat.id, u1.id, "assistant", "a1 regenerated")
    u2b = store.add_message(chat.id, a1b.id, "user", "q2 on branch b")
    assert [m.id for m in store.children(u1.id)] == [a1.id, a1b.id]
    assert [m.id for m in store.siblings(a1b.id)] == [a1.id, a1b.id]
    assert store.sibling_position(a1.id) == (0, 2)
    assert store.sibling_position(a1b.id) == (1, 2)
    assert store.sibling_position(u1.id) == (0, 1)
    assert [m.content for m in store.path_to(a2.id)] == ["q1", "a1", "q2", "a2"]
    assert [m.content for m in store.path_to(u2b.id)] == ["q1", "a1 regenerated",
                                                          "q2 on branch b"]
    assert store.active_leaf(chat.id) == u2b.id
    # An edited first user message is a root sibling.
    u1b = store.add_message(chat.id, None, "user", "q1 edited")
    assert [m.id for m in store.roots(chat.id)] == [u1.id, u1b.id]
    assert store.sibling_position(u1b.id) == (1, 2)
    assert u2.parent_id == a1.id


def test_leaf_of_follows_the_branch_last_shown(store):
    chat = store.create_chat("c")
    u1, a1, u2, a2 = _turns(store, chat.id, "q1", "a1", "q2", "a2")
    a1b = store.add_message(chat.id, u1.id, "assistant", "a1b")
    u2b = store.add_message(chat.id, a1b.id, "user", "q2b")
    a2b = store.add_message(chat.id, u2b.id, "assistant", "a2b")
    # The newest branch wins while nothing else was shown since.
    assert store.leaf_of(u1.id) == a2b.id
    # Switching to sibling a1 shows the later turns of THAT branch.
    store.set_active_leaf(chat.id, store.leaf_of(a1.id))
    assert store.active_leaf(chat.id) == a2.id
    assert store.leaf_of(u1.id) == a2.id
    # Switching back returns to branch b's end, not to a1b itself.
    store.set_active_leaf(chat.id, store.leaf_of(a1b.id))
    assert store.active_leaf(chat.id) == a2b.id
    with pytest.raises(ValueError, match="message_id"):
        store.set_active_leaf(store.create_chat("other").id, a2.id)


def test_candidates_share_a_group(store):
    chat = store.create_chat("c")
    user = store.add_message(chat.id, None, "user", "pick one")
    cands = store.add_candidates(chat.id, user.id, 3, model="m")
    assert [(m.candidate_group, m.candidate_index, m.status) for m in cands] == [
        (cands[0].id, 0, "streaming"), (cands[0].id, 1, "streaming"),
        (cands[0].id, 2, "streaming")]
    assert [m.id for m in store.siblings(cands[2].id)] == [m.id for m in cands]
    assert store.active_leaf(chat.id) == cands[0].id
    with pytest.raises(ValueError, match="n must"):
        store.add_candidates(chat.id, user.id, 0)


def test_messages_for_engine(store):
    chat = store.create_chat("c", ChatSettings(system_prompt="You are Folio."))
    u1 = store.add_message(chat.id, None, "user", "Hi", token_ids=[5, 6])
    a1 = store.add_message(chat.id, u1.id, "assistant", "Hello", token_ids=[7])
    u2 = store.add_message(chat.id, a1.id, "user", "Bye")
    assert store.messages_for_engine(u2.id) == [
        {"role": "system", "content": "You are Folio."},
        {"role": "user", "content": "Hi", "token_ids": [5, 6]},
        {"role": "assistant", "content": "Hello", "token_ids": [7]},
        {"role": "user", "content": "Bye"},
    ]
    bare = store.create_chat("no system prompt")
    m = store.add_message(bare.id, None, "user", "x")
    assert store.messages_for_engine(m.id) == [{"role": "user", "content": "x"}]


def test_list_chats_order_and_search(store):
    a = store.create_chat("Paris trip")
    b = store.create_chat("Recipes")
    c = store.create_chat("Empty")
    assert [x.id for x in store.list_chats()] == [c.id, b.id, a.id]
    store.add_message(a.id, None, "user", "What is the capital of FRANCE?")
    assert [x.id for x in store.list_chats()] == [a.id, c.id, b.id]
    assert [x.id for x in store.list_chats("france")] == [a.id]
    assert [x.id for x in store.list_chats("RECIPE")] == [b.id]
    assert [x.id for x in store.list_chats("i")] == [a.id, b.id]  # "Paris", "Recipes"
    assert store.list_chats("100%") == []  # % is literal, not a wildcard
    store.add_message(c.id, None, "user", "50% off_sale")
    assert [x.id for x in store.list_chats("0% off_")] == [c.id]


def test_delete_chat_cascades(store):
    keep = store.create_chat("keep")
    gone = store.create_chat("gone")
    _turns(store, keep.id, "k1", "k2")
    _turns(store, gone.id, "g1", "g2", "g3")
    store.delete_chat(gone.id)
    conn = store._conn
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE chat_id = ?",
                        (gone.id,)).fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2
    assert [x.id for x in store.list_chats()] == [keep.id]
    with pytest.raises(KeyError):
        store.delete_chat(gone.id)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_delete_message_removes_subtree(store):
    chat = store.create_chat("c")
    u1, a1, u2, a2 = _turns(store, chat.id, "q1", "a1", "q2", "a2")
    a1b = store.add_message(chat.id, u1.id, "assistant", "a1b")
    store.set_active_leaf(chat.id, a2.id)
    store.delete_message(a1.id)
    assert [m.id for m in store.children(u1.id)] == [a1b.id]
    with pytest.raises(KeyError):
        store.get_message(a2.id)
    assert store.get_chat(chat.id).active_leaf_id is None
    assert store.active_leaf(chat.id) == a1b.id


def test_interrupted_on_startup(tmp_path):
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as s:
        chat = s.create_chat("c")
        user = s.add_message(chat.id, None, "user", "go")
        reply = s.add_message(chat.id, user.id, "assistant", "", status="streaming")
        s.set_partial(reply.id, "half an ans")
    with ChatStore(path) as s:
        got = s.get_message(reply.id)
        assert (got.status, got.content) == ("interrupted", "half an ans")
        assert s.get_message(user.id).status == "complete"
        assert s.mark_interrupted_on_startup() == 0


def test_export_markdown_and_json(store):
    chat = store.create_chat("Capitals", ChatSettings(system_prompt="Be brief."))
    u1, a1 = _turns(store, chat.id, "Capital of France?", "Paris.")
    a1b = store.add_message(chat.id, u1.id, "assistant", "It is Par", status="interrupted")
    assert store.export_markdown(chat.id) == (
        "# Capitals\n\n**System:** Be brief.\n\n## User\n\nCapital of France?\n\n"
        "## Assistant (interrupted)\n\nIt is Par\n")
    assert store.export_markdown(chat.id, a1.id).endswith("## Assistant\n\nParis.\n")
    data = json.loads(store.export_json(chat.id))
    assert data["format"] == "folio-chat" and data["version"] == JSON_VERSION
    assert data["chat"]["title"] == "Capitals"
    assert data["chat"]["settings"]["system_prompt"] == "Be brief."
    assert data["chat"]["active_leaf_id"] == a1b.id
    assert [(m["id"], m["parent_id"], m["content"], m["status"]) for m in data["messages"]] == [
        (u1.id, None, "Capital of France?", "complete"), (a1.id, u1.id, "Paris.", "complete"),
        (a1b.id, u1.id, "It is Par", "interrupted")]
    assert store.export_markdown(store.create_chat("Empty").id) == "# Empty\n"


def _v1_database_with_data(path):
    conn = sqlite3.connect(path, isolation_level=None)
    chat_store._migrate_v1(conn)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO chats (id, title, created_at, updated_at, settings) VALUES"
                 " (1, 'old', 1.0, 2.0, '{\"temperature\": 0.3, \"retired_key\": 1}')")
    conn.execute("INSERT INTO messages (id, chat_id, parent_id, role, content, status,"
                 " created_at, touched_at) VALUES (1, 1, NULL, 'user', 'hello', 'complete', 1, 1)")
    conn.close()


def test_migrates_empty_v0_database(tmp_path):
    path = tmp_path / "chats.sqlite3"
    sqlite3.connect(path).close()
    with ChatStore(path) as s:
        assert s.schema_version == len(chat_store.MIGRATIONS)
        assert s.list_chats() == []


def test_v2_makes_room_for_tool_messages_keeping_the_tree_and_active_leaves(tmp_path):
    path = tmp_path / "chats.sqlite3"
    _v1_database_with_data(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO messages (id, chat_id, parent_id, role, content, status,"
                 " created_at, touched_at) VALUES (2, 1, 1, 'assistant', 'hi', 'complete', 2, 2)")
    conn.execute("UPDATE chats SET active_leaf_id = 2")
    conn.close()
    with ChatStore(path) as s:
        assert s.schema_version == len(chat_store.MIGRATIONS)
        assert s.get_chat(1).active_leaf_id == 2
        assert [m.id for m in s.path_to(2)] == [1, 2]
        tool = s.add_message(1, 2, "tool", "42", tool_call={
            "id": "c", "name": "add", "server": "calc", "tool": "add", "arguments": "{}",
            "state": "done"})
        assert s.get_message(tool.id).tool_call["server"] == "calc"
        s.delete_message(1)  # the cascade still holds after the rebuild
        assert s.roots(1) == []


def test_v3_keeps_a_reply_s_thinking_apart_from_its_answer(tmp_path):
    path = tmp_path / "chats.sqlite3"
    _v1_database_with_data(path)
    with ChatStore(path) as s:
        assert s.get_message(1).thinking == ""  # older messages have none
        reply = s.add_candidates(1, 1, 1)[0]
        s.set_partial(reply.id, "Hel", "The user greets")
        assert (s.get_message(reply.id).content,
                s.get_message(reply.id).thinking) == ("Hel", "The user greets")
        s.finish_message(reply.id, "Hello!", [1, 2], {}, thinking="The user greets me.")
        done = s.get_message(reply.id)
        assert (done.content, done.thinking) == ("Hello!", "The user greets me.")
        assert s.messages_for_engine(reply.id)[-1]["content"] == "Hello!"
        assert "The user greets me." in s.export_markdown(1)
        assert "<summary>Thinking</summary>" in s.export_markdown(1)
        again = s.import_json(s.export_json(1))
        leaf = s.active_leaf(again.id)
        assert s.get_message(leaf).thinking == "The user greets me."


def test_v4_reads_the_old_default_max_tokens_as_up_to_the_context(tmp_path):
    path = tmp_path / "chats.sqlite3"
    _v1_database_with_data(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE chats SET settings = '{\"max_tokens\": 512}'")
    conn.execute("INSERT INTO chats (id, title, created_at, updated_at, settings) VALUES"
                 " (2, 'chosen', 1.0, 2.0, '{\"max_tokens\": 300}')")
    conn.close()
    with ChatStore(path) as s:
        assert s.get_chat(1).settings.max_tokens is None
        assert s.get_chat(2).settings.max_tokens == 300
        chat = s.create_chat("new", ChatSettings(max_tokens=512))  # chosen since: kept
    with ChatStore(path) as s:
        assert s.get_chat(chat.id).settings.max_tokens == 512


def test_migrates_to_a_later_version_keeping_data(tmp_path, monkeypatch):
    path = tmp_path / "chats.sqlite3"
    _v1_database_with_data(path)

    def v5(conn):
        conn.execute("ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")

    monkeypatch.setattr(chat_store, "MIGRATIONS", [*chat_store.MIGRATIONS, v5])
    with ChatStore(path) as s:
        assert s.schema_version == 6
        chat = s.get_chat(1)
        assert chat.title == "old" and chat.settings == ChatSettings(temperature=0.3)
        assert s.get_message(1).content == "hello"
        assert s._conn.execute("SELECT pinned FROM chats").fetchone()[0] == 0


def test_failed_migration_rolls_back(tmp_path, monkeypatch):
    path = tmp_path / "chats.sqlite3"
    _v1_database_with_data(path)

    def broken_v5(conn):
        conn.execute("ALTER TABLE chats ADD COLUMN pinned INTEGER")
        conn.execute("SELECT no_such_column FROM chats")

    monkeypatch.setattr(chat_store, "MIGRATIONS", [*chat_store.MIGRATIONS, broken_v5])
    with pytest.raises(sqlite3.OperationalError):
        ChatStore(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 5
    assert "pinned" not in [r[1] for r in conn.execute("PRAGMA table_info(chats)")]
    conn.close()


def test_refuses_database_from_newer_version(tmp_path):
    path = tmp_path / "chats.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(RuntimeError, match="newer Folio"):
        ChatStore(path)


_WRITER = """
import sys
from desktop_app.data.chat_store import ChatStore
store = ChatStore(sys.argv[1])
chat = store.create_chat("crash test")
user = store.add_message(chat.id, None, "user", "stream please")
done = store.add_message(chat.id, user.id, "assistant", "")
store.finish_message(done.id, "finished reply", [1, 2, 3], {"ttft_s": 0.5})
user2 = store.add_message(chat.id, done.id, "user", "again")
live = store.add_message(chat.id, user2.id, "assistant", "", status="streaming")
print(live.id, flush=True)
k = 0
while True:
    k += 1
    store.set_partial(live.id, "tok " * k)
    print(k, flush=True)
"""


def test_sigkill_mid_stream_keeps_db_consistent(tmp_path):
    path = tmp_path / "chats.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        live_id = int(proc.stdout.readline())
        last = 0
        while last < 200:
            last = int(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with ChatStore(path) as s:
        chat = s.list_chats()[0]
        path_msgs = s.path_to(s.active_leaf(chat.id))
        assert [(m.content, m.status) for m in path_msgs[:3]] == [
            ("stream please", "complete"), ("finished reply", "complete"), ("again", "complete")]
        assert path_msgs[1].token_ids == [1, 2, 3] and path_msgs[1].metrics == {"ttft_s": 0.5}
        live = s.get_message(live_id)
        assert path_msgs[3].id == live_id and live.status == "interrupted"
        # Every update the writer reported as committed survived, and nothing was torn.
        k = live.content.count("tok ")
        assert k >= last and live.content == "tok " * k


def test_in_memory_store():
    with ChatStore(":memory:") as s:
        chat = s.create_chat("scratch")
        msg = s.add_message(chat.id, None, "user", "hi")
        assert s.active_leaf(chat.id) == msg.id
