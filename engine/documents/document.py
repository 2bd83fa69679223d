"""What an attached file becomes: its text in sections, each with the anchor a reader
cites (``page 3`` of a PDF, a heading of a DOCX, Markdown or HTML file), and the error
every bad file raises."""

from __future__ import annotations

from dataclasses import dataclass


class DocumentError(ValueError):
    """A file Folio cannot read, naming the file and why: encrypted, no text layer, over a
    limit, a zip bomb, an unknown type."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


@dataclass(slots=True, frozen=True)
class Section:
    """One page of a PDF, or the text under one heading; ``anchor`` is empty for a file
    without either (plain text, source code, text before the first heading)."""

    anchor: str
    text: str


@dataclass(slots=True, frozen=True)
class Document:
    """``sha256`` of the file's bytes: the store's key, the same for every chat that
    attaches the file. ``kind``: pdf, docx, markdown, html or text."""

    name: str
    sha256: str
    kind: str
    sections: tuple[Section, ...]

    @property
    def text(self) -> str:
        return "\n\n".join(s.text for s in self.sections)

    def to_json(self) -> dict:
        return {"kind": self.kind, "sections": [[s.anchor, s.text] for s in self.sections]}

    @classmethod
    def from_json(cls, name: str, sha256: str, data: dict) -> Document:
        return cls(name, sha256, data["kind"],
                   tuple(Section(anchor, text) for anchor, text in data["sections"]))
