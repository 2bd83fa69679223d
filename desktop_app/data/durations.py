"""Durations as people read them (no Qt here): "12 s", "2 min 54 s", "1 h 5 min".

A prompt read for minutes was shown as "first token 174450 ms"; past ten seconds a
reader wants minutes and seconds, below it milliseconds still tell a fast reply from a
slow one.
"""

from __future__ import annotations

import math

# Below this many seconds a latency reads in milliseconds.
MS_BELOW_S = 10.0


def spoken_duration(seconds: float) -> str:
    """Whole seconds under a minute ("12 s"), minutes and seconds under an hour
    ("2 min 54 s", "3 min"), hours and minutes beyond ("1 h 5 min"). Rounded to the
    second; a negative or unknown time reads as "0 s"."""
    if not math.isfinite(seconds) or seconds < 0:
        seconds = 0.0
    total = round(seconds)
    if total < 60:
        return f"{total} s"
    if total < 3600:
        minutes, rest = divmod(total, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(total, 3600)
    minutes = rest // 60
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def latency(seconds: float) -> str:
    """A wait such as the time to the first token: "850 ms" under ten seconds,
    spoken_duration's words from there ("2 min 54 s")."""
    if math.isfinite(seconds) and 0 <= seconds < MS_BELOW_S:
        return f"{1000 * seconds:.0f} ms"
    return spoken_duration(seconds)
