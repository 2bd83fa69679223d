"""Retrieval for a document too long for the context: its passages (chunks.py) in an
SQLite FTS5 table (Python's own ``sqlite3``; Porter stemming), ranked by BM25 against the
question. An index lives in memory, built once per document and kept for the next
question (building one is fast next to a prefill)."""

from __future__ import annotations

import re
import sqlite3
import threading

from engine.documents.chunks import Chunk, chunk_document
from engine.documents.document import Document

TOP_K = 5
_WORD = re.compile(r"\w+", re.UNICODE)


class DocumentIndex:
    def __init__(self, document: Document) -> None:
        self.document = document
        self.chunks = chunk_document(document)
        # The server searches from its worker threads, one at a time per index.
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute("CREATE VIRTUAL TABLE passages USING "
                         "fts5(text, tokenize='porter unicode61')")
        self._db.executemany("INSERT INTO passages(rowid, text) VALUES (?, ?)",
                             ((c.index, c.text) for c in self.chunks))

    def search(self, query: str, k: int = TOP_K) -> list[Chunk]:
        """The ``k`` passages BM25 ranks best for ``query``'s words (any of them), best
        first; none when no word of the query is in the document."""
        return [self.chunks[i] for i in self.ranked(query, k)]

    def ranked(self, query: str, k: int) -> list[int]:
        """The indexes of ``search``'s passages."""
        words = sorted(set(_WORD.findall(query.lower())))
        if not words:
            return []
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
        with self._lock:
            rows = self._db.execute("SELECT rowid FROM passages WHERE passages MATCH ? "
                                    "ORDER BY bm25(passages) LIMIT ?", (match, k)).fetchall()
        return [row[0] for row in rows]


def render_passages(name: str, passages: list[Chunk]) -> str:
    """Passages as they go into the question's turn, each under its anchor."""
    body = "\n\n".join(f"[{c.anchor}]\n{c.text}" if c.anchor else c.text for c in passages)
    return (f'Passages of "{name}" that may bear on the question (the document is too long '
            f"to read whole):\n\n{body}" if passages else
            f'No passage of "{name}" that matches the question fits the context.')
