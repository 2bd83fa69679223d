"""Tall messages sized for the width they are shown at: the conversation ends where its
last row ends, the newest row stays in view, also after the window is resized."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect

from desktop_app.data.chat_store import Message
from desktop_app.widgets.conversation_view import ConversationView, GroupItem
from desktop_app.widgets.message_widget import TurnItem


def long_document(chars: int = 20_000) -> str:
    """A pasted document: prose paragraphs with a fenced code block every few lines."""
    lines, i = [], 0
    while sum(len(line) + 1 for line in lines) < chars:
        if i % 7 == 3:
            lines += ["```python", f"def f{i}(x):", f"    return x * {i}", "```"]
        else:
            lines.append(f"Paragraph {i}: the quick brown fox jumps over the lazy dog, a "
                         "sentence long enough to wrap across the width of the bubble.")
        i += 1
    return "\n".join(lines)[:chars]


def in_viewport(view: ConversationView, widget) -> QRect:
    """`widget`'s rectangle in the scroll area's viewport coordinates."""
    return QRect(widget.mapTo(view.scroll.viewport(), QPoint(0, 0)), widget.size())


def _msg(mid, role, content):
    return Message(mid, 1, None, role, content, None, {}, "complete")


def test_a_tall_message_leaves_no_empty_space_below_the_reply(qtbot):
    view = ConversationView()
    qtbot.addWidget(view)
    view.resize(1200, 800)
    view.show()
    view.show_items([TurnItem(_msg(1, "user", "Write me a long document.")),
                     TurnItem(_msg(2, "assistant", long_document())),
                     TurnItem(_msg(3, "user", "Thanks.")),
                     TurnItem(_msg(4, "assistant", "A short reply."))])
    qtbot.wait(50)
    for width in (1200, 700, 1400):  # sized again for each width
        view.resize(width, 800)
        qtbot.wait(50)
        tall, reply = view.rows()[1], view.rows()[3]
        viewport = view.scroll.viewport().rect()
        where = in_viewport(view, reply)
        assert viewport.contains(where), (width, where, viewport)
        # The canvas ends with the last row (its bottom margin aside): no empty band.
        canvas = view.scroll.widget()
        assert canvas.height() - reply.geometry().bottom() < 60
        # Each paragraph is as tall as its text at its width, not at Qt's narrow guess.
        for label in tall.body.text_labels():
            assert label.height() == label.heightForWidth(label.width())


def test_a_tall_candidate_leaves_no_empty_space_either(qtbot):
    view = ConversationView()
    qtbot.addWidget(view)
    view.resize(1200, 800)
    view.show()
    candidates = [Message(10 + i, 1, 1, "assistant", text, None, {}, "complete",
                          candidate_group="g", candidate_index=i)
                  for i, text in enumerate([long_document(6_000), "Short.", "Also short."])]
    view.show_items([TurnItem(_msg(1, "user", "Three takes, please.")),
                     GroupItem(candidates)])
    qtbot.wait(50)
    _user, group = view.rows()
    assert view.scroll.widget().height() - group.geometry().bottom() < 60


def test_streaming_keeps_the_end_in_view_unless_the_user_scrolled_up(qtbot):
    view = ConversationView()
    qtbot.addWidget(view)
    view.resize(900, 600)
    view.show()
    view.show_items([TurnItem(_msg(1, "user", "Go on.")),
                     TurnItem(_msg(2, "assistant", ""))])
    bar = view.scroll.verticalScrollBar()
    paragraph = "A streamed paragraph that wraps over a line or two of the bubble.\n\n"
    for _ in range(40):
        view.append_text(2, paragraph)
        view.rows()[1].body.flush()
        qtbot.wait(5)
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    bar.setValue(bar.maximum() // 3)  # the user scrolls up to read
    held = bar.value()
    for _ in range(10):
        view.append_text(2, paragraph)
        view.rows()[1].body.flush()
        qtbot.wait(5)
    assert bar.value() == held and bar.maximum() > held
    bar.setValue(bar.maximum())  # back at the end: following resumes
    view.append_text(2, paragraph * 5)
    view.rows()[1].body.flush()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())
