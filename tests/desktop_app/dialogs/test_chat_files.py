"""File ▸ Export chat… / Import chat… through the main window's actions (file dialogs
replaced by the test)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from PySide6.QtWidgets import QMenu

from desktop_app.data import chat_import, import_checks, metric_values
from desktop_app.dialogs import chat_files
from desktop_app.dialogs.settings_dialog import ChatSettingsForm
from tests.desktop_app.data.test_chat_import import branchy_chat, tree
from tests.desktop_app.data.test_import_checks import rich_chat, snapshot


@pytest.fixture
def window(make_window, fake_bridge, store):
    return make_window(fake_bridge)


def answer_save(monkeypatch, path, chosen):
    asked = []

    def fake(parent, title, suggested, filters):
        asked.append((title, suggested, filters))
        return str(path), chosen

    monkeypatch.setattr(chat_files, "save_file_name", fake)
    return asked


def answer_open(monkeypatch, path):
    monkeypatch.setattr(chat_files, "open_file_name", lambda parent, title, filters: (
        str(path), ""))


def test_actions_are_in_the_file_menu(window):
    menu = window.menuBar().findChild(QMenu, "fileMenu")
    names = [a.objectName() for a in menu.actions() if not a.isSeparator()]
    assert names == ["exportChatAction", "importChatAction", "quitAction"]


def test_json_export_then_import_through_the_actions_round_trips(
        qtbot, window, store, monkeypatch, tmp_path, captured_errors):
    chat_id = branchy_chat(store)
    window.refresh_chats()
    window.open_chat(chat_id)
    # The JSON filter picks the format; the extension is added.
    asked = answer_save(monkeypatch, tmp_path / "saved", chat_files.JSON_FILTER)
    window.menus.export_chat_action.trigger()
    assert asked[0][1] == "Branches.md"
    saved = tmp_path / "saved.json"
    assert json.loads(saved.read_text())["format"] == "folio-chat"

    answer_open(monkeypatch, saved)
    with qtbot.waitSignal(window.menus.chat_files.chatImported) as imported:
        window.menus.import_chat_action.trigger()
    new_id = imported.args[0]
    assert captured_errors == []
    assert new_id != chat_id and len(store.list_chats()) == 2
    assert tree(store, new_id) == tree(store, chat_id)
    # The imported chat is open and listed.
    assert window.controller.chat_id == new_id
    assert window.chat_list.view.model().rowCount() == 2


def test_markdown_export_is_the_open_branch(window, store, monkeypatch, tmp_path):
    chat_id = branchy_chat(store)
    window.open_chat(chat_id)
    answer_save(monkeypatch, tmp_path / "notes.md", chat_files.MARKDOWN_FILTER)
    window.menus.export_chat_action.trigger()
    text = (tmp_path / "notes.md").read_text()
    assert text == store.export_markdown(chat_id)
    assert text.startswith("# Branches\n\n**System:** Be brief.\n")
    assert "Rome 1" in text and "Rome 0" not in text and "Rome 2" not in text
    assert "It is Par" not in text and "A second root" not in text


def test_json_chosen_by_extension_when_no_filter(window, store, monkeypatch, tmp_path):
    chat_id = branchy_chat(store)
    window.open_chat(chat_id)
    answer_save(monkeypatch, tmp_path / "x.json", "")
    window.menus.export_chat_action.trigger()
    assert json.loads((tmp_path / "x.json").read_text())["chat"]["title"] == "Branches"


@pytest.mark.parametrize("content, expected", [
    ("truncated", "not valid JSON (the file looks truncated)"),
    ('{"conversations": [{"title": "hi"}], "app": "OtherChat"}',
     'no "format" marker'),
    ('{"format": "folio-chat", "version": 99, "chat": {}, "messages": []}', "newer Folio"),
])
def test_bad_file_shows_a_clear_error_and_adds_no_chat(window, store, monkeypatch, tmp_path,
                                                        captured_errors, content, expected):
    chat_id = branchy_chat(store)
    good = store.export_json(chat_id)
    path = tmp_path / "in.json"
    path.write_text(good[: len(good) // 2] if content == "truncated" else content)
    answer_open(monkeypatch, path)
    before = store.list_chats()
    assert window.menus.chat_files.import_chat() is None
    assert store.list_chats() == before
    [(title, text)] = captured_errors
    assert title == "Could not import the chat"
    assert expected in text and "in.json" in text and "Nothing was imported" in text


def test_unreadable_and_binary_files_are_reported(window, monkeypatch, tmp_path,
                                                   captured_errors, store):
    answer_open(monkeypatch, tmp_path / "missing.json")
    window.menus.import_chat_action.trigger()
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    answer_open(monkeypatch, tmp_path / "bin.json")
    window.menus.import_chat_action.trigger()
    assert [t for t, _ in captured_errors] == ["Could not import the chat"] * 2
    assert "Could not read" in captured_errors[0][1]
    assert "not UTF-8" in captured_errors[1][1]
    assert store.list_chats() == []


def test_cancel_and_no_chat(window, monkeypatch, tmp_path, captured_errors, store):
    answer_open(monkeypatch, "")
    window.menus.import_chat_action.trigger()
    assert window.controller.chat_id is None
    window.menus.export_chat_action.trigger()
    assert captured_errors == [("Nothing to export",
                                "Open or start a chat first, then export it.")]
    assert not list(tmp_path.glob("*.md"))


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["chat"].update(title="Hi \ud800"), "chat.title: expected valid Unicode"),
    (lambda d: d["messages"][1]["metrics"].update(num_prompt_tokens="lots"),
     "messages[1].metrics.num_prompt_tokens: expected a non-negative integer"),
    (lambda d: d["messages"][0].update(created_at=float("nan")),
     "messages[0].created_at: expected a time"),
    (lambda d: d["messages"][5].update(candidate_index=10**30),
     "messages[5].candidate_index: expected a non-negative integer"),
])
def test_a_crafted_file_shows_the_field_and_adds_no_chat(window, store, monkeypatch,
                                                         tmp_path, captured_errors, change,
                                                         expected):
    data = json.loads(store.export_json(branchy_chat(store)))
    change(data)
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(data))
    answer_open(monkeypatch, path)
    before = snapshot(store)
    assert window.menus.chat_files.import_chat() is None
    [(title, text)] = captured_errors
    assert title == "Could not import the chat"
    assert text.startswith(f"crafted.json: {expected}") and "Nothing was imported" in text
    assert snapshot(store) == before


@pytest.mark.parametrize("error", [
    sqlite3.IntegrityError("NOT NULL constraint failed: messages.created_at"),
    OverflowError("Python int too large to convert to SQLite INTEGER"),
    UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    sqlite3.OperationalError("database or disk is full"),
])
def test_a_failure_while_saving_is_shown_and_nothing_is_imported(
        window, store, monkeypatch, tmp_path, captured_errors, error):
    path = tmp_path / "in.json"
    path.write_text(store.export_json(branchy_chat(store)))
    real, calls = chat_import.schema.pack_token_ids, []

    def failing(ids):  # the fourth message cannot be written
        calls.append(ids)
        if len(calls) == 4:
            raise error
        return real(ids)

    monkeypatch.setattr(chat_import.schema, "pack_token_ids", failing)
    answer_open(monkeypatch, path)
    imported = []
    window.menus.chat_files.chatImported.connect(imported.append)
    before = snapshot(store)
    assert window.menus.chat_files.import_chat() is None
    [(title, text)] = captured_errors
    assert title == "Could not import the chat"
    assert text.startswith(f"in.json: the import failed unexpectedly "
                           f"({type(error).__name__}: ")
    assert text.endswith("Nothing was imported.")
    assert snapshot(store) == before and imported == [] and len(calls) == 4


def test_values_at_every_bound_import_and_open(qtbot, window, store, monkeypatch, tmp_path,
                                               captured_errors):
    """The bounds the import checks are ones the app can show: the chat opens, its
    footers render and its settings fill the chat settings form."""
    data = json.loads(store.export_json(rich_chat(store)))
    top, last = import_checks.INT32_MAX, import_checks.LATEST
    data["chat"]["settings"].update(seed=top, top_k=top, max_tokens=top)
    data["chat"].update(created_at=last, updated_at=0)
    data["messages"][0]["created_at"] = 0
    data["messages"][1]["metrics"].update(
        {key: metric_values.MAX_COUNT for key in metric_values.COUNTS},
        **{key: metric_values.MAX_MEASURE for key in metric_values.MEASURES})
    data["messages"][4].update(candidate_index=top, created_at=last)
    path = tmp_path / "edges.json"
    path.write_text(json.dumps(data))
    answer_open(monkeypatch, path)
    with qtbot.waitSignal(window.menus.chat_files.chatImported) as imported:
        window.menus.import_chat_action.trigger()
    assert captured_errors == []
    assert window.controller.chat_id == imported.args[0]
    footer = window.conversation.rows()[1].metrics_label.text()
    assert f"{metric_values.MAX_COUNT} prompt tokens" in footer
    form = ChatSettingsForm(store.get_chat(imported.args[0]).settings)
    qtbot.addWidget(form)
    assert form.seed.value() == top
