"""check_schema: enforced keywords pass, annotations pass, the rest is refused by name."""

from __future__ import annotations

import pytest

from engine.grammar import GrammarError, check_schema


def test_enforced_keywords_and_annotations_pass() -> None:
    check_schema({
        "title": "Person", "type": "object", "description": "x",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 9, "pattern": "^[A-Z]"},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
            "when": {"type": "string", "format": "date"},
            "kind": {"anyOf": [{"const": 1}, {"type": "null"}]},
            "ref": {"$ref": "#/$defs/n"},
        },
        "$defs": {"n": {"type": ["integer", "null"], "minimum": 0}},
        "required": ["name"], "additionalProperties": False,
    })
    check_schema(True)


@pytest.mark.parametrize(("schema", "construct", "where"), [
    ({"not": {"type": "string"}}, "not", "#/not"),
    ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
     "uniqueItems", "#/properties/a/uniqueItems"),
    ({"type": "integer", "multipleOf": 3}, "multipleOf", "#/multipleOf"),
    ({"allOf": [{"type": "object"}]}, "allOf", "#/allOf"),
    ({"oneOf": [{"type": "object"}]}, "oneOf", "#/oneOf"),
    ({"if": {}, "then": {}}, "if", "#/if"),
    ({"$ref": "https://example.com/s.json"}, "$ref", "#/$ref"),
    ({"type": "string", "format": "hostname"}, "format", "#/format"),
    ({"type": "foo"}, "type", "#/type"),
    ({"type": "array", "items": {"contains": {}}}, "contains", "#/items/contains"),
    ({"anyOf": [{"propertyNames": {}}]}, "propertyNames", "#/anyOf/0/propertyNames"),
])
def test_constructs_the_grammar_would_not_enforce_are_refused_by_name(
        schema, construct, where) -> None:
    with pytest.raises(GrammarError) as info:
        check_schema(schema)
    assert info.value.construct == construct
    assert construct in str(info.value) and where in str(info.value)


def test_a_schema_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(GrammarError, match="must be an object"):
        check_schema({"properties": {"a": 3}})
