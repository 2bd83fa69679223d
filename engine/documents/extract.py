"""A file's bytes to a ``Document``: its kind told by its name (else the type it came
with, else a PDF's signature), the size limit checked first, the kind's reader run."""

from __future__ import annotations

import hashlib
from pathlib import PurePath

from engine.documents.document import Document, DocumentError
from engine.documents.extract_docx import extract_docx
from engine.documents.extract_pdf import extract_pdf
from engine.documents.extract_text import extract_html, extract_markdown, extract_plain
from engine.documents.limits import MAX_FILE_BYTES, MAX_TEXT_CHARS, MiB

READERS = {"pdf": extract_pdf, "docx": extract_docx, "markdown": extract_markdown,
           "html": extract_html, "text": extract_plain}
_SUFFIXES = {".pdf": "pdf", ".docx": "docx", ".md": "markdown", ".markdown": "markdown",
             ".html": "html", ".htm": "html", ".xhtml": "html"}
# Plain text and source code: read as text, lines as they are.
TEXT_SUFFIXES = frozenset((
    ".txt", ".text", ".log", ".csv", ".tsv", ".json", ".jsonl", ".yaml", ".yml", ".toml",
    ".ini", ".cfg", ".conf", ".xml", ".rst", ".tex", ".org", ".py", ".pyi", ".ipynb",
    ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cu", ".m", ".mm", ".rs", ".go",
    ".java", ".kt", ".kts", ".scala", ".swift", ".cs", ".fs", ".js", ".mjs", ".cjs",
    ".jsx", ".ts", ".tsx", ".vue", ".svelte", ".css", ".scss", ".less", ".php", ".rb",
    ".pl", ".pm", ".lua", ".r", ".jl", ".dart", ".zig", ".nim", ".hs", ".ml", ".mli",
    ".ex", ".exs", ".erl", ".clj", ".sql", ".sh", ".bash", ".zsh", ".fish", ".ps1",
    ".bat", ".cmake", ".mk", ".gradle", ".proto", ".graphql", ".tf", ".nix", ".diff",
    ".patch"))
TEXT_NAMES = frozenset(("makefile", "dockerfile", "readme", "license", "changelog",
                        "cmakelists.txt"))
_TYPES = {"application/pdf": "pdf", "text/markdown": "markdown", "text/html": "html",
          "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx"}
KINDS_TEXT = "PDF, DOCX, Markdown, HTML, plain text and source code"


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def kind_of(name: str, data: bytes, media_type: str | None = None) -> str:
    """pdf, docx, markdown, html or text; DocumentError for any other file."""
    path = PurePath(name)
    suffix = path.suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    if suffix in TEXT_SUFFIXES or path.name.lower() in TEXT_NAMES:
        return "text"
    media_type = (media_type or "").split(";")[0].strip().lower()
    if media_type in _TYPES:
        return _TYPES[media_type]
    if data.startswith(b"%PDF-"):
        return "pdf"
    if media_type.startswith("text/") or (not suffix and not media_type):
        return "text"  # decode_text refuses what is not text
    what = suffix or media_type
    raise DocumentError(name, f"unknown type ({what}); Folio reads {KINDS_TEXT}")


def extract(data: bytes, name: str, media_type: str | None = None) -> Document:
    """The file's text in sections; DocumentError naming the file and the reason."""
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(name, f"{len(data) / MiB:.1f} MiB; Folio reads files of at "
                            f"most {MAX_FILE_BYTES // MiB} MiB")
    if not data:
        raise DocumentError(name, "the file is empty")
    document = READERS[kind_of(name, data, media_type)](data, name, sha256_of(data))
    chars = sum(len(s.text) for s in document.sections)
    if chars == 0:
        raise DocumentError(name, "the file has no text")
    if chars > MAX_TEXT_CHARS:
        raise DocumentError(name, f"{chars:,} characters of text; Folio reads at most "
                            f"{MAX_TEXT_CHARS:,}")
    return document
