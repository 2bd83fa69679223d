"""JSON export and import of whole chats: round trip, remapped ids, rejected files."""

from __future__ import annotations

import json
import sqlite3

import pytest

from desktop_app.data.chat_export import JSON_FORMAT, JSON_VERSION, strip_credentials
from desktop_app.data.chat_import import ChatImportError, parse_chat_json
from desktop_app.data.chat_store import ChatStore
from desktop_app.data.settings import ChatSettings


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def branchy_chat(store: ChatStore) -> int:
    """A chat with two roots, a regenerated turn, 3 candidates, an edited user turn, token
    ids, metrics and an interrupted reply; the open branch is not the newest one."""
    settings = ChatSettings(system_prompt="Be brief.", temperature=0.3, seed=7,
                            num_candidates=3)
    chat = store.create_chat("Branches", settings)
    u1 = store.add_message(chat.id, None, "user", "Capital of France?", token_ids=[1, 2, 3])
    a1 = store.add_message(chat.id, u1.id, "assistant", "Paris.", token_ids=[4, 5],
                           metrics={"ttft_s": 0.1, "decode_tok_s": 40.0}, model="tiny")
    store.add_message(chat.id, u1.id, "assistant", "It is Par", status="interrupted",
                      token_ids=[6])
    u2 = store.add_message(chat.id, a1.id, "user", "And Italy?", token_ids=[])
    cands = store.add_candidates(chat.id, u2.id, 3, model="tiny")
    for i, c in enumerate(cands):
        store.finish_message(c.id, f"Rome {i}", token_ids=[100 + i, 2**32 - 1 - i],
                             metrics={"num_generated_tokens": 2})
    store.add_message(chat.id, a1.id, "user", "And Spain? (edited)")
    store.add_message(chat.id, None, "user", "A second root", token_ids=None)
    store.set_active_leaf(chat.id, cands[1].id)
    return chat.id


def tree(store: ChatStore, chat_id: int) -> dict:
    """Everything of a chat but its ids, with ids turned into positions (creation order)."""
    chat = store.get_chat(chat_id)
    rows = json.loads(store.export_json(chat_id))["messages"]
    pos = {m["id"]: i for i, m in enumerate(rows)}
    messages = [
        {**{k: v for k, v in m.items() if k not in ("id", "chat_id")},
         "parent_id": pos.get(m["parent_id"]), "candidate_group": pos.get(m["candidate_group"])}
        for m in rows]
    branch = [pos[m.id] for m in store.path_to(store.active_leaf(chat_id))]
    return {"title": chat.title, "settings": chat.settings, "created_at": chat.created_at,
            "messages": messages, "open_branch": branch}


def test_round_trip_is_equal_with_new_ids(store):
    chat_id = branchy_chat(store)
    text = store.export_json(chat_id)
    copy = store.import_json(text)
    assert copy.id != chat_id
    assert tree(store, copy.id) == tree(store, chat_id)
    old_ids = {m["id"] for m in json.loads(text)["messages"]}
    new = json.loads(store.export_json(copy.id))["messages"]
    assert not old_ids & {m["id"] for m in new}
    assert all(m["chat_id"] == copy.id for m in new)
    # The candidates are still one group, ordered, with their exact token ids.
    group = [m for m in new if m["candidate_group"] is not None]
    assert len({m["candidate_group"] for m in group}) == 1
    assert [m["candidate_index"] for m in group] == [0, 1, 2]
    assert group[2]["token_ids"] == [102, 2**32 - 3]
    # The open branch is the one the export had open, and the engine gets the same prompt.
    assert [m["content"] for m in store.messages_for_engine(store.active_leaf(copy.id))] == [
        m["content"] for m in store.messages_for_engine(store.active_leaf(chat_id))]
    # Importing the copy's export gives the same tree again (a second round trip).
    assert tree(store, store.import_json(store.export_json(copy.id)).id) == tree(store, chat_id)
    # The imported chat is the newest one in the list.
    assert store.list_chats()[0].id != chat_id


def test_empty_chat_round_trips(store):
    chat = store.create_chat("Empty")
    copy = store.import_json(store.export_json(chat.id))
    assert store.roots(copy.id) == [] and store.active_leaf(copy.id) is None
    assert copy.title == "Empty"


def test_streaming_reply_comes_back_interrupted(store):
    chat = store.create_chat("c")
    u = store.add_message(chat.id, None, "user", "go")
    r = store.add_message(chat.id, u.id, "assistant", "hal", status="streaming")
    copy = store.import_json(store.export_json(chat.id))
    leaf = store.get_message(store.active_leaf(copy.id))
    assert (leaf.content, leaf.status) == ("hal", "interrupted")
    assert store.get_message(r.id).status == "streaming"  # the original is untouched


def test_export_never_carries_credentials(store):
    chat = store.create_chat("c")
    store.add_message(chat.id, None, "assistant", "hi",
                      model="remote:https://me:sk-SECRET@gpu-box:8000/v1#llama",
                      metrics={"ttft_s": 0.1, "api_key": "sk-SECRET",
                               "nested": {"Authorization": "Bearer sk-SECRET"}})
    text = store.export_json(chat.id)
    assert "SECRET" not in text
    message = json.loads(text)["messages"][0]
    assert message["model"] == "remote:https://gpu-box:8000/v1#llama"
    assert message["metrics"] == {"ttft_s": 0.1, "nested": {}}
    assert strip_credentials("http://host/v1") == "http://host/v1"


def _export(store) -> dict:
    return json.loads(store.export_json(branchy_chat(store)))


def _bad(store, mutate) -> str:
    data = _export(store)
    mutate(data)
    return json.dumps(data)


def _set(path, value):
    def mutate(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


REJECTED = {
    "not json": (lambda s: "hello", "not valid JSON"),
    "a list": (lambda s: "[1, 2]", "JSON list"),
    "another app": (lambda s: json.dumps({"conversations": [], "app": "OtherChat"}),
                    "no \"format\" marker"),
    "another format": (lambda s: _bad(s, _set(["format"], "chatgpt-export")),
                       "'chatgpt-export'"),
    "newer version": (lambda s: _bad(s, _set(["version"], JSON_VERSION + 1)), "newer Folio"),
    "version zero": (lambda s: _bad(s, _set(["version"], 0)), "version 0 is not supported"),
    "version text": (lambda s: _bad(s, _set(["version"], "1")), "must be an integer"),
    "no messages": (lambda s: _bad(s, lambda d: d.pop("messages")),
                    "The export: missing field(s): messages"),
    "messages not a list": (lambda s: _bad(s, _set(["messages"], {})),
                            "messages: expected a list, got an object"),
    "bad setting": (lambda s: _bad(s, _set(["chat", "settings", "top_p"], 7)), "top_p"),
    "unknown setting": (lambda s: _bad(s, _set(["chat", "settings", "api_key"], "x")),
                        "api_key"),
    "bad role": (lambda s: _bad(s, _set(["messages", 1, "role"], "robot")), "'robot'"),
    "bad token": (lambda s: _bad(s, _set(["messages", 1, "token_ids"], [1, -2])),
                  "token_ids"),
    "token too big": (lambda s: _bad(s, _set(["messages", 1, "token_ids"], [2**32])),
                      "token_ids"),
    "float token": (lambda s: _bad(s, _set(["messages", 1, "token_ids"], [1.5])),
                    "token_ids"),
    "dangling parent": (lambda s: _bad(s, _set(["messages", 1, "parent_id"], 999)),
                        "messages[1].parent_id: 999 is not an earlier message"),
    "parent after child": (lambda s: _bad(s, lambda d: d["messages"].reverse()),
                           "not an earlier message"),
    "duplicate id": (lambda s: _bad(s, lambda d: d["messages"].append(d["messages"][0])),
                     "messages[9].id: 1 is the id of an earlier message too"),
    "missing field": (lambda s: _bad(s, lambda d: d["messages"][2].pop("content")),
                      "messages[2]: missing field(s): content"),
    "unknown field": (lambda s: _bad(s, _set(["messages", 0, "colour"], "red")),
                      "messages[0]: unknown field(s): colour"),
    "foreign chat id": (lambda s: _bad(s, _set(["messages", 0, "chat_id"], 4242)),
                        "messages[0].chat_id: expected the exported chat's id 1, got 4242"),
    "dangling leaf": (lambda s: _bad(s, _set(["chat", "active_leaf_id"], 999)),
                      "chat.active_leaf_id: 999 is not"),
    "bad group": (lambda s: _bad(s, _set(["messages", 1, "candidate_group"], [1])),
                  "candidate_group"),
    "bad status": (lambda s: _bad(s, _set(["messages", 1, "status"], "done")), "'done'"),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_bad_files_are_rejected_naming_the_problem_and_write_nothing(store, case):
    make, expected = REJECTED[case]
    text = make(store)
    before = store.list_chats()
    counts = store._conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    with pytest.raises(ChatImportError, match=None) as info:
        store.import_json(text)
    assert expected in str(info.value)
    assert store.list_chats() == before
    assert store._conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == counts


def test_truncated_file_says_so(store):
    text = store.export_json(branchy_chat(store))
    for cut in (len(text) // 3, len(text) - 2):
        with pytest.raises(ChatImportError, match="not valid JSON.*truncated"):
            parse_chat_json(text[:cut])


def test_failure_mid_write_rolls_back(store, monkeypatch):
    from desktop_app.data import chat_import

    text = store.export_json(branchy_chat(store))
    before = store.list_chats()
    real = chat_import.schema.pack_token_ids
    calls = []

    def failing(ids):
        calls.append(ids)
        if len(calls) == 4:
            raise RuntimeError("disk full")
        return real(ids)

    monkeypatch.setattr(chat_import.schema, "pack_token_ids", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        store.import_json(text)
    assert store.list_chats() == before
    assert JSON_FORMAT in text


def test_failure_reading_the_new_chat_back_rolls_back(store, monkeypatch):
    text = store.export_json(branchy_chat(store))
    before = list(store._conn.iterdump())

    def failing(chat_id):
        raise sqlite3.DatabaseError("malformed")

    monkeypatch.setattr(store, "get_chat", failing)
    with pytest.raises(sqlite3.DatabaseError):
        store.import_json(text)
    assert list(store._conn.iterdump()) == before
