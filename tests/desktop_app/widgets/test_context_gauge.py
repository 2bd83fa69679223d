"""The context gauge by the composer, the chat list's "generating" marks, and the notes
under a reply: it ended because the context was full, its candidates ran one at a time."""

from __future__ import annotations

from types import SimpleNamespace

from PySide6.QtCore import Qt

from desktop_app.widgets.candidates import footer_line, status_note
from desktop_app.widgets.chat_list import ChatList, GeneratingRole
from desktop_app.widgets.conversation_view import ConversationView


def test_gauge_shows_tokens_used_and_turns_amber_near_the_limit(qtbot):
    view = ConversationView()
    qtbot.addWidget(view)
    gauge = view.context_gauge
    assert gauge.objectName() == "contextGauge"
    assert not gauge.isVisibleTo(view)  # no model: no gauge
    view.set_context(1234, 8192)
    assert gauge.isVisibleTo(view)
    assert (gauge.value(), gauge.maximum()) == (1234, 8192)
    assert gauge.text() == "1,234 / 8,192 tokens"
    assert gauge.property("nearFull") is False
    view.set_context(6964, 8192, "3 older turns left out")  # 85 %
    assert gauge.property("nearFull") is True
    assert "3 older turns left out" in gauge.toolTip()
    view.set_context(9000, 8192)  # past the end (a draft estimate): full bar, true text
    assert gauge.value() == 8192 and gauge.text() == "9,000 / 8,192 tokens"
    view.set_context(10, 8192)
    assert gauge.property("nearFull") is False
    view.set_context(0, None)
    assert not gauge.isVisibleTo(view)


def test_chat_list_marks_generating_chats_without_touching_titles(qtbot):
    chats = [SimpleNamespace(id=i, title=f"Chat {i}", updated_at=0.0) for i in (1, 2)]
    widget = ChatList()
    qtbot.addWidget(widget)
    widget.set_chats(chats, 1)
    model = widget.model
    changed = []
    model.dataChanged.connect(lambda top, _bottom: changed.append(top.row()))
    widget.set_generating({2})
    assert changed == [1]
    second = model.index(1)
    assert second.data(GeneratingRole) is True
    assert model.index(0).data(GeneratingRole) is False
    assert second.data(Qt.ItemDataRole.FontRole).bold()
    assert second.data(Qt.ItemDataRole.DisplayRole) == "● Chat 2"
    assert second.data(Qt.ItemDataRole.EditRole) == "Chat 2"
    assert "Writing a reply" in second.data(Qt.ItemDataRole.ToolTipRole)
    widget.set_chats(chats, 1)  # a refresh keeps the marks
    assert model.index(1).data(GeneratingRole) is True
    widget.set_generating(set())
    assert model.index(1).data(GeneratingRole) is False
    assert model.index(1).data(Qt.ItemDataRole.DisplayRole) == "Chat 2"


def test_finish_reasons_say_how_the_reply_ended():
    assert status_note("complete", "context") == "Context full"
    assert status_note("complete", "length") == "Cut off at the max tokens setting"
    assert status_note("complete", "abort") == "Stopped"
    assert status_note("complete", "stop") == ""
    assert footer_line({"finish_reason": "context"}, "complete") == "Context full"


def test_the_turn_that_found_a_one_at_a_time_server_says_so():
    from desktop_app.data.pacing_note import METRIC, NOTE

    line = footer_line({"num_prompt_tokens": 5, METRIC: True, "finish_reason": "length"},
                       "complete")
    assert line.endswith(f" · {NOTE} · Cut off at the max tokens setting")
    assert NOTE not in footer_line({"num_prompt_tokens": 5}, "complete")
