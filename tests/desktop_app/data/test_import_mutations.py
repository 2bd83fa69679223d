"""Random mutations of a rich chat export (a member replaced, spoiled, deleted or added
anywhere) either import or are refused by a ChatImportError that writes nothing: never
any other exception."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from desktop_app.data.chat_import import ChatImportError
from desktop_app.data.chat_store import ChatStore
from tests.desktop_app.data.test_import_checks import INF, NAN, rich_chat, snapshot


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


# Each draw a fresh copy: sampled_from hands out the same list and dict objects every
# time, and a mutation that adds a member into one of them changed it for every later
# draw (and could add one into itself: a cycle the path walk never left).
ODD = st.sampled_from([
    None, True, False, 0, 1, 2, 5, -1, 2**31, 2**63, 10**30, 0.5, NAN, INF, -INF, "", "lots",
    "\ud800", "a\udfffb", "assistant", "tool", "streaming", "done", [], {}, [1], {"a": 1},
    {"id": "c", "name": "n", "arguments": "{}"}]).map(copy.deepcopy)
JSON = st.recursive(
    st.one_of(ODD, st.integers(), st.floats(), st.text(st.sampled_from("a\ud800é😀\x00"))),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=3),
    max_leaves=8)


def _spoiled(value):
    """A value of nearly the same kind that a crafted file could hold instead."""
    if isinstance(value, str):
        return st.sampled_from([value + "\ud800", "\udfff" + value, "", value * 2])
    return st.sampled_from([NAN, INF, -INF, -1, 10**30, 2**63, 2**31, True, None,
                            str(value), [value]])


def _paths(value, path=()):
    """Every member's path, the root's ("") first."""
    yield path
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for key, child in items:
        yield from _paths(child, (*path, key))


def _mutate(data: dict, draw) -> None:
    """Replace, delete or add one member anywhere in the export (each member as likely)."""
    path = draw(st.sampled_from(list(_paths(data))))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    target = parent[path[-1]] if path else data
    action = draw(st.sampled_from(["spoil", "replace", "delete", "add"]))
    if action == "spoil" and path:
        parent[path[-1]] = draw(_spoiled(target))
    elif action == "add" and isinstance(target, dict):
        target[draw(st.sampled_from(["x", "\ud800", "id", "ttft_s"]))] = draw(JSON)
    elif action == "add" and isinstance(target, list):
        target.insert(draw(st.integers(0, len(target))), draw(JSON))
    elif action == "delete" and path:
        del parent[path[-1]]
    elif path:
        parent[path[-1]] = draw(JSON)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(st.data())
def test_random_mutations_import_or_are_refused_never_anything_else(store, data):
    # One store for all examples (hence the health check): each compares the database
    # with what it held just before its own import.
    if not store.list_chats():
        rich_chat(store)
    export = json.loads(store.export_json(store.list_chats()[-1].id))
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(export, data.draw)
    before = snapshot(store)
    try:
        copy = store.import_json(json.dumps(export))
    except ChatImportError:
        assert snapshot(store) == before
        return
    # What was imported reads back and exports again like any chat.
    json.loads(store.export_json(copy.id))
    store.export_markdown(copy.id)
