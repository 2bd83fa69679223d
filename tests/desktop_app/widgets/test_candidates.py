"""Candidate columns side by side: wrapped text and metrics are shown whole."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QFont, QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QToolButton, QVBoxLayout, QWidget

from desktop_app.widgets.candidates import CandidateColumn, footer_line, format_metrics
from tests.desktop_app.data.test_metric_values import (
    GOOD,
    INF,
    NAN,
    bad_metrics,
    shows_no_bad_number,
)

METRICS = {"num_prompt_tokens": 56, "num_cached_tokens": 16, "ttft_s": 0.661,
           "decode_tok_s": 2.5, "finish_reason": "length"}


def test_columns_grow_to_fit_their_wrapped_text(qtbot, qapp):
    window = QWidget()
    outer = QVBoxLayout(window)
    row = QHBoxLayout()
    outer.addLayout(row)
    outer.addStretch(1)
    columns = [CandidateColumn(i, i) for i in range(3)]
    for column in columns:
        row.addWidget(column)
    qtbot.addWidget(window)
    window.resize(820, 400)
    window.show()
    qapp.processEvents()
    text = "The **Paged** KV cache is a caching service that enables you to cache performance-"
    for column in columns:
        column.finish(text, METRICS)
    qapp.processEvents()
    for column in columns:
        for label in (column.body, column.metrics_label):
            assert label.height() >= label.heightForWidth(label.width())
    assert "Cut off at the max tokens" in columns[0].metrics_label.text()


# -- the metrics line never covers the text, at any width or font size --------------------
LONG = ("The **paged** KV cache keeps each chat's keys and values in fixed-size blocks, so "
        "candidates share their prompt blocks and only copy the last one on write. Use "
        "`fork()` to share a table.")
WITH_CODE = ("Here is how:\n\n```python\ndef fork(parent):\n    child = list(parent.blocks)"
             "  # shared, ref counts raised\n    return child\n```\n\nThat is all.")


def _messages(n: int) -> list:
    from desktop_app.data.chat_store import Message

    texts = [LONG, WITH_CODE, "Short."]
    return [Message(10 + i, 1, None, "assistant", texts[i % 3], None, METRICS, "complete",
                    candidate_group=10, candidate_index=i) for i in range(n)]


def _settle(qapp) -> None:
    """Let nested height-for-width layouts settle (a code view's scroll bar showing up
    asks for one more pass)."""
    for _ in range(4):
        qapp.processEvents()


def _assert_whole(column: CandidateColumn) -> None:
    body, metrics = column.body.geometry(), column.metrics_label.geometry()
    keep = column.keep_button.geometry()
    assert column.metrics_label.isVisible() and column.metrics_label.text()
    assert body.height() >= column.body.heightForWidth(body.width())
    assert metrics.top() > body.bottom(), (body, metrics)  # below the text, never over it
    assert metrics.height() >= column.metrics_label.heightForWidth(metrics.width())
    assert keep.top() > metrics.bottom()
    assert keep.bottom() <= column.contentsRect().bottom()
    assert column.height() >= column.heightForWidth(column.width())
    for block in column.body.code_blocks():  # code scrolls sideways, never clipped down
        assert block.view.verticalScrollBar().maximum() == 0


@pytest.mark.parametrize("point_size", [9, 15])
@pytest.mark.parametrize("width", [260, 400, 700])
def test_metrics_line_stays_below_the_text(qtbot, qapp, width, point_size):
    from desktop_app.widgets.conversation_view import MAX_COLUMN_WIDTH, ConversationView, GroupItem

    old_font = qapp.font()
    font = QFont(old_font)
    font.setPointSize(point_size)
    qapp.setFont(font)
    try:
        n = max(1, min(3, (MAX_COLUMN_WIDTH + 10) // (width + 10)))
        view = ConversationView()
        qtbot.addWidget(view)
        # The column's margins (20 each side) and the scroll bar, around n columns.
        view.resize(n * width + (n - 1) * 10 + 40 + 12, 700)
        view.show()
        view.show_items([GroupItem(_messages(n))])
        qtbot.waitExposed(view)
        _settle(qapp)
        [group] = view.rows()
        group_rect = group.rect()
        for column in group.columns:
            assert abs(column.width() - width) <= 20
            assert group_rect.contains(column.geometry())
            _assert_whole(column)
    finally:
        qapp.setFont(old_font)


def test_metrics_line_stays_below_while_streaming_and_after_resizes(qtbot, qapp):
    from desktop_app.widgets.conversation_view import ConversationView, GroupItem

    messages = _messages(3)
    for m in messages:
        m.status, m.content = "streaming", ""
    view = ConversationView()
    qtbot.addWidget(view)
    view.resize(900, 600)
    view.show()
    view.show_items([GroupItem(messages)])
    [group] = view.rows()
    for column, text in zip(group.columns, (LONG, WITH_CODE, "Short."), strict=True):
        column.append(text[:40])
        column.body.flush()
        column.finish(text, METRICS)
    for width in (900, 620, 1200, 700):
        view.resize(width, 600)
        _settle(qapp)
        for column in group.columns:
            _assert_whole(column)


def test_copy_button_copies_the_candidates_text(qtbot):
    column = CandidateColumn(7, 1, "")
    qtbot.addWidget(column)
    column.append("draft")
    column.finish(WITH_CODE, METRICS)
    button = column.findChild(QToolButton, "candidateCopyButton")
    assert button is column.copy_button
    assert button.accessibleName() == "Copy candidate 2"
    assert column.accessibleName() == "Candidate 2"
    assert column.keep_button.accessibleName() == "Keep candidate 2"
    button.click()
    assert QGuiApplication.clipboard().text() == WITH_CODE


def test_any_stored_metrics_make_a_sane_footer():
    for metrics in bad_metrics():
        for text in (format_metrics(metrics), footer_line(metrics, "complete"),
                     footer_line(metrics, "interrupted")):
            assert isinstance(text, str) and shows_no_bad_number(text), metrics


@pytest.mark.parametrize(("metrics", "line"), [
    # A bad figure is left out; the others still show.
    ({**GOOD, "num_prompt_tokens": "lots", "thinking_tokens": 0},
     "31.2 tok/s · first token 83 ms · 2 tokens recomputed: earlier thinking left out of "
     "the history"),
    ({"num_prompt_tokens": 120, "num_cached_tokens": 96, "ttft_s": NAN, "decode_tok_s": INF},
     "120 prompt tokens (96 cached, 24 computed)"),
    ({"num_prompt_tokens": 10**30, "decode_tok_s": -3, "ttft_s": 0.5},
     "first token 500 ms"),
    ({"num_prompt_tokens": 5, "thinking_tokens": 7, "thinking_s": "slow"},
     "5 prompt tokens (0 cached, 5 computed) · thinking 7 tokens"),
    # Counts that contradict each other: "computed" is never negative.
    ({"num_prompt_tokens": 10, "num_cached_tokens": 50, "num_disk_tokens": 99},
     "10 prompt tokens (10 cached, 10 from disk, 0 computed)"),
    ({"num_prompt_tokens": True, "num_cached_tokens": [1]}, ""),
])
def test_a_bad_figure_is_left_out_of_the_footer(metrics, line):
    assert format_metrics(metrics) == line


def test_a_column_finishes_with_any_stored_metrics(qtbot):
    column = CandidateColumn(1, 0)
    qtbot.addWidget(column)
    for metrics in bad_metrics():
        column.finish("text", metrics, "complete", "thought")
        assert shows_no_bad_number(column.metrics_label.text())
        assert shows_no_bad_number(column.thinking.toggle.text())
