"""How large a JSON schema for structured output may be, checked before anything recurses.

xgrammar's compile cannot be interrupted and its time grows faster than the schema does,
so a schema is measured first, by one walk with its own stack (no recursion: a schema
nested 100,000 deep is a GrammarError naming its depth, never a RecursionError, and
``json.dumps`` of one that passed cannot recurse too deep either). Each limit is a
GrammarError naming what was too large. ``COMPILE_TIMEOUT_S`` backs them up for the costs
they do not measure, such as a pattern's repetition counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.grammar.errors import GrammarError

# Why these numbers: measured on a 2-core Xeon with the starter's 49k vocabulary (a
# synthetic 152k one compiled alike), where a realistic 20-field schema compiles in about
# 10 ms. The costliest schema found within all four limits, one object of 999 optional
# properties with 50-character names, compiles in about 4 s, with four chats decoding
# beside it too: well inside COMPILE_TIMEOUT_S on a busier machine.
# - Levels of objects and arrays inside one another (a property's schema is two levels
#   below its object's). Real schemas nest a dozen or two; compile time grows faster than
#   the depth (200 levels of arrays took 0.9 s), and the grammar checks recurse per level.
MAX_DEPTH = 100
# - Sub-schemas: the root, each property, item, anyOf branch and $defs entry. Optional
#   properties of one object cost about the cube of their count (1,200 took 5 s, 3,000
#   94 s); required ones and nested objects far less.
MAX_SUBSCHEMAS = 1_000
# - Enum values across the schema. Their cost follows their text (the next limit), so this
#   only stops a list of tiny or repeated values; 10,000 short ones compile in 0.1 s.
MAX_ENUM_VALUES = 10_000
# - Characters of the text the grammar spells out: enum and const values, property names,
#   patterns. An alternation of 100,000 characters of enum values costs 20 times one of
#   90,000 (0.2 s to 4 s, 14 s at 200,000), and one string of 1,000,000 took 339 s; at
#   50,000 every shape measured stays under 1 s.
MAX_LITERAL_CHARS = 50_000
# A compile past this is answered "took too long"; it runs on in the background (xgrammar
# cannot stop it) and its grammar is cached when it ends.
COMPILE_TIMEOUT_S = 10.0
# While this many compiles run past the time limit, a new schema is refused at once
# (GrammarBusy) instead of starting one more: only schemas built to be slow get there.
MAX_OVERDUE_COMPILES = 2

# What a value in the walk is, which decides how its children are read.
_SCHEMA, _NAMED_SCHEMAS, _SCHEMAS_BY_NAME, _SCHEMA_LIST, _LITERAL, _OTHER = range(6)
_CHILD_KIND = {
    "properties": _NAMED_SCHEMAS, "patternProperties": _NAMED_SCHEMAS,
    "$defs": _SCHEMAS_BY_NAME, "definitions": _SCHEMAS_BY_NAME,
    "anyOf": _SCHEMA_LIST, "prefixItems": _SCHEMA_LIST,
    "items": _SCHEMA, "additionalProperties": _SCHEMA,
    "enum": _LITERAL, "const": _LITERAL,
}
_PATH_SHOWN = 120  # characters of a path a message shows, its start and its end

Trail = tuple[str, "Trail"] | None  # a value's key, then its parent's trail


@dataclass(slots=True)
class _Tally:
    subschemas: int = 0
    enum_values: int = 0
    literal_chars: int = 0

    def subschema(self, trail: Trail) -> None:
        self.subschemas += 1
        if self.subschemas > MAX_SUBSCHEMAS:
            raise GrammarError("sub-schemas", f"the schema has more than {MAX_SUBSCHEMAS} "
                               "sub-schemas (each property, item, anyOf branch and $defs "
                               f"entry is one; the limit is passed at {_path(trail)})")

    def enum(self, count: int, trail: Trail) -> None:
        self.enum_values += count
        if self.enum_values > MAX_ENUM_VALUES:
            raise GrammarError("enum", f"the schema's enums hold {self.enum_values} values "
                               f"by {_path(trail)}; at most {MAX_ENUM_VALUES} are allowed "
                               "in all")

    def text(self, count: int, trail: Trail) -> None:
        self.literal_chars += count
        if self.literal_chars > MAX_LITERAL_CHARS:
            raise GrammarError("literals", "the schema's enum and const values, property "
                               f"names and patterns hold more than {MAX_LITERAL_CHARS} "
                               f"characters in all (the limit is passed at {_path(trail)})")


def check_limits(schema: Any) -> None:
    """Raise GrammarError for the first limit ``schema`` goes past."""
    tally = _Tally()
    stack: list[tuple[Any, int, int, Trail]] = [(schema, 1, _SCHEMA, None)]
    while stack:
        value, depth, kind, trail = stack.pop()
        if kind == _SCHEMA and isinstance(value, dict | bool):
            tally.subschema(trail)
        if not isinstance(value, dict | list):
            if kind == _LITERAL:
                tally.text(len(value) if isinstance(value, str) else len(str(value)), trail)
            continue
        if depth > MAX_DEPTH:
            raise GrammarError("depth", f"the schema is nested more than {MAX_DEPTH} levels "
                               f"deep (objects and arrays inside one another; at "
                               f"{_path(trail)})")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            at = (str(key), trail)
            stack.append((child, depth + 1, _kind_of(kind, value, key, child, tally, at), at))


def _kind_of(kind: int, parent: dict | list, key, child: Any, tally: _Tally,
             at: Trail) -> int:
    """What ``child`` (``parent[key]``) is, counting what it adds to the tally."""
    if kind == _SCHEMA and isinstance(parent, dict):
        if key == "pattern" and isinstance(child, str):
            tally.text(len(child), at)
        elif key == "enum" and isinstance(child, list):
            tally.enum(len(child), at)
        return _CHILD_KIND.get(key, _OTHER)
    if kind == _NAMED_SCHEMAS and isinstance(parent, dict):
        tally.text(len(key), at)  # a property's name, which the reply spells out
        return _SCHEMA
    if kind == _SCHEMAS_BY_NAME and isinstance(parent, dict):
        return _SCHEMA
    if kind == _SCHEMA_LIST and isinstance(parent, list):
        return _SCHEMA
    if kind == _LITERAL:
        if isinstance(parent, dict):
            tally.text(len(key), at)
        return _LITERAL
    return _OTHER


def _path(trail: Trail) -> str:
    keys: list[str] = []
    while trail is not None:
        key, trail = trail
        keys.append(key)
    path = "/".join(["#", *reversed(keys)])
    if len(path) > _PATH_SHOWN:
        half = _PATH_SHOWN // 2
        path = f"{path[:half]}…{path[-half:]}"
    return path
