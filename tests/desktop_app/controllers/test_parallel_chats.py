"""Replies in several chats at once: each streams into its own chat, Stop stops the chat in
view only, the chat list marks the chats that are generating."""

from __future__ import annotations

from PySide6.QtCore import Qt

from desktop_app.data.settings import AppSettings, ChatSettings
from desktop_app.widgets.chat_list import ChatIdRole, GeneratingRole
from desktop_app.widgets.message_widget import MessageWidget

FULL_REPLY = "Reply1 c1w1 c1w2 c1w3 c1w4 c1w5"  # the fake engine's 6 words


def branch(window, chat_id) -> list[tuple[str, str, int]]:
    store = window.store
    return [(m.role, m.content, m.chat_id) for m in store.path_to(store.active_leaf(chat_id))]


def marked(window) -> dict[int, bool]:
    model = window.chat_list.model
    return {model.index(i).data(ChatIdRole): model.index(i).data(GeneratingRole)
            for i in range(model.rowCount())}


def type_and_send(qtbot, window, text: str) -> None:
    window.conversation.composer.setPlainText(text)
    qtbot.mouseClick(window.conversation.send_button, Qt.MouseButton.LeftButton)


def test_send_in_b_while_a_streams_both_complete_in_their_own_chats(
        qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    worker = fake_bridge.fake_workers[0]
    controller, view = window.controller, window.conversation
    worker.llm.delay_s = 0.05  # a step every 50 ms: time to look at a partial reply
    worker.gate.clear()  # the engine holds: A is still streaming when B is sent
    a = window.new_chat()
    type_and_send(qtbot, window, "Question for A")
    assert controller.is_generating(a)
    assert view.stop_button.isVisibleTo(view) and not view.send_button.isVisibleTo(view)

    b = window.new_chat()
    # B is idle: its composer sends, although A generates.
    assert view.send_button.isVisibleTo(view) and not view.stop_button.isVisibleTo(view)
    type_and_send(qtbot, window, "Question for B")
    assert controller.generating_chats() == {a, b}
    assert len(worker.submitted) == 2
    assert marked(window) == {a: True, b: True}
    assert window.chat_list.model.index(0).data(Qt.ItemDataRole.EditRole) in (
        "Question for A", "Question for B")  # the mark is not part of the title

    # Let a few tokens through, then switch to A: its partial text is on screen and grows.
    worker.gate.set()
    qtbot.waitUntil(lambda: any(s.texts[0] for s in controller.sessions[a].streams.values()
                                if s.chat_id == a))
    worker.gate.clear()
    window.chat_list.select(a)
    qtbot.waitUntil(lambda: controller.chat_id == a)
    [stream_a] = [s for s in controller.sessions[a].streams.values() if s.chat_id == a]
    reply_row = view.rows()[-1]
    assert isinstance(reply_row, MessageWidget)
    partial = reply_row.text()
    assert partial == stream_a.texts[0] != "" and partial != FULL_REPLY
    assert view.stop_button.isVisibleTo(view)  # A is generating: Stop is offered
    worker.gate.set()
    qtbot.waitUntil(lambda: not controller.generating, timeout=5000)
    assert view.rows()[-1].text() == FULL_REPLY

    assert branch(window, a) == [("user", "Question for A", a), ("assistant", FULL_REPLY, a)]
    assert branch(window, b) == [("user", "Question for B", b), ("assistant", FULL_REPLY, b)]
    assert marked(window) == {a: False, b: False}
    assert worker.kv_stats().num_used == 0


def test_stop_in_b_leaves_a_running(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    worker = fake_bridge.fake_workers[0]
    controller, view = window.controller, window.conversation
    worker.gate.clear()
    a = window.new_chat()
    type_and_send(qtbot, window, "long answer please")
    b = window.new_chat()
    type_and_send(qtbot, window, "stop me")
    qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not controller.is_generating(b))
    assert controller.is_generating(a)
    assert marked(window) == {a: True, b: False}
    reply_b = window.store.get_message(window.store.active_leaf(b))
    assert reply_b.metrics["finish_reason"] == "abort"
    assert "Stopped" in view.rows()[-1].metrics_label.text()
    worker.gate.set()
    qtbot.waitUntil(lambda: not controller.generating, timeout=5000)
    reply_a = window.store.get_message(window.store.active_leaf(a))
    assert reply_a.content == FULL_REPLY
    assert reply_a.metrics["finish_reason"] == "length"


def test_two_chats_on_the_real_engine_free_every_block(qtbot, small_bridge, make_window):
    settings = AppSettings(chat_defaults=ChatSettings(
        max_tokens=16, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
        repetition_penalty=1.0))
    window = make_window(small_bridge, settings)
    controller = window.controller
    a = window.new_chat()
    controller.send("Name a colour.")
    b = window.new_chat()
    controller.send("Name an animal.")
    # Both in flight in the same batch (no event was processed between the two sends).
    assert controller.generating_chats() == {a, b}
    owners = {o.rsplit(":", 1)[0] for o in small_bridge.kv_stats().blocks_per_owner}
    assert owners <= {rid for s in controller.sessions.values() for rid in s.streams}
    qtbot.waitUntil(lambda: not controller.generating, timeout=90_000)
    for chat_id, question in ((a, "Name a colour."), (b, "Name an animal.")):
        user, reply = window.store.path_to(window.store.active_leaf(chat_id))
        assert (user.content, user.chat_id) == (question, chat_id)
        assert reply.chat_id == chat_id and reply.content and reply.status == "complete"
        assert reply.metrics["finish_reason"] in ("stop", "length")
    assert small_bridge.kv_stats().num_used == 0
