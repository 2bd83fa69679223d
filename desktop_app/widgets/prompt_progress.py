"""The line a reply shows while its prompt is read, before its first token: "Reading your
message… 43% · 2,510 of 5,839 tokens · 1,536 cached · 12 s".

A long prompt takes minutes to read on a CPU; without it the reply is an empty bubble for
all that time. The percentage comes from the engine's PromptProgress events (one per
prefill chunk); a model that sends none (another server over HTTP) shows the words and
the time only. The time counts from when the turn was sent, ticking once a second. A
beam search sends nothing until its beams are found: its line says it is searching.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QWidget

from desktop_app.data.durations import spoken_duration
from engine.outputs import PromptProgress

READING = "Reading your message…"
TICK_MS = 1000


def searching(beam_width: int) -> str:
    """A beam search's line: it shows nothing until its beams come, whole."""
    return (f"Searching with {beam_width} beams… no text streams: the best replies "
            f"appear together when the search ends")


def reading_line(elapsed_s: float, progress: PromptProgress | None,
                 beam_width: int = 0) -> str:
    """The words of the line: the share of the prompt read (rounded, but 100% only once
    all of it is), the tokens, those found cached, and the time from one second on; a
    beam search (``beam_width`` beams) says it is searching instead."""
    if beam_width:
        return " · ".join([searching(beam_width)]
                          + ([spoken_duration(elapsed_s)] if elapsed_s >= 1 else []))
    parts = [READING]
    if progress is not None and progress.total > 0:
        done = min(max(progress.done, 0), progress.total)
        share = round(100 * done / progress.total)
        parts[0] += f" {share if done == progress.total else min(share, 99)}%"
        parts.append(f"{done:,} of {progress.total:,} tokens")
        if progress.cached > 0:
            parts.append(f"{progress.cached:,} cached")
    if elapsed_s >= 1:
        parts.append(spoken_duration(elapsed_s))
    return " · ".join(parts)


class PromptProgressLine(QLabel):
    """Hidden until ``show_reading``; ``finish`` hides it again (the first token came,
    or the reply ended)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("promptProgress")
        self.setAccessibleName("Reading your message")
        self.setWordWrap(True)
        self.setVisible(False)
        self._started = 0.0
        self._progress: PromptProgress | None = None
        self._beam_width = 0
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._refresh)

    @property
    def reading(self) -> bool:
        return self._timer.isActive()

    def show_reading(self, started: float, progress: PromptProgress | None,
                     beam_width: int = 0) -> None:
        """The prompt sent at ``started`` (time.monotonic()) is being read, ``progress``
        the last the engine said of it (None: nothing yet, or nothing to say); or a beam
        search of ``beam_width`` beams runs."""
        self._started, self._progress, self._beam_width = started, progress, beam_width
        if not self._timer.isActive():
            self._timer.start()
        self._refresh()
        self.setVisible(True)

    def finish(self) -> None:
        self._timer.stop()
        self._progress = None
        self.setVisible(False)

    def _refresh(self) -> None:
        self.setText(reading_line(time.monotonic() - self._started, self._progress,
                                  self._beam_width))
