"""A chat's "Answer in JSON": its optional schema checked, and what the engine is sent.

A chat keeps ``json_mode`` and ``json_schema`` (the schema's text, "" for any JSON
object) in its ``ChatSettings``. The engine constrains the reply (structured output,
``engine/grammar``); a remote server gets OpenAI's ``response_format``. Each reply made
so records it in its metrics (``METRIC``), and its footer says so.
"""

from __future__ import annotations

import json
from typing import Any

from desktop_app.data.metric_values import label

METRIC = "response_format"  # a reply's metrics key: "json_object" or "json_schema"


def parse_schema(text: str) -> dict | None:
    """The schema in ``text`` (None when blank); ValueError naming json_schema when it is
    not a JSON object or holds a construct the engine cannot enforce."""
    if not text.strip():
        return None
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"ChatSettings.json_schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError("ChatSettings.json_schema must be a JSON object (a JSON schema), "
                         f"got {type(schema).__name__}")
    from engine.grammar.schema_check import check_schema  # noqa: PLC0415 - engine on demand

    try:
        check_schema(schema)
    except ValueError as exc:
        raise ValueError(f"ChatSettings.json_schema: {exc}") from None
    return schema


def response_format(json_mode: bool, schema_text: str):
    """The engine's ResponseFormat for a chat's settings, or None for free text."""
    if not json_mode:
        return None
    from engine.sampling_params import ResponseFormat  # noqa: PLC0415

    schema = parse_schema(schema_text)
    if schema is None:
        return ResponseFormat("json_object")
    return ResponseFormat("json_schema", schema, str(schema.get("title") or "chat_schema"))


def openai_response_format(fmt) -> dict[str, Any]:
    """OpenAI's ``response_format`` for a ResponseFormat (what a remote server is sent)."""
    if fmt.type == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": fmt.name or "chat_schema",
                                                   "schema": fmt.schema, "strict": True}}


def reply_label(metrics: dict | None) -> str:
    """What a reply's footer says of its format: "" for free text."""
    kind = label(metrics, METRIC)  # a stored row may hold anything, a list too
    return {"json_object": "JSON", "json_schema": "JSON (schema)"}.get(kind or "", "")
