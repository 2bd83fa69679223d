"""How long a model stays loaded after its last request, in Ollama's sense.

A number is seconds; a string is a duration as Go writes it ("30s", "5m", "1h30m",
"500ms") or plain seconds ("300"); 0 unloads the model as soon as its request ends; a
negative value keeps it loaded until the server stops.
"""

from __future__ import annotations

import math
import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_keep_alive(value: str | int | float | None, field: str = "keep_alive") -> float | None:
    """Seconds to keep the model after its last request, or None for "keep forever" (a
    negative value, or None). Raises ValueError naming `field` for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{field} must be seconds or a duration such as '5m', "
                         f"got {value!r}")
    seconds = _seconds(value.strip(), field) if isinstance(value, str) else float(value)
    if math.isnan(seconds):
        raise ValueError(f"{field} must be a number of seconds, got {value!r}")
    return None if seconds < 0 or math.isinf(seconds) else seconds


def _seconds(text: str, field: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)  # plain seconds
    except ValueError:
        pass
    parts = _PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise ValueError(f"{field} must be seconds or a duration such as '30s', '5m' or "
                         f"'1h30m', got {text!r}")
    return sign * sum(float(number) * _UNITS[unit] for number, unit in parts)


def checked_keep_alive_s(value: float | None, field: str) -> float | None:
    """A keep-alive already in seconds (ModelHost's own arguments): >= 0, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{field} must be seconds >= 0 or None, got {value!r}")
    return float(value)
