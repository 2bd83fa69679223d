"""A document's passage vectors, kept by the document's content hash under the embedding
model's identity (``vectors/<model>/<sha256>.npy`` beside the extracted text), so another
chat, or the next process, with the same file and model embeds nothing again.

NumPy files, not a vector database: a document's passages are hundreds of vectors, and
ranking them all against a question is one matrix-vector product (well under a
millisecond), so an index (sqlite-vec's, or an approximate one) would add a native
dependency and buy nothing at this size. One file per document is written whole
(temporary name, then rename), read back with ``allow_pickle=False``.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

# Bumped when passages are cut differently (chunks.py), so older vectors are made again.
CHUNKS_VERSION = 1
MEMORY_DOCUMENTS = 16


class VectorStore:
    """``vectors(model, sha256, count, compute)``: the document's [count, dims] float32
    unit vectors, computed (``compute()``) only when neither memory nor the folder has
    them. ``computed`` counts the documents embedded by this store. Thread-safe."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / f"vectors-v{CHUNKS_VERSION}"
        self._lock = threading.Lock()
        self._memory: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.computed = 0

    def path(self, model: str, sha256: str) -> Path:
        return self.root / model / f"{sha256}.npy"

    def vectors(self, model: str, sha256: str, count: int,
                compute: Callable[[], np.ndarray]) -> np.ndarray:
        key = (model, sha256)
        with self._lock:
            found = self._memory.get(key)
        if found is None:
            found = self._load(model, sha256, count)
        if found is None:
            found = _unit(np.asarray(compute(), dtype=np.float32))
            with self._lock:
                self.computed += 1
            self._save(model, sha256, found)
        with self._lock:
            self._memory[key] = found
            self._memory.move_to_end(key)
            while len(self._memory) > MEMORY_DOCUMENTS:
                self._memory.popitem(last=False)
        return found

    def _load(self, model: str, sha256: str, count: int) -> np.ndarray | None:
        try:
            found = np.load(self.path(model, sha256), allow_pickle=False)
        except (OSError, ValueError):
            return None  # missing or damaged: embed again
        ok = found.ndim == 2 and found.shape[0] == count and found.dtype == np.float32
        return found if ok else None

    def _save(self, model: str, sha256: str, vectors: np.ndarray) -> None:
        path = self.path(model, sha256)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                np.save(f, vectors, allow_pickle=False)
            os.replace(tmp, path)
        except OSError:
            pass  # kept in memory; embedded again in the next process


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)
