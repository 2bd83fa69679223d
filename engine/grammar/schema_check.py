"""The JSON-schema constructs a constrained reply is guaranteed to satisfy, and the rest.

xgrammar compiles many keywords it does not enforce (``not``, ``uniqueItems``,
``multipleOf``...): a reply masked by such a grammar could break the schema while the
client gets a 200. So each keyword is either enforced by the grammar, an annotation that
constrains nothing, or refused here with a ``GrammarError`` naming it and where it is.
"""

from __future__ import annotations

from typing import Any

from engine.grammar.errors import GrammarError
from engine.grammar.limits import check_limits

# Keywords the grammar enforces (checked by tests/engine/grammar against jsonschema).
ENFORCED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "enum", "const", "anyOf", "$ref", "$defs", "definitions", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "format",
    "minItems", "maxItems", "minProperties", "maxProperties", "patternProperties",
})
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly",
})
FORMATS = frozenset({"date", "time", "date-time", "email", "uuid", "ipv4", "ipv6"})
# Keywords whose value is a map of names to schemas, or a list of schemas.
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "prefixItems")
_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})


def check_schema(schema: Any) -> None:
    """Raise GrammarError for the first construct under ``schema`` not enforced, or for a
    schema past the limits (``limits.py``), which are checked first: they bound how deep
    the walk below recurses."""
    check_limits(schema)
    _check(schema, "#")


def _check(schema: Any, path: str) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise GrammarError("schema", f"the schema at {path} must be an object or a boolean, "
                           f"got {type(schema).__name__}")
    for key, value in schema.items():
        at = f"{path}/{key}"
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED:
            raise GrammarError(key, f"JSON-schema keyword {key!r} (at {at}) is not supported "
                               "in structured output: the reply could not be held to it")
        _check_keyword(key, value, at)


def _check_keyword(key: str, value: Any, at: str) -> None:
    if key == "type":
        kinds = value if isinstance(value, list) else [value]
        bad = [k for k in kinds if k not in _TYPES]
        if bad:
            raise GrammarError("type", f"type {bad[0]!r} (at {at}) is not a JSON-schema type")
    elif key == "format" and value not in FORMATS:
        raise GrammarError("format", f"string format {value!r} (at {at}) is not supported "
                           f"in structured output; supported: {', '.join(sorted(FORMATS))}")
    elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
        raise GrammarError("$ref", f"$ref {value!r} (at {at}) is not supported: only "
                           "references inside the schema (#/$defs/...) are")
    elif key in _SCHEMA_MAPS:
        if not isinstance(value, dict):
            raise GrammarError(key, f"{key} (at {at}) must map names to schemas")
        for name, sub in value.items():
            _check(sub, f"{at}/{name}")
    elif key in _SCHEMA_LISTS:
        if not isinstance(value, list):
            raise GrammarError(key, f"{key} (at {at}) must be a list of schemas")
        for i, sub in enumerate(value):
            _check(sub, f"{at}/{i}")
    elif key in ("items", "additionalProperties"):
        _check(value, at)
