"""The value checks of a chat import, each naming the field by its path in the file, as in
``messages[3].metrics.num_prompt_tokens: expected a non-negative integer ..., got 'lots'``
(no Qt here).

A value passes only if the database can store it and every view can show it: integers
within what SQLite (int64) or, where a widget shows them, Qt (int32) holds, numbers finite
and in range, text that is valid Unicode (JSON's ``\\ud800`` escape makes a lone
surrogate, which cannot be written as UTF-8), nesting at most MAX_DEPTH deep.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NoReturn

from desktop_app.data import metric_values

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
# 1970-01-01 to 9999-12-31: the times that time.localtime (the chat list) can show.
EARLIEST, LATEST = 0.0, 253_402_300_799.0
# Metrics and tool records are flat in every Folio; deeper is not an export, and a walk
# (or json.dumps) of thousands of levels would run out of stack.
MAX_DEPTH = 20


class ChatImportError(ValueError):
    """The file is not a chat this Folio can import; the message says why."""


def fail(where: str, expected: str, value: Any) -> NoReturn:
    raise ChatImportError(f"{where}: expected {expected}, got {show(value)}")


def show(value: Any) -> str:
    """A value as the file spells it, cut short."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value)  # escapes a lone surrogate, which no dialog could show
    return text if len(text) <= 60 else text[:59] + "…"


def member(where: str, key: str) -> str:
    """The path of an object's member: ``a.b``, or ``a['odd key']``."""
    return f"{where}.{key}" if key.isidentifier() else f"{where}[{key!r}]"


def integer(value: Any, where: str, lo: int = 0, hi: int = INT64_MAX) -> int:
    if not (is_int(value) and lo <= value <= hi):
        kind = "a non-negative integer" if lo == 0 else f"an integer from {lo}"
        fail(where, f"{kind} up to {hi}", value)
    return value


def number(value: Any, where: str, lo: float, hi: float, expected: str = "") -> float:
    # NaN fails every comparison and the infinities the bounds, so this is finite too.
    if not (is_number(value) and lo <= value <= hi):
        fail(where, expected or f"a number in [{lo:g}, {hi:g}]", value)
    return float(value)


def timestamp(value: Any, where: str) -> float:
    return number(value, where, EARLIEST, LATEST,
                  "a time in seconds since 1970, before the year 10000")


def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        fail(where, "a string", value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ChatImportError(f"{where}: expected valid Unicode text, got a lone surrogate "
                              f"{value[err.start]!r} at character {err.start}") from None
    return value


def optional_text(value: Any, where: str) -> str | None:
    return None if value is None else text(value, where)


def one_of(value: Any, where: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not (isinstance(value, str) and value in choices):
        fail(where, f"one of {', '.join(choices)}", value)
    return value


def fields_exactly(data: dict[str, Any], expected: Iterable[str], where: str) -> None:
    missing = sorted(set(expected) - set(data))
    if missing:
        raise ChatImportError(f"{where}: missing field(s): {', '.join(missing)}")
    extra = sorted(set(data) - set(expected))
    if extra:
        raise ChatImportError(f"{where}: unknown field(s): {', '.join(map(_name, extra))}")


def json_value(value: Any, where: str, depth: int = 0) -> None:
    """Any JSON value whose numbers are finite (integers within int64), whose text and
    keys are valid Unicode, nested at most MAX_DEPTH deep."""
    if depth > MAX_DEPTH:
        raise ChatImportError(f"{where}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        text(value, where)
    elif is_int(value):
        integer(value, where, -INT64_MAX, INT64_MAX)
    elif isinstance(value, float) and not math.isfinite(value):
        fail(where, "a finite number", value)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            json_value(item, f"{where}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            text(key, f"{member(where, key)} (the name)")
            json_value(item, member(where, key), depth + 1)


def metrics(value: Any, where: str) -> dict[str, Any]:
    """A reply's metrics: an object whose known keys metric_values reads back as they
    are (other keys are kept, as any JSON value)."""
    if not isinstance(value, dict):
        fail(where, "an object", value)
    for key in metric_values.COUNTS:
        if key in value:
            integer(value[key], member(where, key), hi=metric_values.MAX_COUNT)
    for key in metric_values.MEASURES:
        if key in value:
            number(value[key], member(where, key), 0, metric_values.MAX_MEASURE)
    for key in metric_values.LABELS:
        optional_text(value.get(key), member(where, key))
    json_value(value, where)
    return value


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _name(key: str) -> str:
    return key if key.isprintable() else repr(key)
