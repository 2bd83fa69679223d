"""Dense retrieval's plumbing with a tiny random embedder (no real embedding model is on
the test machine: the quality of a real one is not measured here): reciprocal rank
fusion, a passage's own text found first, the 60-page manual's hit count beside BM25's,
and each document's vectors made once per content and model (another chat, a restart)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.chat.attachments import RETRIEVAL, Attachments
from engine.documents import DocumentIndex, DocumentStore, extract, file_data_url
from engine.documents.hybrid import HybridSearch, fuse
from engine.documents.vectors import VectorStore
from engine.embeddings import DOCUMENT, load_embedder
from tests.engine.documents.test_document_retrieval import FACTS, manual
from tests.engine.embeddings.tiny_embedders import save_tiny_bert


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return load_embedder(save_tiny_bert(tmp_path_factory.mktemp("emb") / "bert",
                                        pooling="mean"))


@pytest.fixture(scope="module")
def pdf():
    return manual()


def test_reciprocal_rank_fusion():
    # 2 is second in both lists (2/62) and beats 1 and 3, first in one list only (1/61).
    assert fuse([1, 2], [3, 2]) == [2, 1, 3]
    assert fuse([5, 6, 7], []) == [5, 6, 7]
    assert fuse([], []) == []


def test_a_passage_is_found_by_its_own_text(tmp_path, embedder, pdf):
    index = DocumentIndex(extract(pdf[0], "manual.pdf"))
    vectors = VectorStore(tmp_path).vectors(
        embedder.identity, index.document.sha256, len(index.chunks),
        lambda: embedder.embed([c.text for c in index.chunks], DOCUMENT).vectors.numpy())
    search = HybridSearch(index, vectors, embedder)
    for chunk in index.chunks[::37]:
        assert search.search(chunk.text, 5)[0] == chunk
    assert search.search("   ") == []


def test_hybrid_hit_count_on_the_planted_facts(tmp_path, embedder, pdf):
    data, pages = pdf
    index = DocumentIndex(extract(data, "manual.pdf"))
    vectors = VectorStore(tmp_path).vectors(
        embedder.identity, index.document.sha256, len(index.chunks),
        lambda: embedder.embed([c.text for c in index.chunks], DOCUMENT).vectors.numpy())
    search = HybridSearch(index, vectors, embedder)

    def hits(searcher) -> int:
        return sum(f"page {page}" in [c.anchor for c in searcher.search(question, 5)]
                   for (_, question), page in zip(FACTS, pages, strict=True))

    bm25, hybrid = hits(index), hits(search)
    print(f"top-5 hits of 20: BM25 {bm25}, hybrid with a tiny random embedder {hybrid}")
    assert bm25 >= 18
    # A random embedder's ranking is noise; fused with BM25's it may cost a few hits but
    # not most of them (the figure with a real model is not measured: none is here).
    assert hybrid >= 10


def test_vectors_are_made_once_per_document_and_model(tmp_path, embedder, pdf):
    url = file_data_url(pdf[0], "application/pdf")
    part = {"type": "file", "file": {"file_data": url, "filename": "manual.pdf"}}

    def ask(attachments: Attachments, question: str) -> str:
        messages, documents = attachments.lift(
            [{"role": "user", "content": [part, {"type": "text", "text": question}]}])
        placed, uses = attachments.place(messages, documents)
        assert uses[0].mode == RETRIEVAL
        return placed[-1]["content"][0]["text"]

    first = Attachments(len, 8000, DocumentStore(tmp_path), embedder)
    text = ask(first, FACTS[6][1])
    assert text.count("[page ") >= 2 and first.vectors.computed == 1
    ask(first, FACTS[0][1])  # another question, another chat of the same builder
    assert first.vectors.computed == 1
    stored = first.vectors.path(embedder.identity, first.store.open(pdf[0], "m.pdf").sha256)
    assert stored.is_file()
    # A restart: a new builder over the same folder reads the vectors back.
    again = Attachments(len, 8000, DocumentStore(tmp_path), embedder)
    assert ask(again, FACTS[6][1]) == text and again.vectors.computed == 0
    np.testing.assert_array_equal(np.load(stored), again.vectors.vectors(
        embedder.identity, again.store.open(pdf[0], "m.pdf").sha256,
        np.load(stored).shape[0], lambda: pytest.fail("embedded again")))
    # Without an embedder: BM25 alone, nothing embedded.
    plain = Attachments(len, 8000, DocumentStore(tmp_path))
    assert "fire assembly point" in ask(plain, FACTS[6][1]) and plain.vectors.computed == 0


def test_damaged_vectors_are_made_again(tmp_path, embedder):
    store = VectorStore(tmp_path)
    path = store.path("model", "0" * 64)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not numpy")
    got = store.vectors("model", "0" * 64, 2, lambda: np.array([[3.0, 4.0], [0.0, 2.0]]))
    np.testing.assert_allclose(got, [[0.6, 0.8], [0.0, 1.0]])
    assert store.computed == 1 and np.load(path).shape == (2, 2)
