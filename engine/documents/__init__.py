"""Attached files to text: PDF (pypdfium2), DOCX (zipfile and XML), Markdown, HTML, plain
text and source code, with page or section anchors (``extract``); the store that keeps
extracted text by content hash (``DocumentStore``); how a document is rendered for the
prompt; passages and their BM25 index for retrieval (``DocumentIndex``)."""

from engine.documents.chunks import Chunk, chunk_document
from engine.documents.document import Document, DocumentError, Section
from engine.documents.extract import extract, kind_of, sha256_of
from engine.documents.parts import FILE_PART, FilePart, file_data_url, file_part
from engine.documents.render import render_document, render_documents
from engine.documents.retrieval import DocumentIndex, render_passages
from engine.documents.store import DocumentStore, documents_root

__all__ = ["FILE_PART", "Chunk", "Document", "DocumentError", "DocumentIndex",
           "DocumentStore", "FilePart", "Section", "chunk_document", "documents_root",
           "extract", "file_data_url", "file_part", "kind_of", "render_document",
           "render_documents", "render_passages", "sha256_of"]
