"""A document cut into passages for retrieval: never across a page or section, paragraphs
kept whole where they fit, each passage with its section's anchor (a page number)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.documents.document import Document

TARGET_CHARS = 1200  # about 300 tokens: five of them leave most of a small context free
_PARAGRAPH = re.compile(r"\n\s*\n")


@dataclass(slots=True, frozen=True)
class Chunk:
    index: int
    anchor: str
    text: str


def chunk_document(document: Document, target: int = TARGET_CHARS) -> list[Chunk]:
    chunks: list[Chunk] = []
    for section in document.sections:
        for text in _pack(_pieces(section.text, target), target):
            chunks.append(Chunk(len(chunks), section.anchor, text))
    return chunks


def _pieces(text: str, target: int) -> list[str]:
    """Paragraphs; one longer than ``target`` split at its lines, then its words."""
    out: list[str] = []
    for paragraph in _PARAGRAPH.split(text):
        paragraph = paragraph.strip()
        if len(paragraph) <= target:
            out += [paragraph] if paragraph else []
            continue
        for line in paragraph.split("\n"):
            while len(line) > target:
                cut = line.rfind(" ", 0, target)
                cut = cut if cut > target // 2 else target
                out.append(line[:cut].strip())
                line = line[cut:]
            if line.strip():
                out.append(line.strip())
    return out


def _pack(pieces: list[str], target: int) -> list[str]:
    packed: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + 1 + len(piece) > target:
            packed.append(current)
            current = ""
        current = f"{current}\n{piece}" if current else piece
    if current:
        packed.append(current)
    return packed
