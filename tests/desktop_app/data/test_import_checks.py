"""Crafted chat exports: every field of the chat and of its messages is checked, a bad
value is refused by a ChatImportError that names the field by its path, and the database
holds exactly what it held before (random mutations: test_import_mutations)."""

from __future__ import annotations

import json

import pytest

from desktop_app.data import tool_records
from desktop_app.data.chat_import import ChatImportError
from desktop_app.data.chat_store import ChatStore
from desktop_app.data.settings import ChatSettings

NAN, INF = float("nan"), float("inf")
CALL = {"id": "call_1", "name": "add", "arguments": '{"a": 1}'}
METRICS = {"num_prompt_tokens": 120, "num_cached_tokens": 96, "num_disk_tokens": 0,
           "num_generated_tokens": 9, "ttft_s": 0.083, "decode_tok_s": 31.25, "total_s": 0.4,
           "finish_reason": "stop", "response_format": "json_object", "thinking_tokens": 4,
           "thinking_s": 0.1, "thinking_dropped_tokens": 2, "other": {"kept": [1, 2.5]}}


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def rich_chat(store: ChatStore) -> int:
    """Every kind of field filled: [0] user, [1] a reply with metrics, thinking, a model
    and a tool call, [2] its tool result, [3] and [4] two candidates of the next reply."""
    chat = store.create_chat("Sums", ChatSettings(tools={"calc": ["add"]}, seed=7))
    user = store.add_message(chat.id, None, "user", "1 + 1?", token_ids=[1, 2])
    reply = store.add_message(chat.id, user.id, "assistant", "", status="streaming",
                              model="tiny")
    store.finish_message(reply.id, "Let me add.", [3, 4], METRICS, tool_calls=[CALL],
                         thinking="Use the tool.")
    result = store.add_message(chat.id, reply.id, "tool", "2",
                               tool_call=tool_records.record(CALL, "calc", "add", "done"))
    for i, c in enumerate(store.add_candidates(chat.id, result.id, 2, model="tiny")):
        store.finish_message(c.id, f"It is 2 ({i}).", [5 + i], {"num_generated_tokens": 1})
    return chat.id


def snapshot(store: ChatStore) -> list[str]:
    return list(store._conn.iterdump())


def _put(data, path, value):
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


M1, M2, M3, S = ["messages", 1], ["messages", 2], ["messages", 3], ["chat", "settings"]
EXPECT_COUNT = "expected a non-negative integer up to 2147483647, got "
EXPECT_MEASURE = "expected a number in [0, 1e+09], got "
EXPECT_TIME = "expected a time in seconds since 1970, before the year 10000, got "
EXPECT_ID = "expected a non-negative integer up to 9223372036854775807, got "
SURROGATE = "expected valid Unicode text, got a lone surrogate '\\ud800' at character "

# (where in the export, the value put there, what the error says: field path first)
CASES = [
    # A reply's metrics: the counts, the measures and the labels the views read.
    ([*M1, "metrics", "num_prompt_tokens"], "lots",
     "messages[1].metrics.num_prompt_tokens: " + EXPECT_COUNT + "'lots'"),
    ([*M1, "metrics", "num_prompt_tokens"], NAN, "num_prompt_tokens: " + EXPECT_COUNT + "NaN"),
    ([*M1, "metrics", "num_prompt_tokens"], INF,
     "num_prompt_tokens: " + EXPECT_COUNT + "Infinity"),
    ([*M1, "metrics", "num_prompt_tokens"], 10**30, "num_prompt_tokens: " + EXPECT_COUNT),
    ([*M1, "metrics", "num_prompt_tokens"], -1, "num_prompt_tokens: " + EXPECT_COUNT + "-1"),
    ([*M1, "metrics", "num_prompt_tokens"], True, "num_prompt_tokens: " + EXPECT_COUNT + "true"),
    ([*M1, "metrics", "num_prompt_tokens"], 12.5, "num_prompt_tokens: " + EXPECT_COUNT + "12.5"),
    ([*M1, "metrics", "num_prompt_tokens"], None, "num_prompt_tokens: " + EXPECT_COUNT + "null"),
    ([*M1, "metrics", "num_cached_tokens"], [1], "num_cached_tokens: " + EXPECT_COUNT + "a list"),
    ([*M1, "metrics", "num_disk_tokens"], {}, "num_disk_tokens: " + EXPECT_COUNT + "an object"),
    ([*M1, "metrics", "num_generated_tokens"], 2**63, "num_generated_tokens: " + EXPECT_COUNT),
    ([*M1, "metrics", "thinking_tokens"], "many", "thinking_tokens: " + EXPECT_COUNT),
    ([*M1, "metrics", "thinking_dropped_tokens"], -3, "thinking_dropped_tokens: " + EXPECT_COUNT),
    ([*M1, "metrics", "ttft_s"], NAN, "messages[1].metrics.ttft_s: " + EXPECT_MEASURE + "NaN"),
    ([*M1, "metrics", "ttft_s"], "fast", "ttft_s: " + EXPECT_MEASURE + "'fast'"),
    ([*M1, "metrics", "ttft_s"], -0.5, "ttft_s: " + EXPECT_MEASURE + "-0.5"),
    ([*M1, "metrics", "ttft_s"], True, "ttft_s: " + EXPECT_MEASURE + "true"),
    ([*M1, "metrics", "decode_tok_s"], INF, "decode_tok_s: " + EXPECT_MEASURE + "Infinity"),
    ([*M1, "metrics", "decode_tok_s"], -INF, "decode_tok_s: " + EXPECT_MEASURE + "-Infinity"),
    ([*M1, "metrics", "total_s"], 10**30, "total_s: " + EXPECT_MEASURE),
    ([*M1, "metrics", "thinking_s"], NAN, "thinking_s: " + EXPECT_MEASURE + "NaN"),
    ([*M1, "metrics", "finish_reason"], 5, "finish_reason: expected a string, got 5"),
    ([*M1, "metrics", "response_format"], ["json"], "response_format: expected a string"),
    ([*M1, "metrics", "response_format"], "\ud800", "response_format: " + SURROGATE + "0"),
    # Any other metric is kept as it is, so long as it is plain JSON.
    ([*M1, "metrics", "other"], NAN, "messages[1].metrics.other: expected a finite number, "
                                     "got NaN"),
    ([*M1, "metrics", "other", "kept"], [1, INF], "metrics.other.kept[1]: expected a finite"),
    ([*M1, "metrics", "other"], 10**30, "metrics.other: expected an integer from "),
    ([*M1, "metrics", "other"], "a\ud800", "metrics.other: " + SURROGATE + "1"),
    ([*M1, "metrics", "\ud800"], 1, "metrics['\\ud800'] (the name): " + SURROGATE + "0"),
    ([*M1, "metrics", "other"], json.loads("[" * 30 + "]" * 30), "nested more than 20 levels"),
    ([*M1, "metrics"], [1, 2], "messages[1].metrics: expected an object, got a list"),
    ([*M1, "metrics"], None, "messages[1].metrics: expected an object, got null"),
    # The chat.
    (["chat", "created_at"], NAN, "chat.created_at: " + EXPECT_TIME + "NaN"),
    (["chat", "created_at"], INF, "chat.created_at: " + EXPECT_TIME + "Infinity"),
    (["chat", "created_at"], "yesterday", "chat.created_at: " + EXPECT_TIME + "'yesterday'"),
    (["chat", "created_at"], -1, "chat.created_at: " + EXPECT_TIME + "-1"),
    (["chat", "created_at"], 1e20, "chat.created_at: " + EXPECT_TIME + "1e+20"),
    (["chat", "created_at"], True, "chat.created_at: " + EXPECT_TIME + "true"),
    (["chat", "updated_at"], NAN, "chat.updated_at: " + EXPECT_TIME + "NaN"),
    (["chat", "title"], "\ud800", "chat.title: " + SURROGATE + "0"),
    (["chat", "title"], None, "chat.title: expected a string, got null"),
    (["chat", "id"], "1", "chat.id: " + EXPECT_ID + "'1'"),
    (["chat", "id"], True, "chat.id: " + EXPECT_ID + "true"),
    (["chat", "active_leaf_id"], "6", "chat.active_leaf_id: '6' is not one of"),
    (["chat", "active_leaf_id"], True, "chat.active_leaf_id: true is not one of"),
    (["chat", "active_leaf_id"], 10**30, "chat.active_leaf_id: 1000000000"),
    ([*S, "system_prompt"], "Be \ud800", "chat.settings.system_prompt: " + SURROGATE + "3"),
    ([*S, "tools"], {"\ud800": None}, "chat.settings.tools['\\ud800'] (the name): "),
    ([*S, "tools", "calc"], ["add", "\ud800"], "chat.settings.tools.calc[1]: " + SURROGATE),
    ([*S, "json_schema"], "\ud800", "chat.settings.json_schema: " + SURROGATE + "0"),
    ([*S, "seed"], 2**40, "chat.settings.seed: " + EXPECT_COUNT + "1099511627776"),
    ([*S, "top_k"], 10**30, "chat.settings.top_k: " + EXPECT_COUNT),
    ([*S, "max_tokens"], 2**31, "chat.settings.max_tokens: " + EXPECT_COUNT + "2147483648"),
    ([*S, "temperature"], NAN, "chat.settings: ChatSettings.temperature must be"),
    ([*S, "top_p"], INF, "chat.settings: ChatSettings.top_p must be"),
    ([*S, "seed"], -1, "chat.settings: ChatSettings.seed must be"),
    ([*S, "num_candidates"], True, "chat.settings: ChatSettings.num_candidates must be"),
    ([*S, "json_mode"], 1, "chat.settings: ChatSettings.json_mode must be true or false"),
    ([*S, "think"], "yes", "chat.settings: ChatSettings.think must be true or false"),
    ([*S, "tools"], [], "chat.settings: ChatSettings.tools must be"),
    (S, [], "chat.settings: expected an object, got a list"),
    (["chat"], [], "chat: expected an object, got a list"),
    # Each message's own fields.
    (["messages", 0, "content"], "\ud800", "messages[0].content: " + SURROGATE + "0"),
    (["messages", 0, "content"], 5, "messages[0].content: expected a string, got 5"),
    ([*M1, "thinking"], "ok \ud800", "messages[1].thinking: " + SURROGATE + "3"),
    ([*M1, "thinking"], None, "messages[1].thinking: expected a string, got null"),
    ([*M1, "model"], "tiny\ud800", "messages[1].model: " + SURROGATE + "4"),
    ([*M1, "model"], 5, "messages[1].model: expected a string, got 5"),
    ([*M1, "created_at"], NAN, "messages[1].created_at: " + EXPECT_TIME + "NaN"),
    ([*M1, "created_at"], "now", "messages[1].created_at: " + EXPECT_TIME + "'now'"),
    ([*M1, "created_at"], -5, "messages[1].created_at: " + EXPECT_TIME + "-5"),
    ([*M1, "created_at"], 1e300, "messages[1].created_at: " + EXPECT_TIME),
    ([*M1, "role"], True, "messages[1].role: expected one of system, user, assistant, tool, "
                          "got true"),
    ([*M1, "role"], ["assistant"], "messages[1].role: expected one of"),
    ([*M1, "status"], {"a": 1}, "messages[1].status: expected one of complete, streaming, "
                                "interrupted, got an object"),
    ([*M1, "id"], -1, "messages[1].id: " + EXPECT_ID + "-1"),
    ([*M1, "id"], 2**63, "messages[1].id: " + EXPECT_ID + "9223372036854775808"),
    ([*M1, "id"], 2.0, "messages[1].id: " + EXPECT_ID + "2.0"),
    ([*M1, "id"], "2", "messages[1].id: " + EXPECT_ID + "'2'"),
    ([*M1, "chat_id"], True, "messages[1].chat_id: expected the exported chat's id 1, got true"),
    ([*M1, "parent_id"], True, "messages[1].parent_id: true is not an earlier message"),
    ([*M1, "parent_id"], -1, "messages[1].parent_id: -1 is not an earlier message"),
    ([*M1, "token_ids"], "1,2", "messages[1].token_ids: expected a list or null, got '1,2'"),
    ([*M1, "token_ids"], [3, True], "messages[1].token_ids[1]: expected a non-negative integer "
                                    "up to 4294967295, got true"),
    ([*M1, "token_ids"], [NAN], "messages[1].token_ids[0]: expected a non-negative"),
    ([*M1, "token_ids"], [2**64], "messages[1].token_ids[0]: expected a non-negative"),
    (["messages", 4, "candidate_group"], True, "messages[4].candidate_group: true is not"),
    (["messages", 4, "candidate_group"], 10**30, "messages[4].candidate_group: 1000000"),
    (["messages", 4, "candidate_index"], 10**30,
     "messages[4].candidate_index: " + EXPECT_COUNT + "1000000"),
    (["messages", 4, "candidate_index"], 2**31, "messages[4].candidate_index: " + EXPECT_COUNT),
    (["messages", 4, "candidate_index"], -1, "messages[4].candidate_index: " + EXPECT_COUNT),
    (["messages", 4, "candidate_index"], True, "messages[4].candidate_index: " + EXPECT_COUNT),
    (["messages", 4, "candidate_index"], "1", "messages[4].candidate_index: " + EXPECT_COUNT),
    (["messages", 4, "candidate_index"], 1.0, "messages[4].candidate_index: " + EXPECT_COUNT),
    # Tool calls and results: the shape, then every name and text in them.
    ([*M1, "tool_calls", 0, "name"], "\ud800", "messages[1].tool_calls[0].name: " + SURROGATE),
    ([*M1, "tool_calls", 0, "id"], "c\ud800", "messages[1].tool_calls[0].id: " + SURROGATE),
    ([*M1, "tool_calls", 0, "arguments"], "{\ud800}",
     "messages[1].tool_calls[0].arguments: " + SURROGATE + "1"),
    ([*M1, "tool_calls", 0, "arguments"], {"a": 1},
     "messages[1].tool_calls[0]: expected an object of strings"),
    ([*M1, "tool_calls"], {}, "messages[1].tool_calls: expected a non-empty list or null"),
    ([*M1, "tool_calls"], [[]], "messages[1].tool_calls[0]: expected an object of strings"),
    ([*M2, "tool_call", "server"], "\ud800", "messages[2].tool_call.server: " + SURROGATE),
    ([*M2, "tool_call", "tool"], "\ud800", "messages[2].tool_call.tool: " + SURROGATE),
    ([*M2, "tool_call", "arguments"], "\ud800", "messages[2].tool_call.arguments: "),
    ([*M2, "tool_call", "state"], "\ud800", "messages[2].tool_call.state: expected one of"),
    ([*M2, "tool_call"], ["done"], "messages[2].tool_call: expected an object of strings"),
    ([*M3, "tool_call"], {}, "messages[3].tool_call: expected null unless the role is tool"),
    (["messages", 0], [], "messages[0]: expected an object, got a list"),
    (["messages", 0], "hi", "messages[0]: expected an object, got 'hi'"),
    # The envelope.
    (["version"], True, "\"version\" must be an integer, got true"),
    (["version"], 3.0, "\"version\" must be an integer, got 3.0"),
    (["format"], "\ud800", "has \"format\": '\\ud800'"),
    (["\ud800"], 1, "The export: unknown field(s): '\\ud800'"),
]


def _case_id(case) -> str:
    path, value, _ = case
    return ".".join(map(str, path)).encode("ascii", "backslashreplace").decode() + "=" + (
        ascii(value)[:20])


@pytest.mark.parametrize("case", CASES, ids=map(_case_id, CASES))
def test_a_crafted_value_is_refused_by_field_and_writes_nothing(store, case):
    path, value, expected = case
    data = json.loads(store.export_json(rich_chat(store)))
    _put(data, path, value)
    text = json.dumps(data)  # NaN and Infinity as Python's json writes them (allow_nan)
    before = snapshot(store)
    with pytest.raises(ChatImportError) as info:
        store.import_json(text)
    assert expected in str(info.value)
    assert snapshot(store) == before


def test_the_rich_chat_itself_imports(store):
    text = store.export_json(rich_chat(store))
    copy = store.import_json(text)
    exported = json.loads(store.export_json(copy.id))
    assert exported["messages"][1]["metrics"] == METRICS
    assert exported["messages"][2]["tool_call"]["state"] == "done"


@pytest.mark.parametrize(("text", "expected"), [
    ('{"format": "folio-chat", "version": ' + "9" * 5000 + "}", "too many digits"),
    ('{"format": "folio-chat", "version": ' + "[" * 100_000, "nested too deeply"),
])
def test_numbers_and_nesting_the_json_reader_refuses(store, text, expected):
    before = snapshot(store)
    with pytest.raises(ChatImportError, match=expected):
        store.import_json(text)
    assert snapshot(store) == before


def test_a_json_schema_nested_too_deeply_is_refused(store):
    data = json.loads(store.export_json(rich_chat(store)))
    data["chat"]["settings"].update(json_mode=True, json_schema="[" * 100_000)
    with pytest.raises(ChatImportError, match="^chat.settings: "):
        store.import_json(json.dumps(data))
