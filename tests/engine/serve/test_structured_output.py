"""Structured output through ``folio serve`` on the starter, with the official openai
client: replies valid against 20 generated schemas (jsonschema checks them), n=3
candidates each valid, json_object replies that parse, streamed replies too, a reply cut
by max_tokens that says length, and 400s that name what cannot be enforced."""

from __future__ import annotations

import asyncio
import json
import random

import jsonschema
import openai
import pytest

from tests.engine.serve.conftest import Served

ASK = [{"role": "user", "content": "Describe a made-up person as JSON."}]


@pytest.fixture(scope="module")
def served(starter_llm):
    server = Served(starter_llm)
    yield server
    server.stop()


def _leaf(rnd: random.Random) -> dict:
    # Every leaf is bounded, so a reply ends within max_tokens whatever the model writes.
    return rnd.choice([
        {"type": "string", "maxLength": rnd.randint(3, 12)},
        {"type": "integer", "minimum": 0, "maximum": rnd.choice([9, 120, 5000])},
        {"type": "boolean"},
        {"enum": rnd.sample(["red", "green", "blue", "black", "white"], 3)},
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
         "maxItems": 3},
        {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
    ])


def generated_schema(seed: int) -> dict:
    """Objects with a few fields of each kind, some nested, some optional; every third an
    array of such objects."""
    rnd = random.Random(seed)
    names = rnd.sample(["name", "age", "city", "color", "tags", "alive", "score", "pet",
                        "code", "team"], rnd.randint(2, 4))
    properties = {n: _leaf(rnd) for n in names}
    if seed % 2:
        properties["address"] = {"type": "object", "properties": {
            "street": {"type": "string", "maxLength": 10}, "number": _leaf(rnd)},
            "required": ["street", "number"]}
    required = sorted(rnd.sample(sorted(properties), max(1, len(properties) - 1)))
    schema = {"type": "object", "properties": properties, "required": required}
    if seed % 3 == 0:
        return {"type": "array", "items": schema, "minItems": 1, "maxItems": 2}
    return schema


def json_schema(schema: dict, name: str = "answer") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                   "strict": True}}


def test_replies_validate_against_20_generated_schemas(served) -> None:
    schemas = [generated_schema(seed) for seed in range(20)]
    client = served.async_client()

    async def ask_all():
        return await asyncio.gather(*(client.chat.completions.create(
            model=served.model, messages=ASK, temperature=0, max_tokens=400,
            response_format=json_schema(s)) for s in schemas))

    replies = asyncio.run(ask_all())
    for schema, reply in zip(schemas, replies, strict=True):
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_each_of_three_candidates_is_valid(served) -> None:
    schema = generated_schema(4)
    reply = served.client().chat.completions.create(
        model=served.model, messages=ASK, n=3, temperature=1.0, seed=11, max_tokens=400,
        response_format=json_schema(schema))
    assert len(reply.choices) == 3
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)
    assert len({c.message.content for c in reply.choices}) > 1


def test_json_object_replies_parse_streamed_or_not(served) -> None:
    client = served.client()
    cat = [{"role": "user", "content": "Give me a JSON object about a cat."}]
    fields = {"model": served.model, "messages": cat, "temperature": 0, "max_tokens": 200,
              "response_format": {"type": "json_object"}}
    reply = client.chat.completions.create(**fields)
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    chunks = list(client.chat.completions.create(stream=True, **fields))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content


def test_a_reply_cut_by_max_tokens_says_length(served) -> None:
    reply = served.client().chat.completions.create(
        model=served.model, messages=ASK, temperature=0, max_tokens=4,
        response_format=json_schema(generated_schema(1)))
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize(("response_format", "param", "words"), [
    (json_schema({"type": "object", "properties": {"a": {"type": "array",
                                                         "uniqueItems": True}}}),
     "response_format", ["uniqueItems", "#/properties/a/uniqueItems"]),
    (json_schema({"type": "string", "format": "hostname"}), "response_format", ["hostname"]),
    (json_schema({"type": "object", "minProperties": 2, "additionalProperties": False}),
     "response_format", ["minProperties"]),
    ({"type": "json_schema"}, "response_format.json_schema", ["name"]),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name",
     ["name"]),
    ({"type": "yaml"}, "response_format.type", ["json_object"]),
    ({"type": "json_object", "schema": {}}, "response_format.schema", ["remove"]),
])
def test_what_cannot_be_enforced_is_a_400_naming_it(served, response_format, param,
                                                     words) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        served.client().chat.completions.create(
            model=served.model, messages=ASK, max_tokens=4, response_format=response_format)
    error = info.value.body
    assert error["param"] == param
    for word in words:
        assert word in error["message"]
