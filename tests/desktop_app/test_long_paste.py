"""A 20,000-character paste through the real window (fake engine with a long context and
a word tokenizer): folded in the composer and in the chat, the whole text sent, and the
message and the reply on screen, also when the chat is opened again and after a restart."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtGui import QGuiApplication

from desktop_app.data.chat_store import ChatStore
from desktop_app.widgets.paste_fold import FoldedBody
from tests.desktop_app.widgets.test_message_sizing import long_document


class WordTokenizer:
    """Counts words: enough to tell the tokenizer's count from a character count."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(range(len(text.split())))


@pytest.fixture
def make_bridge(qtbot, fake_engine):
    """Bridges on a fake model with a long context and a word tokenizer (closing a window
    shuts its bridge down: a restart gets a new one)."""
    from desktop_app.services.engine_bridge import EngineBridge

    fake_llm, fake_worker = fake_engine
    bridges = []

    def make_llm(source, config=None, progress=None):
        llm = fake_llm(max_model_len=32_768, words_per_reply=40)
        llm.tokenizer = WordTokenizer()
        return llm

    def make():
        bridge = EngineBridge(llm_factory=make_llm, worker_factory=fake_worker)
        with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
            bridge.load_model("starter")
        bridges.append(bridge)
        return bridge

    yield make
    for bridge in bridges:
        bridge.shutdown()


def fully_in_view(view, widget) -> bool:
    viewport = view.scroll.viewport()
    where = QRect(widget.mapTo(viewport, QPoint(0, 0)), widget.size())
    return widget.isVisible() and viewport.rect().contains(where)


def assert_turn_on_screen(qtbot, window, document: str) -> None:
    view = window.conversation
    qtbot.waitUntil(lambda: len(view.rows()) == 2, timeout=5000)
    user, reply = view.rows()
    assert isinstance(user.body, FoldedBody)
    assert user.body.lead.markdown() == "Summarize this, please."
    assert user.body.block.toggle.text() == (
        f"Pasted text · {len(document.split()):,} tokens")
    assert not user.body.block.is_open()
    qtbot.waitUntil(lambda: fully_in_view(view, user) and fully_in_view(view, reply),
                    timeout=3000)


def test_a_long_paste_folds_and_the_turn_stays_in_view(qtbot, make_bridge, make_window,
                                                        store, folio_dirs):
    window = make_window(make_bridge())
    window.resize(1600, 1000)
    view = window.conversation
    document = long_document(20_000)
    QGuiApplication.clipboard().setText(document)
    view.composer.setFocus()
    view.composer.paste()  # the composer's own paste path: insertFromMimeData
    assert view.composer.toPlainText() == ""  # folded, not 20,000 characters of text
    [chip] = view.paste_chips.chips()
    assert chip.label.text() == f"Pasted text · {len(document.split()):,} tokens"
    qtbot.keyClicks(view.composer, "Summarize this, please.")
    with qtbot.waitSignal(window.controller.turnFinished, timeout=10_000):
        qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    assert view.paste_chips.chips() == [] and view.composer.toPlainText() == ""
    chat_id = window.controller.chat_id
    user = store.path_to(store.active_leaf(chat_id))[0]
    assert user.content == "Summarize this, please.\n\n" + document.strip("\n")
    assert_turn_on_screen(qtbot, window, document)

    # Opening the fold shows the whole paste; the reply is still reachable below it.
    user_row = view.rows()[0]
    qtbot.mouseClick(user_row.body.block.toggle, Qt.MouseButton.LeftButton)
    assert user_row.body.block.is_open()
    assert user_row.body.block.content.text() == document.strip("\n")
    qtbot.mouseClick(user_row.body.block.toggle, Qt.MouseButton.LeftButton)
    assert not user_row.body.block.is_open()

    # Another chat, then back: the same folded turn, on screen.
    window.new_chat()
    window.open_chat(chat_id)
    assert_turn_on_screen(qtbot, window, document)
    window.close()

    # After a restart (a new window on the saved database).
    reopened = ChatStore(folio_dirs[0] / "chats.sqlite3")
    try:
        second = make_window(make_bridge(), store_=reopened)
        second.resize(1600, 1000)
        second.open_chat(chat_id)
        assert_turn_on_screen(qtbot, second, document)
        second.close()
    finally:
        reopened.close()


def test_the_model_is_sent_the_whole_paste(qtbot, fake_engine, make_window):
    from desktop_app.services.engine_bridge import EngineBridge

    fake_llm, fake_worker = fake_engine
    workers = []

    def make_worker(llm):
        workers.append(fake_worker(llm))
        return workers[-1]

    bridge = EngineBridge(
        llm_factory=lambda src, config=None, progress=None: fake_llm(max_model_len=32_768),
        worker_factory=make_worker)
    with qtbot.waitSignal(bridge.modelLoaded, timeout=5000):
        bridge.load_model("starter")
    try:
        window = make_window(bridge)
        view = window.conversation
        document = long_document(5_000)
        QGuiApplication.clipboard().setText(document)
        view.composer.paste()
        # No tokenizer: the chip gives the size in characters.
        assert view.paste_chips.chips()[0].label.text() == (
            f"Pasted text · {len(document):,} characters")
        with qtbot.waitSignal(window.controller.turnFinished, timeout=10_000):
            view.send_button.click()
        messages, _params = workers[0].submitted[-1]
        assert messages[-1]["content"] == document.strip("\n")
    finally:
        bridge.shutdown()
