"""Extracted text kept on disk by the file's content hash (sha256 of its bytes), beside
the KV cache's disk tier: one JSON file per document, shared by every chat that attaches
the same bytes, whatever the file's name. The folder: ``FOLIO_DOCUMENTS_DIR``, else
``documents`` under ``FOLIO_CACHE_DIR`` or the user's cache folder (as ``kv`` is)."""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path

from engine.documents.document import Document
from engine.documents.extract import extract, sha256_of

# Bumped when a reader's output changes, so older extractions are read again.
EXTRACTOR_VERSION = 1
MEMORY_DOCUMENTS = 16  # kept parsed in memory besides the files


def documents_root() -> Path:
    import platformdirs

    if os.environ.get("FOLIO_DOCUMENTS_DIR"):
        return Path(os.environ["FOLIO_DOCUMENTS_DIR"])
    base = os.environ.get("FOLIO_CACHE_DIR") or platformdirs.user_cache_dir("folio")
    return Path(base) / "documents"


class DocumentStore:
    """``open(data, name)``: the document, extracted once per content; thread-safe (the
    server builds prompts on worker threads). A folder that cannot be written leaves the
    store working from memory."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else documents_root()
        self._lock = threading.Lock()
        self._memory: OrderedDict[str, Document] = OrderedDict()  # recent ones, by sha
        self.extracted = 0  # files read by a reader, not found in the store

    def path(self, sha256: str) -> Path:
        return self.root / f"{sha256}.json"

    def open(self, data: bytes, name: str, media_type: str | None = None) -> Document:
        sha = sha256_of(data)
        with self._lock:
            found = self._memory.get(sha) or self._load(sha, name)
        if found is None:
            found = extract(data, name, media_type)  # DocumentError for a bad file
            with self._lock:
                self.extracted += 1
                self._save(found)
        with self._lock:
            self._memory[sha] = found
            self._memory.move_to_end(sha)
            while len(self._memory) > MEMORY_DOCUMENTS:
                self._memory.popitem(last=False)
        # The same bytes under another name are the same text; the name is this chat's.
        return found if found.name == name else Document(name, sha, found.kind,
                                                         found.sections)

    def _load(self, sha: str, name: str) -> Document | None:
        try:
            data = json.loads(self.path(sha).read_text(encoding="utf-8"))
            if data.get("version") != EXTRACTOR_VERSION:
                return None
            return Document.from_json(name, sha, data)
        except (OSError, ValueError, KeyError, TypeError):
            return None  # missing or damaged: read the file again

    def _save(self, document: Document) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self.path(document.sha256)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"version": EXTRACTOR_VERSION, **document.to_json()}, f)
            os.replace(tmp, path)
        except OSError:
            pass  # kept in memory; extracted again in the next process
