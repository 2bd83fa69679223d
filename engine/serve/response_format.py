"""OpenAI's ``response_format`` checked and made into the engine's ``ResponseFormat``.

``{"type": "text"}`` (or nothing) is free text; ``{"type": "json_object"}`` any JSON
object; ``{"type": "json_schema", "json_schema": {"name", "schema", "strict", ...}}`` a
reply valid against the schema. The reply is constrained whether ``strict`` is true or
not: a schema the client sent is one it wants kept. Whether the engine can enforce the
schema is ``Grammars.compile``'s to say (a 400 naming the construct).
"""

from __future__ import annotations

from typing import Any

from engine.sampling_params import ResponseFormat
from engine.tools.request import InvalidField

_TYPES = ("text", "json_object", "json_schema")
_SCHEMA_KEYS = {"name", "description", "schema", "strict"}


def response_format(value: Any) -> ResponseFormat | None:
    if value is None:
        return None
    _require(isinstance(value, dict), "response_format", "must be an object with a type")
    kind = value.get("type")
    _require(kind in _TYPES, "response_format.type", f"must be one of {', '.join(_TYPES)}, "
             f"got {kind!r}")
    allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    for key in value:
        _require(key in allowed, f"response_format.{key}", "not a field of a "
                 f"{kind!r} response format; remove it")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    spec = value.get("json_schema")
    _require(isinstance(spec, dict), "response_format.json_schema", "must be an object with "
             "the schema's name and schema")
    for key in spec:
        _require(key in _SCHEMA_KEYS, f"response_format.json_schema.{key}", "not a field "
                 "Folio knows here; remove it")
    name = spec.get("name")
    _require(isinstance(name, str) and bool(name), "response_format.json_schema.name",
             "the schema needs a name")
    schema = spec.get("schema", {})
    _require(isinstance(schema, dict), "response_format.json_schema.schema",
             "must be a JSON schema object")
    _require(spec.get("strict") in (None, True, False), "response_format.json_schema.strict",
             "must be true or false")
    return ResponseFormat("json_schema", schema, name)


def _require(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise InvalidField(where, f"{where}: {message}")
