"""ChatSession: each chat's turns in an object of its own, through the real window on the
fake engine. Two chats stream at once, each owning its stream; a request's events reach
only its session; Stop in one leaves the other streaming; a session out of view is let go
once it holds nothing more, and kept while its candidates wait for Keep."""

from __future__ import annotations

from PySide6.QtCore import Qt

from desktop_app.widgets.candidates import CandidateColumn
from tests.desktop_app.controllers.test_parallel_chats import FULL_REPLY, type_and_send


def two_streaming(qtbot, window, worker):
    """Chats a and b, each with a reply in flight (the engine held), b in view."""
    worker.gate.clear()
    a = window.new_chat()
    type_and_send(qtbot, window, "Question for A")
    b = window.new_chat()
    type_and_send(qtbot, window, "Question for B")
    return a, b


def test_two_chats_streaming_each_own_their_stream(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    worker = fake_bridge.fake_workers[0]
    controller = window.controller
    a, b = two_streaming(qtbot, window, worker)
    session_a, session_b = controller.sessions[a], controller.sessions[b]
    assert controller.current is session_b
    [stream_a], [stream_b] = session_a.streams.values(), session_b.streams.values()
    assert (stream_a.chat_id, stream_b.chat_id) == (a, b)
    assert stream_a.request_id != stream_b.request_id
    assert session_a.owns(stream_a.request_id) and not session_a.owns(stream_b.request_id)
    assert set(fake_bridge.in_flight()) == {stream_a.request_id, stream_b.request_id}
    worker.gate.set()
    qtbot.waitUntil(lambda: not controller.generating, timeout=5000)
    for chat_id in (a, b):
        reply = window.store.get_message(window.store.active_leaf(chat_id))
        assert (reply.chat_id, reply.content) == (chat_id, FULL_REPLY)


def test_a_streams_events_reach_only_its_session(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    worker = fake_bridge.fake_workers[0]
    controller = window.controller
    a, b = two_streaming(qtbot, window, worker)
    heard: dict[int, set[tuple[int, int]]] = {a: set(), b: set()}
    for chat_id in (a, b):
        controller.sessions[chat_id].replyDelta.connect(
            lambda chat, reply, _thought, _text, mine=chat_id: heard[mine].add((chat, reply)))
    [stream_a] = controller.sessions[a].streams.values()
    [stream_b] = controller.sessions[b].streams.values()
    worker.gate.set()
    qtbot.waitUntil(lambda: not controller.generating, timeout=5000)
    assert heard == {a: {(a, stream_a.message_ids[0])}, b: {(b, stream_b.message_ids[0])}}
    # The view (chat b) streamed b's reply only; a's is in the store, whole.
    assert window.conversation.rows()[-1].text() == FULL_REPLY
    assert window.store.get_message(stream_a.message_ids[0]).content == FULL_REPLY


def test_stop_in_one_chat_leaves_the_other_streaming(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    worker = fake_bridge.fake_workers[0]
    controller = window.controller
    a, b = two_streaming(qtbot, window, worker)
    session_a = controller.sessions[a]
    with qtbot.waitSignal(controller.turnFinished, timeout=5000) as finished:
        controller.stop()  # b is in view
    assert finished.args == [b]
    assert session_a.generating and not controller.is_generating(b)
    assert controller.generating_chats() == {a}
    worker.gate.set()
    qtbot.waitUntil(lambda: not session_a.generating, timeout=5000)
    assert window.store.get_message(window.store.active_leaf(a)).content == FULL_REPLY


def test_a_session_out_of_view_is_let_go_once_it_holds_nothing(qtbot, fake_bridge,
                                                               make_window):
    window = make_window(fake_bridge)
    worker = fake_bridge.fake_workers[0]
    controller = window.controller
    a, b = two_streaming(qtbot, window, worker)
    assert set(controller.sessions) == {a, b}  # a streams out of view
    worker.gate.set()
    qtbot.waitUntil(lambda: not controller.generating, timeout=5000)
    assert set(controller.sessions) == {b}  # a ended out of view: nothing left to keep
    window.open_chat(a)
    assert set(controller.sessions) == {a}  # b is idle and out of view now
    assert [r.text() for r in window.conversation.rows()] == ["Question for A", FULL_REPLY]


def test_candidates_waiting_for_keep_stay_with_their_chat(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    controller = window.controller
    a = window.new_chat()
    window.candidates_spin.setValue(2)
    with qtbot.waitSignal(controller.turnFinished, timeout=5000):
        type_and_send(qtbot, window, "pick one")
    group = controller.sessions[a].pending_group
    assert group is not None
    b = window.new_chat()
    assert set(controller.sessions) == {a, b}  # a keeps its columns while out of view
    window.open_chat(a)  # b, left empty, is not kept
    columns = window.findChildren(CandidateColumn, "candidateColumn")
    assert len(columns) == 2 and controller.current.pending_group == group
    qtbot.mouseClick(columns[1].keep_button, Qt.MouseButton.LeftButton)
    assert controller.current.pending_group is None
    c = window.new_chat()
    assert set(controller.sessions) == {c}


def test_deleting_a_streaming_chat_closes_its_session(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    worker = fake_bridge.fake_workers[0]
    controller = window.controller
    a, b = two_streaming(qtbot, window, worker)
    controller.delete_chat(a)
    assert set(controller.sessions) == {b} and controller.generating_chats() == {b}
    worker.gate.set()
    qtbot.waitUntil(lambda: not controller.generating, timeout=5000)
    assert [c.id for c in window.store.list_chats()] == [b]
    assert window.store.get_message(window.store.active_leaf(b)).content == FULL_REPLY
