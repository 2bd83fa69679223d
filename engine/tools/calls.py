"""The JSON of tool calls, as families write them: one object, or a list of objects, each
``{"name": ..., "arguments": {...}}`` (Llama 3 says ``"parameters"``).

Where the arguments sit in the text matters as much as what they are: a client gets them
as the model wrote them, cut where the model's text arrived, so ``parse_calls`` returns
each call's arguments as a span of the body rather than re-dumped JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")
ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(slots=True, frozen=True)
class RawCall:
    name: str
    # Where the arguments' JSON text lies in the body; None when the model wrote them as a
    # JSON string (``"arguments": "{...}"``) or left them out, and ``arguments`` holds it.
    span: tuple[int, int] | None
    arguments: str


def parse_calls(body: str) -> list[RawCall]:
    """The calls in ``body``; ValueError when it is not valid JSON or not calls."""
    json.loads(body)  # all of it valid JSON, nothing after it
    start = _skip(body, 0)
    if body[start] == "[":
        calls = [_call(body, at) for at in _elements(body, start)]
        if not calls:
            raise ValueError("an empty list of calls")
        return calls
    return [_call(body, start)]


def _skip(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()


def _elements(text: str, start: int) -> list[int]:
    """Where each element of the array at ``text[start]`` begins."""
    at, starts = _skip(text, start + 1), []
    while text[at] != "]":
        starts.append(at)
        _, at = _DECODER.raw_decode(text, at)
        at = _skip(text, at)
        if text[at] == ",":
            at = _skip(text, at + 1)
    return starts


def _members(text: str, start: int) -> dict[str, tuple[int, int]]:
    """Each member of the object at ``text[start]`` -> the span of its value."""
    if text[start] != "{":
        raise ValueError("a call must be a JSON object")
    at, spans = _skip(text, start + 1), {}
    while text[at] != "}":
        key, at = _DECODER.raw_decode(text, at)
        at = _skip(text, _skip(text, at) + 1)  # past the colon
        _, end = _DECODER.raw_decode(text, at)
        spans[key] = (at, end)
        at = _skip(text, end)
        if text[at] == ",":
            at = _skip(text, at + 1)
    return spans


def _call(text: str, start: int) -> RawCall:
    spans = _members(text, start)
    if "name" not in spans:
        raise ValueError("a call needs a name")
    name = json.loads(text[slice(*spans["name"])])
    if not isinstance(name, str) or not name:
        raise ValueError("a call's name must be a non-empty string")
    key = next((k for k in ARGUMENT_KEYS if k in spans), None)
    if key is None:
        return RawCall(name, None, "{}")
    raw = text[slice(*spans[key])]
    value = json.loads(raw)
    if isinstance(value, str):  # arguments written as JSON inside a string
        raw, value = value, json.loads(value)
        if not isinstance(value, dict):
            raise ValueError("a call's arguments must be a JSON object")
        return RawCall(name, None, raw)
    if not isinstance(value, dict):
        raise ValueError("a call's arguments must be a JSON object")
    return RawCall(name, spans[key], raw)
