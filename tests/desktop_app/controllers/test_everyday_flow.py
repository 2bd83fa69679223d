"""The everyday set through the real window on the fake engine: Regenerate only when
there is something to regenerate, a blank message answered with a hint, empty chats not
kept, titles from the first line."""

from __future__ import annotations

from PySide6.QtCore import Qt

from tests.desktop_app.controllers.test_chat_flow import send


def regenerate_state(window) -> tuple[bool, bool]:
    return (window.conversation.regenerate_button.isEnabled(),
            window.menus.regenerate_action.isEnabled())


def titles(window) -> list[str]:
    return window.chat_list.model.titles()


def test_regenerate_is_enabled_only_with_a_reply_to_regenerate(qtbot, fake_bridge,
                                                               make_window):
    window = make_window(fake_bridge)
    worker = fake_bridge.fake_workers[0]
    assert window.controller.chat_id is None
    assert regenerate_state(window) == (False, False)  # no chat at all
    window.new_chat()
    assert regenerate_state(window) == (False, False)  # an empty chat
    qtbot.keyClick(window, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    assert len(worker.submitted) == 0  # Ctrl+R did nothing
    worker.gate.clear()  # the reply holds: the chat is generating
    window.conversation.composer.setPlainText("hello")
    window.conversation.send_button.click()
    assert window.controller.is_generating(window.controller.chat_id)
    assert regenerate_state(window) == (False, False)  # while generating
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        worker.gate.set()
    assert regenerate_state(window) == (True, True)  # replied
    with qtbot.waitSignal(window.controller.turnFinished, timeout=5000):
        qtbot.keyClick(window, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    assert len(worker.submitted) == 2
    replied = window.controller.chat_id
    window.new_chat()
    assert regenerate_state(window) == (False, False)  # a new chat: nothing to regenerate
    window.open_chat(replied)
    assert regenerate_state(window) == (True, True)
    fake_bridge.unload_model()
    qtbot.waitUntil(lambda: not fake_bridge.is_loaded, timeout=5000)
    assert regenerate_state(window) == (False, False)  # no model


def test_a_failed_reply_can_be_regenerated(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    send(qtbot, window, "fine")
    window.conversation.composer.setPlainText("FAIL")  # the fake engine refuses it
    window.conversation.send_button.click()
    qtbot.waitUntil(lambda: not window.controller.generating, timeout=5000)
    leaf = window.store.get_message(window.store.active_leaf(window.controller.chat_id))
    assert (leaf.role, leaf.content) == ("user", "FAIL")
    assert regenerate_state(window) == (True, True)  # the user's message, answered again


def test_a_blank_message_is_refused_with_a_hint(qtbot, fake_bridge, make_window):
    window = make_window(fake_bridge)
    view = window.conversation
    hint = view.composer_note
    assert not hint.isVisible()
    view.composer.setPlainText("   \n\t  ")
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    assert hint.isVisible() and hint.text() == "Type a message first"
    assert fake_bridge.fake_workers[0].submitted == [] and window.store.list_chats() == []
    assert view.composer.toPlainText() == "   \n\t  "  # nothing taken from the composer
    view.composer.setPlainText("")
    assert not hint.isVisible()  # typing dismisses it
    qtbot.mouseClick(view.send_button, Qt.MouseButton.LeftButton)
    assert hint.isVisible()
    send(qtbot, window, "now a real one")
    assert not hint.isVisible()
    assert window.store.path_to(window.store.active_leaf(window.controller.chat_id))[0] \
        .content == "now a real one"


def test_new_chat_reuses_an_empty_chat(qtbot, fake_bridge, make_window, store):
    window = make_window(fake_bridge)
    first = window.new_chat()
    for _ in range(3):
        qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        qtbot.mouseClick(window.chat_list.new_button, Qt.MouseButton.LeftButton)
    assert window.controller.chat_id == first
    assert [c.id for c in store.list_chats()] == [first]
    assert titles(window) == ["New chat"]


def test_leaving_an_empty_chat_removes_it(qtbot, fake_bridge, make_window, store):
    window = make_window(fake_bridge)
    send(qtbot, window, "apples are red")
    kept = window.controller.chat_id
    empty = window.new_chat()
    assert titles(window) == ["New chat", "apples are red"]
    window.chat_list.select(kept)  # as a click in the sidebar
    assert window.controller.chat_id == kept
    assert titles(window) == ["apples are red"]
    assert [c.id for c in store.list_chats()] == [kept]
    assert empty not in window.controller.sessions
    assert window.chat_list.current_chat_id() == kept


def test_a_renamed_empty_chat_is_kept(qtbot, fake_bridge, make_window, store):
    window = make_window(fake_bridge)
    send(qtbot, window, "apples are red")
    kept = window.controller.chat_id
    named = window.new_chat()
    model = window.chat_list.model
    model.setData(model.index(model.row_of(named)), "Ideas")
    window.chat_list.select(kept)
    assert sorted(titles(window)) == ["Ideas", "apples are red"]


def test_closing_the_app_drops_an_empty_chat(qtbot, fake_bridge, make_window, store):
    window = make_window(fake_bridge)
    send(qtbot, window, "keep me")
    window.new_chat()
    window.close()
    assert [c.title for c in store.list_chats()] == ["keep me"]


def test_a_pasted_document_titles_the_chat_by_its_first_line(qtbot, fake_bridge,
                                                             make_window, store):
    window = make_window(fake_bridge)
    doc = "\n\n# **Quarterly report**\n\n" + "Revenue grew in every region. " * 40
    send(qtbot, window, doc)
    assert store.get_chat(window.controller.chat_id).title == "Quarterly report"
    assert titles(window) == ["Quarterly report"]
