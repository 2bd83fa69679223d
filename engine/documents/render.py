"""A document as the model reads it, the same characters every time for the same file
and name, so its tokens (and so its KV blocks) are the same in every chat: a header with
the name, then each section under its anchor (``[page 3]``)."""

from __future__ import annotations

from engine.documents.document import Document

DOCUMENTS_INTRO = "The user attached these documents:"


def render_document(document: Document) -> str:
    body = "\n\n".join(f"[{s.anchor}]\n{s.text}" if s.anchor else s.text
                       for s in document.sections)
    return f'<document name="{_quoted(document.name)}">\n{body}\n</document>'


def render_documents(rendered: list[str]) -> str:
    """The block that goes after the system prompt: every whole document, in the order
    the conversation attached them."""
    return DOCUMENTS_INTRO + "\n\n" + "\n\n".join(rendered)


def _quoted(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
