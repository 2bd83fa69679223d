"""The conversation view and candidate columns on their own (no engine, no store)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from desktop_app.data.chat_store import Message
from desktop_app.widgets.candidates import CandidateGroup, format_metrics, status_note
from desktop_app.widgets.conversation_view import ConversationView, GroupItem
from desktop_app.widgets.message_widget import TurnItem

METRICS = {"num_prompt_tokens": 120, "num_cached_tokens": 96, "num_generated_tokens": 20,
           "ttft_s": 0.0834, "decode_tok_s": 31.26, "total_s": 1.0}


def _msg(mid, role, content, status="complete", metrics=None, group=None, index=None):
    return Message(mid, 1, None, role, content, None, metrics or {}, status,
                   candidate_group=group, candidate_index=index)


def test_format_metrics_and_notes():
    assert format_metrics(METRICS) == (
        "31.3 tok/s · first token 83 ms · 120 prompt tokens (96 cached, 24 computed)")
    assert format_metrics({**METRICS, "num_disk_tokens": 80}) == (
        "31.3 tok/s · first token 83 ms · 120 prompt tokens (96 cached, 80 from disk, "
        "24 computed)")
    assert format_metrics({**METRICS, "num_draft_tokens": 140,
                           "num_accepted_draft_tokens": 99}) == (
        "31.3 tok/s · first token 83 ms · drafts 71% accepted · 120 prompt tokens "
        "(96 cached, 24 computed)")
    # A stored row with more kept than drafted (not a count this Folio writes) reads 100%.
    assert "drafts 100% accepted" in format_metrics(
        {**METRICS, "num_draft_tokens": 10, "num_accepted_draft_tokens": 12})
    assert format_metrics({}) == ""
    assert format_metrics({"error": "x"}) == ""
    assert status_note("interrupted", None).startswith("Interrupted")
    assert status_note("complete", "abort") == "Stopped"
    assert status_note("complete", "length") == "Cut off at the max tokens setting"
    assert status_note("complete", "stop") == ""


def test_composer_enter_sends_shift_enter_breaks_line(qtbot):
    view = ConversationView()
    qtbot.addWidget(view)
    sent = []
    view.sendRequested.connect(sent.append)
    qtbot.keyClicks(view.composer, "line one")
    qtbot.keyClick(view.composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(view.composer, "line two")
    assert sent == []
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    assert sent == ["line one\nline two"]
    view.set_generating(True)
    qtbot.keyClick(view.composer, Qt.Key.Key_Return)
    assert sent == ["line one\nline two"]  # no second turn while one streams
    assert view.stop_button.isVisibleTo(view) and not view.send_button.isVisibleTo(view)


def test_rows_stream_and_finish(qtbot):
    view = ConversationView()
    qtbot.addWidget(view)
    user = _msg(1, "user", "Hi *there*")
    reply = _msg(2, "assistant", "", status="streaming")
    view.show_items([TurnItem(user, 0, 1), TurnItem(reply, 1, 3)])
    rows = view.rows()
    assert [r.role for r in rows] == ["user", "assistant"]
    assert rows[1].branch_label.text() == "2/3" and not rows[1].branch_label.isHidden()
    assert rows[0].branch_label.isHidden()
    view.append_text(2, "Hel")
    view.append_text(2, "lo")
    assert rows[1].text() == "Hello"
    view.finish_message(_msg(2, "assistant", "Hello!", metrics=METRICS))
    assert rows[1].text() == "Hello!"
    assert rows[1].metrics_label.text() == format_metrics(METRICS)
    rows[1].copy_button.click()
    assert QGuiApplication.clipboard().text() == "Hello!"
    switched = []
    view.switchRequested.connect(lambda mid, step: switched.append((mid, step)))
    rows[1].next_button.click()
    rows[1].prev_button.click()
    assert switched == [(2, 1), (2, -1)]
    view.set_generating(True)
    assert not rows[1].next_button.isEnabled() and not rows[1].regen_button.isEnabled()


def test_candidate_group_streams_and_keeps(qtbot):
    msgs = [_msg(10 + i, "assistant", "", "streaming", group=10, index=i) for i in range(3)]
    view = ConversationView()
    qtbot.addWidget(view)
    view.show_items([TurnItem(_msg(1, "user", "q")), GroupItem(msgs)])
    group = view.rows()[1]
    assert isinstance(group, CandidateGroup)
    assert [c.objectName() for c in group.columns] == ["candidateColumn"] * 3
    view.append_text(11, "second")
    assert [c.text() for c in group.columns] == ["", "second", ""]
    assert not group.columns[1].keep_button.isEnabled()
    view.finish_message(_msg(11, "assistant", "second!", metrics=METRICS))
    assert group.columns[1].keep_button.isEnabled()
    kept = []
    view.keepRequested.connect(kept.append)
    group.columns[1].keep_button.click()
    assert kept == [11]


def test_auto_scroll_pauses_when_the_user_scrolls_up(qtbot):
    view = ConversationView()
    qtbot.addWidget(view)
    view.resize(600, 300)
    view.show()
    long_text = "\n\n".join(f"paragraph {i}" for i in range(40))
    view.show_items([TurnItem(_msg(1, "user", "q")),
                     TurnItem(_msg(2, "assistant", long_text, "streaming"))])
    bar = view.scroll.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=2000)
    bar.setValue(0)  # the user scrolls up
    assert not view.stick_to_bottom
    view.append_text(2, "\n\nmore " * 20)
    view.rows()[1].body.flush()
    qtbot.wait(50)
    assert bar.value() == 0
    bar.setValue(bar.maximum())  # back to the end: following resumes
    assert view.stick_to_bottom
    view.append_text(2, "\n\nand more " * 20)
    view.rows()[1].body.flush()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=2000)
