"""Embedding models Folio runs itself: the BERT family (bge, nomic-embed-text) from
folders and GGUF files, and decoders with last-token pooling (Qwen3-Embedding) on the
engine's own model code; ``load_embedder`` loads one once per process."""

from engine.embeddings.embedder import DOCUMENT, QUERY, Embedder, Embeddings
from engine.embeddings.load import load_embedder

__all__ = ["DOCUMENT", "QUERY", "Embedder", "Embeddings", "load_embedder"]
