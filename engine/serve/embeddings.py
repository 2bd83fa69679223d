"""``POST /v1/embeddings`` in OpenAI's shape, answered by the embedding model that
``folio serve --embedding-model PATH`` loaded (engine/embeddings).

``input``: a string, a list of strings, a list of token ids or a list of such lists (at
most ``MAX_INPUTS``), each cut to the model's max length (``usage.prompt_tokens`` counts
what was read); the texts are embedded as they come (a model's query instruction, such as
Qwen3-Embedding's, is the client's to put in). ``encoding_format``: ``float`` or
``base64`` (little-endian float32, as OpenAI's). ``dimensions``: Matryoshka truncation
for a model trained for it, renormalized; a 400 naming the field otherwise. No model
loaded: a 404. Every bad value: a 400 naming its field.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, model_validator

from engine.embeddings import Embedder
from engine.serve import unicode_text
from engine.serve.errors import APIError

MAX_INPUTS = 2048  # OpenAI's limit on one request's inputs


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: Any = None
    model: Any = None
    encoding_format: Any = "float"
    dimensions: Any = None
    user: Any = None  # OpenAI's end-user id: accepted, not used

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        # A lone surrogate would reach the tokenizer, which cannot take it: a 400 naming
        # the element, as for chat requests.
        unicode_text.check_body(data)
        return data


def add_embeddings(app: FastAPI, embedder: Embedder | None, check_key, path: str | None
                   ) -> None:
    """The route; ``path``: what ``--embedding-model`` said, a name the model answers to
    beside its own."""

    @app.post("/v1/embeddings", dependencies=[Depends(check_key)])
    async def embeddings(body: EmbeddingRequest) -> dict:
        if embedder is None:
            raise APIError(404, "no embedding model is loaded; start folio serve with "
                           "--embedding-model PATH (a folder or .gguf file)",
                           "model_not_found", "model")
        names = {embedder.name, path}
        if not isinstance(body.model, str) or body.model not in names:
            raise APIError(404, f"model: {body.model!r} is not the embedding model served "
                           f"here; use {embedder.name!r}", "model_not_found", "model")
        if body.encoding_format not in ("float", "base64"):
            raise _bad("encoding_format", "must be 'float' or 'base64'")
        dims = _dimensions(body.dimensions, embedder)
        texts, ids = _inputs(body.input, embedder.vocab_size)
        try:
            if texts is not None:
                done = await asyncio.to_thread(embedder.embed, texts, None, dims)
            else:
                done = await asyncio.to_thread(embedder.embed_ids, ids, dims)
        except ValueError as exc:
            raise _bad("input", str(exc).removeprefix("input: ")) from exc
        vectors = done.vectors.numpy().astype("<f4")
        return {"object": "list", "model": embedder.name,
                "data": [{"object": "embedding", "index": i,
                          "embedding": _encoded(row, body.encoding_format)}
                         for i, row in enumerate(vectors)],
                "usage": {"prompt_tokens": done.tokens, "total_tokens": done.tokens}}


def _bad(field: str, why: str) -> APIError:
    return APIError(400, f"{field}: {why}", "invalid_value", field)


def _dimensions(value, embedder: Embedder) -> int | None:
    if value is None:
        return None
    if not embedder.matryoshka:
        raise _bad("dimensions", f"{embedder.name} was not trained for shortened vectors "
                   "(Matryoshka); leave it out")
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 1 <= value <= embedder.dimensions:
        raise _bad("dimensions", f"must be an integer in [1, {embedder.dimensions}], got "
                   f"{value!r}")
    return value


def _inputs(value, vocab: int) -> tuple[list[str] | None, list[list[int]] | None]:
    """The texts, or the token id lists; a 400 naming the bad element."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise _bad("input", "must be a string, a list of strings, a list of token ids "
                   "or a list of such lists, and not empty")
    if len(value) > MAX_INPUTS:
        raise _bad("input", f"at most {MAX_INPUTS} inputs in one request, got {len(value)}")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = [value]
    if isinstance(value[0], str):  # the first input's kind is every input's
        for i, text in enumerate(value):
            if not isinstance(text, str):
                raise _bad(f"input[{i}]", "must be a string, as input[0] is")
            if not text:
                raise _bad(f"input[{i}]", "an empty string has no embedding")
        return value, None
    for i, ids in enumerate(value):
        if not isinstance(ids, list) or not ids:
            raise _bad(f"input[{i}]", "must be a non-empty list of token ids, as input[0] "
                       "is (or every input a string)")
        for j, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, int) or \
                    not 0 <= token < vocab:
                raise _bad(f"input[{i}][{j}]", f"a token id must be an integer in [0, "
                           f"{vocab}), got {token!r}")
    return None, value


def _encoded(row: np.ndarray, encoding: str):
    if encoding == "base64":
        return base64.b64encode(row.tobytes()).decode("ascii")
    return row.tolist()
