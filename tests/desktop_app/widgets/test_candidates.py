"""Candidate columns side by side: wrapped text and metrics are shown whole."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QVBoxLayout, QWidget

from desktop_app.widgets.candidates import CandidateColumn

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
