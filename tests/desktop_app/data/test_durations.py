"""How long something took, in the words the chat shows."""

from __future__ import annotations

import math

import pytest

from desktop_app.data.durations import latency, spoken_duration


@pytest.mark.parametrize("seconds, words", [
    (0, "0 s"), (0.4, "0 s"), (12, "12 s"), (12.4, "12 s"), (59.4, "59 s"),
    (59.6, "1 min"), (60, "1 min"), (61, "1 min 1 s"), (174.45, "2 min 54 s"),
    (3599, "59 min 59 s"), (3600, "1 h"), (3900, "1 h 5 min"), (90061, "25 h 1 min"),
    (-3, "0 s"), (math.nan, "0 s"), (math.inf, "0 s"),
])
def test_spoken_duration(seconds, words):
    assert spoken_duration(seconds) == words


@pytest.mark.parametrize("seconds, words", [
    (0.0, "0 ms"), (0.85, "850 ms"), (9.9994, "9999 ms"), (10, "10 s"), (12.3, "12 s"),
    (174.45, "2 min 54 s"),
])
def test_latency_switches_to_words_past_ten_seconds(seconds, words):
    assert latency(seconds) == words
