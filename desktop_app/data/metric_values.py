"""What a reply's metrics hold, read so that no stored value can break a view (no Qt here).

A reply's ``metrics`` is a JSON object in its row: the engine's RequestMetrics, the
thinking figures and how the reply was asked (ChatController._on_finished writes them).
A row written by another Folio version, or imported before imports were checked, may
hold anything there (text for a count, NaN, a list, no object at all), so readers go
through count / measure / label, which answer None for a value that is missing or not
of its kind. chat_import refuses a file whose metrics these would not read.
"""

from __future__ import annotations

from typing import Any

# Token counts: integers in [0, MAX_COUNT].
COUNTS = ("num_prompt_tokens", "num_cached_tokens", "num_disk_tokens",
          "num_generated_tokens", "thinking_tokens", "thinking_dropped_tokens",
          "num_draft_tokens", "num_accepted_draft_tokens", "beam_width")
# Seconds, and tokens per second: numbers in [0, MAX_MEASURE].
MEASURES = ("ttft_s", "decode_tok_s", "total_s", "thinking_s")
# Words: text or null ("finish_reason", json_mode.METRIC).
LABELS = ("finish_reason", "response_format")
# Far above any context or reply, and within the int32 that Qt's counters hold.
MAX_COUNT = 2**31 - 1
# Some 30 years in seconds, or a billion tokens per second: shown in at most ten digits.
MAX_MEASURE = 1e9


def count(metrics: Any, key: str) -> int | None:
    """A token count, or None when missing or not a count."""
    value = _get(metrics, key)
    # NaN fails both comparisons; a whole float (another writer's 12.0) still counts.
    if _is_number(value) and 0 <= value <= MAX_COUNT:
        return int(value)
    return None


def measure(metrics: Any, key: str) -> float | None:
    """Seconds or a rate, or None when missing or not a finite number in range."""
    value = _get(metrics, key)
    if _is_number(value) and 0 <= value <= MAX_MEASURE:
        return float(value)
    return None


def label(metrics: Any, key: str) -> str | None:
    value = _get(metrics, key)
    return value if isinstance(value, str) else None


def _get(metrics: Any, key: str) -> Any:
    return metrics.get(key) if isinstance(metrics, dict) else None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
