"""Embedding models Folio runs itself: the BERT family (bge, nomic-embed-text) from
folders and GGUF files, and decoders with last-token pooling (Qwen3-Embedding) on the
engine's own model code; ``load_embedder`` loads one once per process.

Names load lazily, so ``probe`` (what the app's settings check a pick with) imports no
torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.embeddings.embedder import DOCUMENT, QUERY, Embedder, Embeddings
    from engine.embeddings.load import embedding_model, load_embedder

__all__ = ["DOCUMENT", "QUERY", "Embedder", "Embeddings", "embedding_model", "load_embedder"]
_WHERE = {"DOCUMENT": "embedder", "QUERY": "embedder", "Embedder": "embedder",
          "Embeddings": "embedder", "embedding_model": "load", "load_embedder": "load"}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'engine.embeddings' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"engine.embeddings.{_WHERE[name]}"), name)
