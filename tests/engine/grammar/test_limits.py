"""check_limits: a schema past a limit is a GrammarError naming what was too large, found
without recursing, and a schema at every limit passes."""

from __future__ import annotations

import pytest

from engine import ResponseFormat
from engine.grammar import GrammarError, Grammars, check_schema
from engine.grammar.limits import (
    MAX_DEPTH,
    MAX_ENUM_VALUES,
    MAX_LITERAL_CHARS,
    MAX_SUBSCHEMAS,
    check_limits,
)
from tests.engine.tiny_models import byte_level_tokenizer


def items_nested(levels: int) -> dict:
    """An array of arrays ``levels`` deep: ``levels + 1`` JSON levels."""
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def list_nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def refused(schema) -> GrammarError:
    with pytest.raises(GrammarError) as info:
        check_limits(schema)
    return info.value


@pytest.mark.parametrize("levels", [900, 100_000])
def test_a_deep_schema_is_refused_naming_its_depth_not_a_recursion_error(levels) -> None:
    error = refused(items_nested(levels))
    assert error.construct == "depth"
    assert f"nested more than {MAX_DEPTH} levels deep" in str(error)
    assert "#/items/items/" in str(error)


def test_a_deep_enum_value_counts_toward_the_depth() -> None:
    error = refused({"enum": [list_nested(100_000)]})
    assert error.construct == "depth" and "at #/enum/0/0/" in str(error)


def test_an_annotation_nested_deep_counts_too() -> None:
    # json.dumps of the cache key reads annotations as well.
    assert refused({"type": "string", "default": list_nested(5000)}).construct == "depth"


def test_the_deepest_schema_allowed_passes() -> None:
    check_limits(items_nested(MAX_DEPTH - 1))
    assert refused(items_nested(MAX_DEPTH)).construct == "depth"


def test_sub_schemas_are_counted_across_the_schema() -> None:
    half = MAX_SUBSCHEMAS // 2
    schema = {"type": "object",
              "properties": {f"p{i}": {"type": "integer"} for i in range(half)},
              "$defs": {f"d{i}": True for i in range(half - 1)}}
    check_limits(schema)  # the root, half properties, half - 1 definitions
    schema["$defs"]["one_more"] = {"anyOf": [{"type": "null"}]}
    error = refused(schema)
    assert error.construct == "sub-schemas"
    assert f"more than {MAX_SUBSCHEMAS} sub-schemas" in str(error)


def test_enum_values_are_counted_across_the_schema() -> None:
    half = MAX_ENUM_VALUES // 2
    schema = {"type": "object", "properties": {
        "a": {"enum": list(range(half))},
        "b": {"anyOf": [{"enum": list(range(half))}]}}}
    check_limits(schema)
    schema["properties"]["c"] = {"enum": [None]}
    error = refused(schema)
    assert error.construct == "enum"
    assert f"hold {MAX_ENUM_VALUES + 1} values" in str(error)
    assert f"at most {MAX_ENUM_VALUES} are allowed" in str(error)


@pytest.mark.parametrize("schema", [
    {"const": "x" * (MAX_LITERAL_CHARS + 1)},
    {"enum": ["x" * (MAX_LITERAL_CHARS // 2), "y" * (MAX_LITERAL_CHARS // 2 + 1)]},
    {"enum": [{"k" * MAX_LITERAL_CHARS: 1}]},
    {"type": "object", "properties": {"n" * (MAX_LITERAL_CHARS + 1): True}},
    {"type": "string", "pattern": "p" * (MAX_LITERAL_CHARS + 1)},
    {"type": "object", "properties": {"a": {"const": "x" * MAX_LITERAL_CHARS},
                                      "b": {"type": "string", "pattern": "y"}}},
])
def test_literal_text_is_counted_across_the_schema(schema) -> None:
    error = refused(schema)
    assert error.construct == "literals"
    assert f"hold more than {MAX_LITERAL_CHARS} characters in all" in str(error)


def test_text_the_grammar_does_not_spell_out_is_not_counted() -> None:
    long = "d" * (2 * MAX_LITERAL_CHARS)
    check_limits({"type": "object", "description": long, "title": long,
                  "properties": {"a": {"type": "string", "default": long}}})


def test_a_long_path_is_shortened_in_the_message() -> None:
    message = str(refused({"properties": {"p" * 5000: items_nested(MAX_DEPTH)}}))
    assert "…" in message and len(message) < 400


def test_check_schema_and_compile_check_the_limits_first() -> None:
    with pytest.raises(GrammarError) as info:
        check_schema(items_nested(100_000))
    assert info.value.construct == "depth"
    tokenizer = byte_level_tokenizer()
    grammars = Grammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    for schema in (items_nested(100_000), {"enum": [list_nested(100_000)]}):
        with pytest.raises(GrammarError) as info:
            grammars.compile(ResponseFormat("json_schema", schema))
        assert info.value.construct == "depth"
