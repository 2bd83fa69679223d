"""Hybrid retrieval: a document's passages ranked by BM25 (retrieval.py) and by the
cosine of their vectors with the question's (vectors.py), the two rankings fused by
reciprocal rank fusion: score(p) = 1 / (K + rank_bm25(p)) + 1 / (K + rank_cosine(p)),
ranks from 1, a ranking's ``CANDIDATES`` best taken from each (a passage absent from one
list adds nothing from it). RRF needs no calibration between BM25's unbounded scores and
cosines, and K = 60 is the constant of its paper (Cormack et al., 2009)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.documents.chunks import Chunk
from engine.documents.retrieval import TOP_K, DocumentIndex

if TYPE_CHECKING:
    from engine.embeddings import Embedder

K = 60
CANDIDATES = 50


def fuse(*rankings: list[int], k: int = K) -> list[int]:
    """Items of ``rankings`` (each best first) by their summed 1 / (k + rank), best first;
    ties keep the first ranking's order."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, 1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda item: -scores[item])


class HybridSearch:
    """A document's BM25 index with its passages' vectors and the model that made them."""

    def __init__(self, index: DocumentIndex, vectors: np.ndarray, embedder: Embedder) -> None:
        self.index = index
        self.vectors = vectors  # [passages, dims] unit rows
        self.embedder = embedder

    @property
    def chunks(self) -> list[Chunk]:
        return self.index.chunks

    def search(self, query: str, k: int = TOP_K) -> list[Chunk]:
        from engine.embeddings import QUERY

        if not query.strip():
            return []
        question = self.embedder.embed([query], QUERY).vectors[0].numpy()
        cosine = self.vectors @ (question / max(float(np.linalg.norm(question)), 1e-12))
        dense = np.argsort(-cosine, kind="stable")[:CANDIDATES].tolist()
        ranked = fuse(self.index.ranked(query, CANDIDATES), dense)
        return [self.index.chunks[i] for i in ranked[:k]]
