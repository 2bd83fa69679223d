"""The "Reading your message…" line: its words, its clock, and the time to the first token
in the metrics line."""

from __future__ import annotations

import time

import pytest

from desktop_app.widgets.candidates import CandidateColumn, format_metrics
from desktop_app.widgets.prompt_progress import PromptProgressLine, reading_line
from engine.outputs import PromptProgress


@pytest.mark.parametrize("elapsed, progress, words", [
    (0.2, None, "Reading your message…"),
    (12.3, None, "Reading your message… · 12 s"),
    (12.3, PromptProgress("r", 2510, 5839, 1536),
     "Reading your message… 43% · 2,510 of 5,839 tokens · 1,536 cached · 12 s"),
    (174.45, PromptProgress("r", 5838, 5839),
     "Reading your message… 99% · 5,838 of 5,839 tokens · 2 min 54 s"),
    (0.5, PromptProgress("r", 5839, 5839), "Reading your message… 100% · 5,839 of 5,839 "
     "tokens"),
    (3, PromptProgress("r", 0, 0), "Reading your message… · 3 s"),
])
def test_reading_line(elapsed, progress, words):
    assert reading_line(elapsed, progress) == words


def test_the_line_ticks_from_when_the_turn_was_sent_and_goes(qtbot):
    line = PromptProgressLine()
    qtbot.addWidget(line)
    assert not line.isVisibleTo(line.parentWidget() or line) and not line.reading
    line.show_reading(time.monotonic() - 65, None)
    assert line.reading and line.text() == "Reading your message… · 1 min 5 s"
    qtbot.waitUntil(lambda: line.text().endswith("1 min 6 s"), timeout=3000)
    line.show_reading(time.monotonic() - 2, PromptProgress("r", 64, 256, 32))
    assert line.text() == "Reading your message… 25% · 64 of 256 tokens · 32 cached · 2 s"
    line.finish()
    assert not line.reading and line.isHidden()


def test_a_finished_column_shows_no_line(qtbot):
    column = CandidateColumn(1, 0)
    qtbot.addWidget(column)
    column.prompt_progress.show_reading(time.monotonic(), None)
    assert not column.prompt_progress.isHidden()
    column.finish("done", None)
    assert column.prompt_progress.isHidden() and not column.prompt_progress.reading


def test_a_long_wait_for_the_first_token_reads_in_minutes():
    metrics = {"num_prompt_tokens": 5839, "num_cached_tokens": 0, "ttft_s": 174.45}
    assert "first token 2 min 54 s" in format_metrics(metrics)
    assert "first token 850 ms" in format_metrics({**metrics, "ttft_s": 0.85})


def test_a_beam_search_says_it_is_searching_until_its_beams_come(qtbot):
    line = PromptProgressLine()
    qtbot.addWidget(line)
    line.show_reading(time.monotonic() - 3, None, beam_width=4)
    assert line.text().startswith("Searching with 4 beams… no text streams")
    assert line.text().endswith(" · 3 s") and line.reading
    # Its metrics line: the search, not a speed or a first token it never had.
    metrics = {"num_prompt_tokens": 40, "num_cached_tokens": 0, "decode_tok_s": 0.0,
               "ttft_s": 0.0, "total_s": 2.5, "beam_width": 4}
    assert format_metrics(metrics) == ("beam search, width 4 in 2.5 s · 40 prompt tokens "
                                       "(0 cached, 40 computed)")
