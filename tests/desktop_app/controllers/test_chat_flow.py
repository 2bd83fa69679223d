"""Chat turns through the real window, store and bridge, on the fake engine (fast)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from desktop_app.data.chat_store import ChatStore
from desktop_app.widgets.candidates import CandidateColumn
from desktop_app.widgets.message_widget import MessageWidget


def send(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)


def branch(window) -> list[tuple[str, str]]:
    store, chat_id = window.store, window.controller.chat_id
    return [(m.role, m.content) for m in store.path_to(store.active_leaf(chat_id))]


def test_send_streams_into_view_and_store(qtbot, fake_bridge, make_window, store):
    window = make_window(fake_bridge)
    send(qtbot, window, "Hello there")
    assert branch(window) == [("user", "Hello there"),
                              ("assistant", "Reply1 c1w1 c1w2 c1w3 c1w4 c1w5")]
    reply = store.get_message(store.active_leaf(window.controller.chat_id))
    assert reply.token_ids == [0, 1, 2, 3, 4, 5]
    assert reply.status == "complete"
    assert reply.metrics["num_cached_tokens"] == 16
    assert reply.metrics["finish_reason"] == "length"
    rows = window.conversation.rows()
    assert [type(r) for r in rows] == [MessageWidget, MessageWidget]
    assert rows[1].text() == "Reply1 c1w1 c1w2 c1w3 c1w4 c1w5"
    assert rows[1].metrics_label.text() == (
        "42.0 tok/s · first token 50 ms · 18 prompt tokens (16 cached, 2 computed) · "
        "Cut off at the max tokens setting")
    assert store.get_chat(window.controller.chat_id).title == "Hello there"
    assert window.chat_list.model.titles() == ["Hello there"]


def test_second_turn_sends_token_ids_of_the_first_reply(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    send(qtbot, window, "one")
    send(qtbot, window, "two")
    messages, params = fake_bridge.fake_workers[0].submitted[-1]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["token_ids"] == [0, 1, 2, 3, 4, 5]
    assert "token_ids" not in messages[0]
    assert params.n == 1


def test_three_candidates_keep_second_and_continue(qtbot, fake_bridge, make_window, store):
    window = make_window(fake_bridge)
    window.candidates_spin.setValue(3)
    send(qtbot, window, "pick one")
    columns = window.findChildren(CandidateColumn, "candidateColumn")
    assert [c.text() for c in columns] == [
        f"Reply{i} c{i}w1 c{i}w2 c{i}w3 c{i}w4 c{i}w5" for i in (1, 2, 3)]
    assert all(c.keep_button.isEnabled() for c in columns)
    qtbot.mouseClick(columns[1].keep_button, Qt.MouseButton.LeftButton)
    assert window.findChildren(CandidateColumn, "candidateColumn") == []
    kept = window.conversation.rows()[-1]
    assert kept.text() == "Reply2 c2w1 c2w2 c2w3 c2w4 c2w5"
    assert kept.branch_label.text() == "2/3"
    window.candidates_spin.setValue(1)
    send(qtbot, window, "go on")
    messages, _ = fake_bridge.fake_workers[0].submitted[-1]
    assert messages[1]["content"] == "Reply2 c2w1 c2w2 c2w3 c2w4 c2w5"
    assert messages[1]["token_ids"] == [1000, 1001, 1002, 1003, 1004, 1005]


def test_regenerate_adds_alternates_and_switching_follows_the_branch(qtbot, fake_bridge,
                                                                     make_window):
    window = make_window(fake_bridge)
    send(qtbot, window, "first")
    send(qtbot, window, "second")
    first_reply = window.conversation.rows()[1]
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        first_reply.regen_button.click()
    # The new alternate of turn 1 has no later turns yet.
    assert [r for r, _ in branch(window)] == ["user", "assistant"]
    row = window.conversation.rows()[1]
    assert row.branch_label.text() == "2/2"
    row.prev_button.click()
    assert [c for _, c in branch(window)][2] == "second"
    assert window.conversation.rows()[1].branch_label.text() == "1/2"
    assert len(window.conversation.rows()) == 4
    window.conversation.rows()[1].next_button.click()
    assert len(window.conversation.rows()) == 2


def test_editing_a_user_message_starts_a_new_branch(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    send(qtbot, window, "original")
    send(qtbot, window, "later")
    first = window.conversation.rows()[0]
    first.start_edit()
    first.editor.setPlainText("edited")
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        first._submit_edit()
    assert [c for _, c in branch(window)][0] == "edited"
    assert len(branch(window)) == 2
    assert window.conversation.rows()[0].branch_label.text() == "2/2"


def test_stop_keeps_partial_reply(qtbot, fake_bridge, make_window, store):
    window = make_window(fake_bridge)
    fake_bridge.fake_workers[0].llm.words_per_reply = 10_000
    window.conversation.composer.setPlainText("long please")
    window.conversation.send_button.click()
    [stream] = window.controller.current.streams.values()
    reply_id = stream.message_ids[0]
    qtbot.waitUntil(lambda: len(stream.texts[0]) > 20, timeout=5000)
    assert window.conversation.stop_button.isVisible()
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        qtbot.keyClick(window, Qt.Key.Key_Escape)
    reply = store.get_message(reply_id)
    assert reply.status == "complete"
    assert reply.metrics["finish_reason"] == "abort"
    assert reply.content.startswith("Reply1 c1w1")
    assert len(reply.token_ids) == len(reply.content.split())
    assert window.conversation.rows()[-1].metrics_label.text().endswith("Stopped")
    assert window.conversation.send_button.isVisible()


def test_engine_error_shows_dialog_and_keeps_the_chat(qtbot, fake_bridge, make_window, store,
                                                      captured_errors):
    window = make_window(fake_bridge)
    send(qtbot, window, "fine")
    window.conversation.composer.setPlainText("FAIL")
    window.conversation.send_button.click()
    qtbot.waitUntil(lambda: captured_errors != [], timeout=5000)
    title, text = captured_errors[0]
    assert title == "The reply failed"
    assert text.startswith("prompt is longer than the context (4096 > 2048)")
    # The user's message stays; the empty reply does not linger.
    assert [c for _, c in branch(window)] == ["fine", "Reply1 c1w1 c1w2 c1w3 c1w4 c1w5",
                                              "FAIL"]
    assert not window.controller.generating
    send(qtbot, window, "still works")
    assert branch(window)[-1][0] == "assistant"


def test_chat_list_new_rename_delete_search(qtbot, fake_bridge, make_window, store,
                                            monkeypatch):
    from desktop_app.widgets import chat_list

    window = make_window(fake_bridge)
    send(qtbot, window, "apples are red")
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    send(qtbot, window, "bananas are yellow")
    assert window.chat_list.model.titles() == ["bananas are yellow", "apples are red"]
    window.chat_list.search.setText("RED")
    assert window.chat_list.model.titles() == ["apples are red"]
    window.chat_list.search.setText("c1w3")  # message text matches too
    assert window.chat_list.model.titles() == ["bananas are yellow", "apples are red"]
    window.chat_list.search.clear()
    model = window.chat_list.model
    model.setData(model.index(1), "Fruit")
    assert store.get_chat(model.chat_ids()[1]).title == "Fruit"
    window.chat_list.select(model.chat_ids()[1])
    assert branch(window)[0] == ("user", "apples are red")
    monkeypatch.setattr(chat_list, "confirm", lambda *a: False)
    window.chat_list.delete_current()
    assert len(store.list_chats()) == 2
    monkeypatch.setattr(chat_list, "confirm", lambda *a: True)
    window.chat_list.delete_current()
    assert [c.title for c in store.list_chats()] == ["bananas are yellow"]
    assert window.controller.chat_id is None
    assert window.conversation.rows() == []


def test_restart_shows_the_last_chat(qtbot, fake_bridge, make_window, store, folio_dirs):
    window = make_window(fake_bridge)
    send(qtbot, window, "remember me")
    reopened = ChatStore()
    try:
        [chat] = reopened.list_chats()
        second = make_window(fake_bridge, store_=reopened)
        assert second.controller.chat_id == chat.id
        assert [r.text() for r in second.conversation.rows()] == [
            "remember me", "Reply1 c1w1 c1w2 c1w3 c1w4 c1w5"]
    finally:
        reopened.close()


def test_key_widgets_carry_object_names(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    for name in ("chatList", "composer", "sendButton", "stopButton", "regenerateButton",
                 "vramPanel", "blockMap", "modelPicker"):
        assert window.findChild(QWidget, name) is not None, name


def test_ctrl_n_new_chat_and_ctrl_r_regenerate(qtbot, fake_bridge, make_window, store):
    window = make_window(fake_bridge)
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    [chat] = store.list_chats()
    assert window.controller.chat_id == chat.id and chat.title == "New chat"
    assert window.conversation.rows() == []
    send(qtbot, window, "hi")
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        qtbot.keyClick(window, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    assert window.conversation.rows()[-1].branch_label.text() == "2/2"
    assert len(fake_bridge.fake_workers[0].submitted) == 2
    first, second = (m for m, _ in fake_bridge.fake_workers[0].submitted)
    assert first == second  # the same messages again: the engine shares the prompt's blocks


def test_settings_dialog_applies_to_the_chat_and_defaults(qtbot, fake_bridge, make_window,
                                                          store):
    window = make_window(fake_bridge)
    send(qtbot, window, "hi")
    dialog = window.open_settings()
    dialog.chat_form.system_prompt.setPlainText("Answer in French.")
    dialog.chat_form.num_candidates.setValue(2)
    dialog.defaults_form.max_tokens.setValue(99)
    dialog.accept()
    chat = store.get_chat(window.controller.chat_id)
    assert chat.settings.system_prompt == "Answer in French."
    assert window.candidates_spin.value() == 2
    assert window.settings.chat_defaults.max_tokens == 99
    from desktop_app.data.settings import load_settings
    assert load_settings().chat_defaults.max_tokens == 99
    send(qtbot, window, "again")
    messages, params = fake_bridge.fake_workers[0].submitted[-1]
    assert messages[0] == {"role": "system", "content": "Answer in French."}
    assert params.n == 2


def test_no_model_loaded_says_what_to_do(qtbot, make_window, captured_errors):
    from desktop_app.services.engine_bridge import EngineBridge

    window = make_window(EngineBridge(llm_factory=lambda *a, **k: None))
    window.conversation.composer.setPlainText("hello?")
    window.conversation.send_button.click()
    assert captured_errors == [("No model loaded", "Load a model from the model picker in "
                                "the toolbar, then send your message again.")]
    assert window.model_picker.currentText() == "No model loaded"


def test_model_picker_loads_with_progress_and_remembers_the_model(qtbot, make_window,
                                                                  fake_engine):
    from desktop_app.data.settings import load_settings
    from desktop_app.services.engine_bridge import EngineBridge

    fake_llm, fake_worker = fake_engine

    def factory(source, config=None, progress=None):
        progress("weights", 0.5)
        return fake_llm(name=source.rsplit("/", 1)[-1])

    bridge = EngineBridge(llm_factory=factory, worker_factory=fake_worker)
    window = make_window(bridge)
    seen = []
    window.load_progress.valueChanged.connect(seen.append)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        window.load_model("/models/tiny.gguf")
        assert window.load_progress_action.isVisible()
    # Reset when the load starts, then halfway through the weights' share of the load
    # (widgets.load_steps), in plain words.
    assert seen == [0, 48]
    assert window.load_progress.format() == "Loading the model into memory… %p%"
    assert not window.load_progress_action.isVisible()
    assert window.model_picker.currentData() == "/models/tiny.gguf"
    assert window.model_picker.currentText() == "tiny.gguf"
    saved = load_settings()
    assert saved.last_model == "/models/tiny.gguf"
    assert saved.model_paths == ["/models/tiny.gguf"]
    assert window.statusBar().currentMessage() == (
        "tiny.gguf ready · keeps 2,048 tokens of a chat in mind")
    bridge.shutdown()
