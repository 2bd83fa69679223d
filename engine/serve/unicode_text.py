"""Text in a request body that is not Unicode: JSON lets a string hold a lone UTF-16
surrogate (``"\\ud800"``), which Python keeps as is, and the tokenizer (Rust) and the
template cannot take it. The whole body is walked once, as it is parsed, so every field
that can reach them (messages, prompt, stop, tools and their schemas, and fields that
never do) is refused the same way, with its place named.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticCustomError

ERROR_TYPE = "lone_surrogate"  # errors.py answers it with a 400 naming ``ctx.field``


def lone_surrogate(body: Any) -> tuple[str, str] | None:
    """The first (field, problem) of a parsed JSON body holding a lone surrogate, in
    document order; None when all its text is Unicode. Iterative: a body nested as deep
    as the JSON parser allows must not exhaust the stack here."""
    stack: list[tuple[tuple, Any]] = [((), body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            problem = _problem(value)
            if problem:
                return _dotted(path), problem
        elif isinstance(value, dict):
            items = list(value.items())
            for key, child in reversed(items):
                stack.append(((*path, key), child))
            for key, _ in items:  # a key is text too (logit_bias, schema properties)
                problem = _problem(key) if isinstance(key, str) else ""
                if problem:
                    return _dotted(path), f"a key {problem}"
        elif isinstance(value, list):
            stack.extend(((*path, i), child) for i, child in reversed(list(enumerate(value))))
    return None


def check_body(body: Any) -> None:
    """Raise the validation error errors.py turns into a 400 naming the field."""
    found = lone_surrogate(body)
    if found is not None:
        field, problem = found
        raise PydanticCustomError(ERROR_TYPE, "{field}: {problem}",
                                  {"field": field or "body", "problem": problem})


def _problem(text: str) -> str:
    if text.isascii():
        return ""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"holds a lone UTF-16 surrogate (\\u{ord(text[exc.start]):04x}) at "
                f"character {exc.start}: text must be valid Unicode (send the pair, or the "
                "character itself)")
    return ""


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)
