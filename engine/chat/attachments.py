"""Files attached to a conversation (OpenAI ``file`` content parts), for the prompt
builder: lifted out of the turns they came in, read through the document store, and put
where their KV is reused.

A document that fits (its tokens plus room for the conversation within the context) goes
whole into one fixed place, after the system prompt and before the turns, rendered the
same way every time: every later question in the chat, and the first question of another
chat with the same file (and system prompt), finds its blocks in the prefix cache or the
disk tier and computes only its own tokens. A document that does not fit is searched
instead (engine/documents/retrieval.py): its best passages for the question, with their
pages, go into the question's own turn.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.documents import (
    FILE_PART,
    Document,
    DocumentIndex,
    DocumentStore,
    file_part,
    render_document,
    render_documents,
    render_passages,
)
from engine.documents.hybrid import HybridSearch
from engine.documents.vectors import VectorStore

if TYPE_CHECKING:
    from engine.embeddings import Embedder

WHOLE = "whole"
RETRIEVAL = "retrieval"
MAX_ROOM = 4096  # tokens kept free for the conversation beside the whole documents
_KEPT = 16  # documents whose token counts and indexes are kept
ANCHOR_TOKENS = 8  # a passage's "[page N]" line and the blank line before it


@dataclass(slots=True, frozen=True)
class AttachedDocument:
    """A document in a prompt: how it is read (``whole`` or ``retrieval``) and how many
    tokens it takes whole."""

    name: str
    sha256: str
    kind: str
    mode: str
    tokens: int


class Attachments:
    """The builder's documents: the store, each document's rendered text and token count,
    and the retrieval indexes, kept for the next question. Thread-safe.

    ``embedder``: the embedding model the user picked; retrieval then ranks passages by
    BM25 and their vectors together (engine/documents/hybrid.py), each document's
    vectors made once and kept beside its text (``vectors``). None: BM25 alone."""

    def __init__(self, count: Callable[[str], int], max_model_len: int | None,
                 store: DocumentStore | None = None, embedder: Embedder | None = None
                 ) -> None:
        self._count = count
        self.max_model_len = max_model_len
        self._store = store
        self.embedder = embedder
        self._vectors: VectorStore | None = None
        self._lock = threading.Lock()
        self._rendered: OrderedDict[tuple[str, str], tuple[str, int]] = OrderedDict()
        self._indexes: OrderedDict[str, DocumentIndex | HybridSearch] = OrderedDict()

    @property
    def store(self) -> DocumentStore:
        with self._lock:
            if self._store is None:
                self._store = DocumentStore()
            return self._store

    @property
    def vectors(self) -> VectorStore:
        store = self.store
        with self._lock:
            if self._vectors is None:
                self._vectors = VectorStore(store.root)
            return self._vectors

    @property
    def room(self) -> int:
        return min(MAX_ROOM, (self.max_model_len or 0) // 4)

    def lift(self, messages: list) -> tuple[list, list[Document]]:
        """The messages without their file parts, and the documents those held (each
        once, in order of first appearance); DocumentError or ValueError naming the part
        or the file for a bad one."""
        documents: dict[tuple[str, str], Document] = {}
        out = []
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list) or not any(
                    isinstance(p, dict) and p.get("type") == FILE_PART for p in content):
                out.append(message)
                continue
            kept = []
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == FILE_PART:
                    file = file_part(part, f"messages[{i}].content[{j}]")
                    doc = self.store.open(file.data, file.name, file.media_type)
                    documents.setdefault((doc.sha256, doc.name), doc)
                else:
                    kept.append(part)
            out.append({**message, "content": kept})
        return out, list(documents.values())

    def place(self, messages: list[dict], documents: list[Document]
              ) -> tuple[list[dict], tuple[AttachedDocument, ...]]:
        """``messages`` (content as text) with the documents in: whole ones after the
        system prompt, a retrieved one's passages before the last user turn's text."""
        if not documents:
            return messages, ()
        used = 0
        whole: list[str] = []
        retrieved: list[Document] = []
        uses = []
        for doc in documents:
            text, tokens = self._render(doc)
            fits = self.max_model_len is None or \
                used + tokens + self.room <= self.max_model_len
            if fits:
                used += tokens
                whole.append(text)
            else:
                retrieved.append(doc)
            uses.append(AttachedDocument(doc.name, doc.sha256, doc.kind,
                                         WHOLE if fits else RETRIEVAL, tokens))
        messages = list(messages)
        if retrieved:
            messages = self._with_passages(messages, retrieved, used)
        if whole:
            block = render_documents(whole)
            if messages and messages[0].get("role") == "system":
                messages[0] = {**messages[0],
                               "content": _appended(messages[0].get("content"), block)}
            else:
                messages.insert(0, {"role": "system", "content": block})
        return messages, tuple(uses)

    def _with_passages(self, messages: list[dict], documents: list[Document],
                       used: int) -> list[dict]:
        """The best passages of each document for the last user turn's question, as many
        as fit half of what the whole documents leave of the context (shared equally)."""
        last = next((i for i in range(len(messages) - 1, -1, -1)
                     if messages[i].get("role") == "user"), None)
        if last is None:
            raise ValueError("messages: a document too long to read whole is searched "
                             "for a user's question, and there is none")
        content = messages[last].get("content")
        question = _text_of(content)
        budget = (self.max_model_len - used) // 2 // len(documents)
        passages = [render_passages(doc.name, self._fitting(doc, question, budget))
                    for doc in documents]
        messages[last] = {**messages[last],
                          "content": _prepended("\n\n".join(passages), content)}
        return messages

    def _fitting(self, document: Document, question: str, budget: int) -> list:
        kept, total = [], 0
        for passage in self._index(document).search(question):
            total += self._count(passage.text) + ANCHOR_TOKENS
            if total > budget:
                break
            kept.append(passage)
        return kept

    def _render(self, document: Document) -> tuple[str, int]:
        key = (document.sha256, document.name)
        with self._lock:
            found = self._rendered.get(key)
        if found is None:
            text = render_document(document)
            found = (text, self._count(text))
            with self._lock:
                self._rendered[key] = found
                _trim(self._rendered)
        return found

    def _index(self, document: Document) -> DocumentIndex | HybridSearch:
        with self._lock:
            index = self._indexes.get(document.sha256)
        if index is None:
            index = DocumentIndex(document)
            if self.embedder is not None:
                index = self._hybrid(index, self.embedder)
            with self._lock:
                self._indexes[document.sha256] = index
                _trim(self._indexes)
        return index


    def _hybrid(self, index: DocumentIndex, embedder: Embedder) -> HybridSearch:
        from engine.embeddings import DOCUMENT

        passages = [c.text for c in index.chunks]
        vectors = self.vectors.vectors(
            embedder.identity, index.document.sha256, len(passages),
            lambda: embedder.embed(passages, DOCUMENT).vectors.numpy())
        return HybridSearch(index, vectors, embedder)


# A message's content here is text, or a list of parts where another kind (an image)
# stays a part for the template: text goes in as text either way.
def _text_of(content) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content
                        if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def _appended(content, text: str):
    if isinstance(content, list):
        return [*content, {"type": "text", "text": "\n\n" + text}]
    return f"{content}\n\n{text}" if content else text


def _prepended(text: str, content):
    if isinstance(content, list):
        return [{"type": "text", "text": text + "\n\n"}, *content]
    return f"{text}\n\n{content}" if content else text


def _trim(kept: OrderedDict) -> None:
    while len(kept) > _KEPT:
        kept.popitem(last=False)
