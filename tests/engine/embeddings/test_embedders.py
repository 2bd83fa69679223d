"""Folio's own embedders against transformers' pooling of the same tiny random weights:
a BertModel folder (CLS, mean and last-token pooling as its sentence-transformers files
say), the same weights as a GGUF file, and a Qwen3 saved as Qwen3-Embedding is, run on
Folio's decoder code with last-token pooling; batching, truncation, Matryoshka."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.embeddings import DOCUMENT, QUERY, load_embedder
from engine.embeddings.load import QWEN3_QUERY, identity
from tests.engine.embeddings.tiny_embedders import (
    hf_bert_vectors,
    hf_qwen3_vectors,
    save_tiny_bert,
    save_tiny_nomic,
    save_tiny_qwen3_embedder,
    write_bert_gguf,
    write_qwen3_gguf,
)

TEXTS = ["the pump runs at litres per hour in winter",
         "who renews forklift licences?",
         "Where is the fire assembly point? The car park beside the garden.",
         "ferry",
         "manual page " * 40]  # past the folder's max_seq_length (48): truncated
ATOL = 1e-4


@pytest.mark.parametrize("pooling", ["cls", "mean", "lasttoken"])
def test_a_bert_folder_equals_transformers_pooling(tmp_path, pooling):
    folder = save_tiny_bert(tmp_path / f"bert-{pooling}", pooling=pooling)
    embedder = load_embedder(folder)
    assert embedder.pooling == {"lasttoken": "last"}.get(pooling, pooling)
    assert embedder.max_length == 48 and embedder.dimensions == 32
    got = embedder.embed(TEXTS).vectors
    torch.testing.assert_close(got, hf_bert_vectors(folder, TEXTS, pooling),
                               atol=ATOL, rtol=0)
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(TEXTS)))
    # One text alone gives the vector it gets in a padded batch.
    torch.testing.assert_close(embedder.embed(TEXTS[1:2]).vectors[0], got[1],
                               atol=ATOL, rtol=0)


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                    reason="sentence-transformers is not installed (not a dependency)")
def test_a_bert_folder_equals_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = save_tiny_bert(tmp_path / "bert", pooling="mean")
    ours = load_embedder(folder).embed(TEXTS).vectors
    theirs = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(TEXTS))
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_an_unnormalized_folder_is_left_unnormalized(tmp_path):
    folder = save_tiny_bert(tmp_path / "raw", pooling="cls", normalize=False)
    vectors = load_embedder(folder).embed(TEXTS[:2]).vectors
    assert not torch.allclose(vectors.norm(dim=-1), torch.ones(2), atol=1e-3)


@pytest.mark.parametrize("f16", [(), ("blk.0.ffn_up", "token_embd")])
def test_a_bert_gguf_loads_and_equals_the_folder(tmp_path, f16):
    folder = save_tiny_bert(tmp_path / "bert", pooling="mean")
    path = write_bert_gguf(folder, tmp_path / "bert.gguf", pooling_type=1, f16=f16)
    gguf, hf = load_embedder(path), load_embedder(folder)
    assert gguf.kind == "bert" and gguf.pooling == "mean"
    assert gguf.tokenize(TEXTS[:4]) == hf.tokenize(TEXTS[:4])
    # The GGUF's own context (64 positions) bounds its texts, not the folder's 48.
    short = TEXTS[:4]
    atol = ATOL if not f16 else 2e-3  # float16 weights round
    torch.testing.assert_close(gguf.embed(short).vectors, hf.embed(short).vectors,
                               atol=atol, rtol=0)
    assert gguf.identity != hf.identity


def test_a_gguf_of_cls_pooling_pools_the_first_token(tmp_path):
    folder = save_tiny_bert(tmp_path / "bert", pooling="cls")
    path = write_bert_gguf(folder, tmp_path / "cls.gguf", pooling_type=2)
    got = load_embedder(path).embed(TEXTS[:3]).vectors
    torch.testing.assert_close(got, hf_bert_vectors(folder, TEXTS[:3], "cls"),
                               atol=ATOL, rtol=0)


def test_a_qwen3_embedder_runs_on_folios_decoder_with_last_token_pooling(tmp_path):
    folder = save_tiny_qwen3_embedder(tmp_path / "qwen3-embedding")
    embedder = load_embedder(folder)
    assert embedder.kind == "decoder" and embedder.pooling == "last"
    assert embedder.prompts[QUERY] == QWEN3_QUERY and embedder.matryoshka
    texts = TEXTS + ["a longer passage " * 30]  # several blocks of the scratch pool
    ids = embedder.tokenize(texts)
    got = embedder.embed(texts).vectors
    torch.testing.assert_close(got, hf_qwen3_vectors(folder, ids), atol=ATOL, rtol=0)
    # A query carries the model card's instruction; a document nothing.
    query = embedder.tokenize(["fire point"], QUERY)[0]
    assert query == embedder.tokenize([QWEN3_QUERY + "fire point"])[0]
    assert embedder.tokenize(["fire point"], DOCUMENT) == embedder.tokenize(["fire point"])
    torch.testing.assert_close(embedder.embed(["fire point"], QUERY).vectors,
                               hf_qwen3_vectors(folder, [query]), atol=ATOL, rtol=0)


def test_matryoshka_truncation_renormalizes(tmp_path):
    embedder = load_embedder(save_tiny_qwen3_embedder(tmp_path / "q"))
    full = embedder.embed(TEXTS[:2]).vectors
    cut = embedder.embed(TEXTS[:2], dims=16).vectors
    torch.testing.assert_close(cut, torch.nn.functional.normalize(full[:, :16], dim=-1))
    with pytest.raises(ValueError, match="dimensions"):
        embedder.embed(TEXTS[:1], dims=65)


def test_the_identity_is_the_weights_not_the_path(tmp_path):
    import shutil

    first = save_tiny_bert(tmp_path / "a", seed=0)
    copy = shutil.copytree(first, tmp_path / "b")
    other = save_tiny_bert(tmp_path / "c", seed=1)
    assert identity(first) == identity(copy) != identity(other)


def test_what_is_not_an_embedding_model_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="no such file or folder"):
        load_embedder(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="not a model"):
        load_embedder(tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        load_embedder(tmp_path / "empty")
    bad = save_tiny_bert(tmp_path / "bad-pooling")
    (bad / "1_Pooling" / "config.json").write_text(
        '{"pooling_mode_max_tokens": true}')
    with pytest.raises(ValueError, match="pooling"):
        load_embedder(bad)


def test_a_nomic_bert_gguf_equals_its_folder(tmp_path):
    """nomic-bert's own code (remote code, not installed) is not here to compare with:
    the folder and the GGUF written from it agree, and the parts that differ from BERT
    (rotary, the fused qkv, SwiGLU) change the vectors when changed."""
    folder = save_tiny_nomic(tmp_path / "nomic")
    path = write_bert_gguf(folder, tmp_path / "nomic.gguf", pooling_type=1)
    hf, gguf = load_embedder(folder), load_embedder(path)
    assert (hf.kind, hf.pooling, gguf.kind, gguf.pooling) == ("nomic-bert", "mean") * 2
    assert hf.prompts[QUERY] == "search_query: " and hf.matryoshka
    texts = TEXTS[:4]
    torch.testing.assert_close(gguf.embed(texts).vectors, hf.embed(texts).vectors,
                               atol=ATOL, rtol=0)
    # Positions matter (rotary): a reordered text gets another vector.
    a, b = hf.embed(["pump winter", "winter pump"]).vectors
    assert (a - b).abs().max() > 1e-3


def test_a_qwen3_embedding_gguf_equals_its_folder(tmp_path):
    folder = save_tiny_qwen3_embedder(tmp_path / "qwen3-embedding")
    path = write_qwen3_gguf(folder, tmp_path / "qwen3-embedding.gguf")
    gguf, hf = load_embedder(path), load_embedder(folder)
    assert (gguf.kind, gguf.pooling) == ("decoder", "last")
    assert gguf.tokenize(TEXTS) == hf.tokenize(TEXTS)
    torch.testing.assert_close(gguf.embed(TEXTS).vectors, hf.embed(TEXTS).vectors,
                               atol=ATOL, rtol=0)


def test_a_chat_model_is_not_taken_for_an_embedder(tmp_path):
    from engine.embeddings.probe import probe
    from tests.engine.tiny_models import save_tiny_model, tiny_llama_config

    chat = save_tiny_model(tmp_path / "chat", tiny_llama_config())
    for check in (probe, load_embedder):
        with pytest.raises(ValueError, match="a chat model, not an embedding model"):
            check(chat)
    assert probe(save_tiny_qwen3_embedder(tmp_path / "q")) == "Qwen3, folder"


def test_a_bert_variant_folio_does_not_run_is_refused_by_its_key(tmp_path):
    import json

    folder = save_tiny_bert(tmp_path / "relative")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(
        {**config, "position_embedding_type": "relative_key"}))
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key'"):
        load_embedder(folder)
