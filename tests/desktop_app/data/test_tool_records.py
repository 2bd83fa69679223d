"""Tool calls and results in the chat tree: stored, sent to the engine, exported and
imported like any message."""

from __future__ import annotations

import json

import pytest

from desktop_app.data import tool_records
from desktop_app.data.chat_import import ChatImportError
from desktop_app.data.chat_store import ChatStore
from desktop_app.data.settings import ChatSettings

CALL = {"id": "call_1", "name": "add", "arguments": '{"a": 1, "b": 2}'}


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def _tool_turn(store):
    chat = store.create_chat("Sums", ChatSettings(tools={"calc": None}))
    user = store.add_message(chat.id, None, "user", "1 + 2?")
    reply = store.add_message(chat.id, user.id, "assistant", "", status="streaming")
    store.finish_message(reply.id, "Let me add.", [5, 6, 7], {}, tool_calls=[CALL])
    result = store.add_message(chat.id, reply.id, "tool", "",
                               tool_call=tool_records.record(CALL, "calc", "add"))
    store.set_tool_result(result.id, "3", {**result.tool_call, "state": tool_records.DONE})
    final = store.add_message(chat.id, result.id, "assistant", "It is 3.")
    return chat, user, reply, result, final


def test_calls_and_results_are_stored_and_sent_as_templates_read_them(store):
    chat, user, reply, result, final = _tool_turn(store)
    assert store.get_message(reply.id).tool_calls == [CALL]
    assert store.get_message(result.id).tool_call["state"] == "done"
    assert store.get_chat(chat.id).settings.tools == {"calc": None}
    messages = store.messages_for_engine(final.id)
    assert messages[1] == {"role": "assistant", "content": "Let me add.", "token_ids": [5, 6, 7],
                           "tool_calls": [{"id": "call_1", "type": "function", "function": {
                               "name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    assert messages[2] == {"role": "tool", "content": "3", "tool_call_id": "call_1",
                           "name": "add"}


def test_a_call_left_pending_is_sent_as_not_run(store):
    chat = store.create_chat("x")
    user = store.add_message(chat.id, None, "user", "1 + 2?")
    reply = store.add_message(chat.id, user.id, "assistant", "", status="streaming")
    store.finish_message(reply.id, "", None, {}, tool_calls=[CALL])
    pending = store.add_message(chat.id, reply.id, "tool", "",
                                tool_call=tool_records.record(CALL, "calc", "add"))
    later = store.add_message(chat.id, pending.id, "user", "Never mind.")
    assert store.messages_for_engine(later.id)[2]["content"] == tool_records.NOT_RUN_TEXT


def test_a_tool_message_needs_its_call_and_only_it_has_one(store):
    chat = store.create_chat("x")
    with pytest.raises(ValueError, match="tool_call"):
        store.add_message(chat.id, None, "tool", "3")
    with pytest.raises(ValueError, match="tool_call"):
        store.add_message(chat.id, None, "user", "3", tool_call=tool_records.record(
            CALL, "calc", "add"))


def test_export_and_import_keep_the_tool_turn(store):
    chat, *_ = _tool_turn(store)
    exported = store.export_json(chat.id)
    copy = store.import_json(exported)
    assert copy.settings.tools == {"calc": None}
    leaf = store.active_leaf(copy.id)
    roles = [(m.role, m.tool_calls, m.tool_call and m.tool_call["state"])
             for m in store.path_to(leaf)]
    assert roles == [("user", None, None), ("assistant", [CALL], None),
                     ("tool", None, "done"), ("assistant", None, None)]
    markdown = store.export_markdown(chat.id)
    assert "Calls `add`" in markdown and "## Tool add (done)" in markdown


def test_a_version_1_export_still_imports(store):
    chat = store.create_chat("old")
    store.add_message(chat.id, None, "user", "hi")
    data = json.loads(store.export_json(chat.id))
    data["version"] = 1
    del data["attachments"]  # version 4's
    for message in data["messages"]:
        del message["tool_calls"], message["tool_call"], message["attachments"]
    assert store.import_json(json.dumps(data)).title == "old"


@pytest.mark.parametrize(("change", "words"), [
    (lambda m: m[1].update(tool_calls=[{"id": "c"}]), "messages[1].tool_calls[0]: expected"),
    (lambda m: m[1].update(tool_calls=[]), "messages[1].tool_calls: expected a non-empty list"),
    (lambda m: m[2].update(tool_call=None), "messages[2].tool_call: expected an object of strings"),
    (lambda m: m[2]["tool_call"].update(state="maybe"),
     "messages[2].tool_call.state: expected one of"),
    (lambda m: m[0].update(tool_call=m[2]["tool_call"]),
     "messages[0].tool_call: expected null unless the role is tool"),
])
def test_bad_tool_fields_are_refused_by_name(store, change, words):
    chat, *_ = _tool_turn(store)
    data = json.loads(store.export_json(chat.id))
    change(data["messages"])
    with pytest.raises(ChatImportError, match=words.replace("[", r"\[").replace("]", r"\]")):
        store.import_json(json.dumps(data))


def test_arguments_of_reads_the_models_json():
    assert tool_records.arguments_of(CALL) == {"a": 1, "b": 2}
    assert tool_records.arguments_of({"arguments": ""}) == {}
    with pytest.raises(ValueError, match="not valid JSON"):
        tool_records.arguments_of({"arguments": "{"})
    with pytest.raises(ValueError, match="JSON object"):
        tool_records.arguments_of({"arguments": "[1]"})
