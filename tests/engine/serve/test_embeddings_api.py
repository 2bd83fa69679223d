"""``/v1/embeddings`` through the official client and raw HTTP: vectors equal to
transformers' pooling of the same tiny models (a BertModel folder, a Qwen3 saved as
Qwen3-Embedding is), float and base64, Matryoshka ``dimensions``, token-id inputs,
``usage``; every bad value a 400 naming its field; no embedding model loaded, a 404."""

from __future__ import annotations

import base64
import json

import httpx2 as httpx
import numpy as np
import openai
import pytest
import torch
from transformers import AutoTokenizer

from engine.serve.app import ServeSettings
from tests.engine.embeddings.tiny_embedders import (
    hf_bert_vectors,
    hf_qwen3_vectors,
    save_tiny_bert,
    save_tiny_qwen3_embedder,
)
from tests.engine.serve.conftest import Served, tiny_llm_at

TEXTS = ["the pump runs at litres per hour in winter", "who renews forklift licences?",
         "ferry"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedders")
    return save_tiny_bert(root / "tiny-bge", pooling="cls"), \
        save_tiny_qwen3_embedder(root / "tiny-qwen3-embedding")


@pytest.fixture(scope="module")
def llm(tiny_path):
    return tiny_llm_at(tiny_path)


def served(llm, path) -> Served:
    return Served(llm, ServeSettings(embedding_model=None if path is None else str(path)))


def test_bert_embeddings_equal_transformers_pooling(llm, folders):
    bert, _ = folders
    server = served(llm, bert)
    try:
        client = server.client()
        got = client.embeddings.create(model="tiny-bge", input=TEXTS)
        assert [d.index for d in got.data] == [0, 1, 2] and got.model == "tiny-bge"
        vectors = torch.tensor([d.embedding for d in got.data])
        torch.testing.assert_close(vectors, hf_bert_vectors(bert, TEXTS, "cls"),
                                   atol=1e-4, rtol=0)
        # The client asks for base64 by default and decodes it; raw, base64 holds the very
        # float32 values the float format writes. One input both ways: a batch of three
        # may round differently from a batch of one (the CPU's matmul blocking).
        def raw_vector(encoding_format):
            return httpx.post(server.url + "/v1/embeddings", json={
                "model": "tiny-bge", "input": TEXTS[0],
                "encoding_format": encoding_format}).json()
        raw = raw_vector("base64")
        decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
        as_floats = np.array(raw_vector("float")["data"][0]["embedding"], dtype="<f4")
        np.testing.assert_array_equal(decoded, as_floats)
        np.testing.assert_allclose(decoded, vectors[0].numpy(), atol=1e-6, rtol=0)
        ids = load_tokens(bert, TEXTS)
        assert raw["usage"] == {"prompt_tokens": len(ids[0]), "total_tokens": len(ids[0])}
        by_ids = client.embeddings.create(model="tiny-bge", input=ids)
        torch.testing.assert_close(torch.tensor([d.embedding for d in by_ids.data]),
                                   vectors, atol=1e-6, rtol=0)
        assert by_ids.usage.prompt_tokens == sum(map(len, ids))
        # bge-like models were not trained for shortened vectors: dimensions is refused.
        with pytest.raises(openai.BadRequestError, match="dimensions"):
            client.embeddings.create(model="tiny-bge", input="x", dimensions=8)
    finally:
        server.stop()


def load_tokens(folder, texts):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(folder)(texts)["input_ids"]


def test_qwen3_embeddings_with_dimensions(llm, folders):
    _, qwen = folders
    server = served(llm, qwen)
    try:
        client = server.client()
        got = client.embeddings.create(model="tiny-qwen3-embedding", input=TEXTS)
        ids = AutoTokenizer.from_pretrained(qwen)(TEXTS)["input_ids"]
        full = hf_qwen3_vectors(qwen, ids)
        torch.testing.assert_close(torch.tensor([d.embedding for d in got.data]), full,
                                   atol=1e-4, rtol=0)
        assert got.usage.prompt_tokens == sum(map(len, ids))
        cut = client.embeddings.create(model=str(qwen), input=TEXTS, dimensions=16)
        torch.testing.assert_close(torch.tensor([d.embedding for d in cut.data]),
                                   torch.nn.functional.normalize(full[:, :16], dim=-1),
                                   atol=1e-4, rtol=0)
    finally:
        server.stop()


@pytest.mark.parametrize(("body", "field"), [
    ({"input": ""}, "input[0]"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": ["a", 3]}, "input[1]"),
    ({"input": [[1, 2], [99999]]}, "input[1][0]"),
    ({"input": [[1, -1]]}, "input[0][1]"),
    ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "dimensions": 65}, "dimensions"),
    ({"input": "a", "dimensions": "8"}, "dimensions"),
    ({"input": "a", "truncate": True}, "truncate"),
    ({"input": ["ok", "\ud800 lone"]}, "input.1"),
])
def test_bad_values_are_400s_naming_their_field(llm, folders, body, field):
    server = served(llm, folders[1])
    try:
        # json.dumps escapes a lone surrogate as JSON allows ("\ud800"); httpx's json=
        # would refuse to encode it.
        got = httpx.post(server.url + "/v1/embeddings",
                         content=json.dumps({"model": "tiny-qwen3-embedding", **body}),
                         headers={"Content-Type": "application/json"})
        assert got.status_code == 400, got.text
        error = got.json()["error"]
        assert error["param"] == field and error["type"] == "invalid_request_error"
        assert error["message"].startswith(field) or field == "truncate"
    finally:
        server.stop()


def test_without_an_embedding_model_or_under_another_name_a_404(llm, folders):
    server = served(llm, None)
    try:
        with pytest.raises(openai.NotFoundError, match="--embedding-model"):
            server.client().embeddings.create(model="x", input="hello")
    finally:
        server.stop()
    server = served(llm, folders[0])
    try:
        got = httpx.post(server.url + "/v1/embeddings", json={"model": "text-embedding-3",
                                                               "input": "hello"})
        assert got.status_code == 404 and got.json()["error"]["param"] == "model"
        assert "tiny-bge" in got.json()["error"]["message"]
    finally:
        server.stop()


def test_a_bad_embedding_model_path_is_refused_by_setting(tmp_path):
    with pytest.raises(ValueError, match="embedding_model: .*no such file"):
        ServeSettings(embedding_model=str(tmp_path / "nope")).embedder()


def test_folio_serve_refuses_a_bad_embedding_model_before_loading(tmp_path, capsys):
    from engine.cli import main

    # The chat model's path is bad too: the embedding model is checked first.
    assert main(["serve", "--port", "0", "--model", "/no/such/model",
                 "--embedding-model", str(tmp_path / "nope")]) == 2
    assert "embedding_model:" in capsys.readouterr().err
