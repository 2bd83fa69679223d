"""``Embedder``: texts (or token ids) to vectors with one loaded embedding model: each
text tokenized with the model's own tokenizer (its special tokens added), cut to the
model's max length, batched by length, run through the encoder, pooled and normalized as
the model says (sentence_config.py, or the GGUF's pooling type)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.embeddings.pooling import normalize, pool, truncate

MAX_BATCH_TEXTS = 32  # per forward; padded tokens per forward: the encoder's batch_tokens
QUERY = "query"
DOCUMENT = "document"


@dataclass(slots=True, frozen=True)
class Embeddings:
    vectors: torch.Tensor  # float32 [N, dims]
    tokens: int  # input tokens read, after truncation (the API's usage)


class Embedder:
    """One embedding model, thread-safe (one forward at a time).

    ``identity`` names the model's weights (not their path: the same file moved or
    copied is the same model), so stored vectors are found again after a restart.
    ``prompts``: the text put before a query or a document (Qwen3-Embedding's instruction
    before queries, nomic's ``search_query: `` / ``search_document: ``), ``""`` for none.
    ``matryoshka``: trained so that a vector's first values are an embedding of their own
    (the API's ``dimensions``)."""

    def __init__(self, name: str, identity: str, tokenizer, encoder, pooling: str,
                 normalized: bool, max_length: int, prompts: dict[str, str],
                 matryoshka: bool, kind: str) -> None:
        self.name = name
        self.identity = identity
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.pooling = pooling
        self.normalized = normalized
        self.max_length = max_length
        self.prompts = prompts
        self.matryoshka = matryoshka
        self.kind = kind  # "bert", "nomic-bert" or "decoder"
        self._lock = threading.Lock()

    @property
    def dimensions(self) -> int:
        return self.encoder.hidden_size

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def tokenize(self, texts: Sequence[str], role: str | None = None) -> list[list[int]]:
        """Each text's ids (with the role's prompt before it), cut to ``max_length``."""
        prefix = self.prompts.get(role, "") if role else ""
        encoded = self.tokenizer([prefix + t for t in texts], add_special_tokens=True,
                                 truncation=True, max_length=self.max_length)
        return [list(ids) for ids in encoded["input_ids"]]

    def embed(self, texts: Sequence[str], role: str | None = None,
              dims: int | None = None) -> Embeddings:
        """``role``: QUERY or DOCUMENT puts the model's prompt for it first; None, the
        texts as they are (the API's). ``dims``: Matryoshka truncation."""
        return self.embed_ids(self.tokenize(texts, role), dims)

    def embed_ids(self, ids: Sequence[Sequence[int]], dims: int | None = None) -> Embeddings:
        if not ids:
            return Embeddings(torch.zeros((0, dims or self.dimensions)), 0)
        ids = [list(t)[:self.max_length] for t in ids]
        if any(len(t) == 0 for t in ids):
            raise ValueError("input: an empty token list has no embedding")
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[torch.Tensor | None] = [None] * len(ids)
        with self._lock:
            for batch in _batches(order, [len(t) for t in ids], self.encoder.batch_tokens):
                for i, vector in zip(batch, self._run([ids[i] for i in batch]), strict=True):
                    out[i] = vector
        vectors = torch.stack(out)  # type: ignore[arg-type]
        if dims is not None:
            vectors = truncate(vectors, dims)
        return Embeddings(vectors, sum(len(t) for t in ids))

    def _run(self, batch: list[list[int]]) -> torch.Tensor:
        lengths = [len(t) for t in batch]
        padded = torch.zeros((len(batch), max(lengths)), dtype=torch.long)
        for i, t in enumerate(batch):
            padded[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        vectors = pool(self.encoder.forward(padded, lengths), lengths, self.pooling)
        return normalize(vectors) if self.normalized else vectors


def _batches(order: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive runs of ``order`` (shortest first) whose padded size fits ``budget``
    tokens (a longer text alone)."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > budget or \
                len(current) == MAX_BATCH_TEXTS:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
