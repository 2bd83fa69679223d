"""Stored metrics read tolerantly: a value of the wrong kind, NaN, Infinity, a negative or
huge number reads as missing. BAD_VALUES and bad_metrics are the table the view and
controller tests feed their formatters."""

from __future__ import annotations

import math
import re

import pytest

from desktop_app.data import metric_values
from desktop_app.data.json_mode import reply_label
from desktop_app.data.metric_values import count, label, measure

NAN, INF = float("nan"), float("inf")
# What a row of another version, or one imported before imports were checked, may hold.
BAD_VALUES = ["lots", "", "12", NAN, INF, -INF, -1, -0.5, 10**30, 2**63, 1e300, True, False,
              None, [], [1], {}, {"a": 1}]
GOOD = {"num_prompt_tokens": 120, "num_cached_tokens": 96, "num_disk_tokens": 80,
        "num_generated_tokens": 9, "ttft_s": 0.083, "decode_tok_s": 31.25, "total_s": 0.4,
        "finish_reason": "length", "response_format": "json_object", "thinking_tokens": 4,
        "thinking_s": 0.1, "thinking_dropped_tokens": 2}
KEYS = metric_values.COUNTS + metric_values.MEASURES + metric_values.LABELS


def bad_metrics():
    """Good metrics with one key bad, or missing; and metrics that are no object at all."""
    for key in KEYS:
        yield {k: v for k, v in GOOD.items() if k != key}
        for value in BAD_VALUES:
            yield {**GOOD, key: value}
    yield from ({key: value} for key in KEYS for value in BAD_VALUES)
    yield from (None, {}, [], [GOOD], "metrics", 5, NAN)


def shows_no_bad_number(text: str) -> bool:
    """No nan, inf, negative, or number longer than ten digits in what a view shows."""
    return not re.search(r"nan|inf|-\d|\d{11}", text, re.IGNORECASE)


@pytest.mark.parametrize("value", BAD_VALUES, ids=ascii)
def test_a_bad_value_reads_as_missing(value):
    metrics = {"num_prompt_tokens": value, "ttft_s": value, "finish_reason": value}
    assert count(metrics, "num_prompt_tokens") is None
    assert measure(metrics, "ttft_s") is None
    assert label(metrics, "finish_reason") == (value if isinstance(value, str) else None)


def test_good_values_read_as_they_are():
    assert count(GOOD, "num_prompt_tokens") == 120 and count({"n": 12.0}, "n") == 12
    assert count({"n": 0}, "n") == 0 and count({"n": 2**31 - 1}, "n") == 2**31 - 1
    assert measure(GOOD, "ttft_s") == 0.083 and measure({"s": 3}, "s") == 3.0
    assert label(GOOD, "finish_reason") == "length"
    assert count(GOOD, "absent") is None and count(None, "n") is None
    assert measure([GOOD], "ttft_s") is None and label("x", "finish_reason") is None
    assert not math.isnan(measure({"s": 0.0}, "s"))


@pytest.mark.parametrize("metrics", list(bad_metrics()), ids=ascii)
def test_reply_label_shows_any_stored_metrics(metrics):
    assert reply_label(metrics) in ("", "JSON", "JSON (schema)")
