"""A Word (.docx) file's text with Python's own ``zipfile`` and XML parser: paragraphs
and table rows in order, a section per heading (its text the anchor). The zip is checked
before anything is unpacked (what its entries declare, each entry's ratio) and read with
a cap, since a declared size can lie."""

from __future__ import annotations

import io
import zipfile
from xml.etree import ElementTree

from engine.documents.document import Document, DocumentError, Section
from engine.documents.limits import MAX_RATIO, MAX_UNPACKED_BYTES, MiB

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_BODY = "word/document.xml"


def extract_docx(data: bytes, name: str, sha256: str) -> Document:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise DocumentError(name, "not a readable DOCX (not a zip archive)") from exc
    with archive:
        _check_bomb(archive, name)
        try:
            xml = _read_capped(archive, _BODY, name)
        except KeyError as exc:
            raise DocumentError(name, f"not a DOCX ({_BODY} is missing)") from exc
    if b"<!DOCTYPE" in xml[:4096] or b"<!ENTITY" in xml:
        # Word never writes a DTD; entity expansion is the XML form of a bomb.
        raise DocumentError(name, "the DOCX's XML declares entities; refused")
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise DocumentError(name, f"the DOCX's XML does not parse ({exc})") from exc
    sections = _sections(root)
    if not any(s.text for s in sections):
        raise DocumentError(name, "the DOCX has no text")
    return Document(name, sha256, "docx", sections)


def _check_bomb(archive: zipfile.ZipFile, name: str) -> None:
    declared = 0
    for info in archive.infolist():
        declared += info.file_size
        if info.file_size > 1 * MiB and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise DocumentError(name, f"a zip bomb? {info.filename} unpacks "
                                f"{info.file_size // max(info.compress_size, 1)} times its "
                                f"packed size (the limit is {MAX_RATIO})")
    if declared > MAX_UNPACKED_BYTES:
        raise DocumentError(name, f"a zip bomb? it unpacks to {declared // MiB} MiB (the "
                            f"limit is {MAX_UNPACKED_BYTES // MiB} MiB)")


def _read_capped(archive: zipfile.ZipFile, member: str, name: str) -> bytes:
    with archive.open(member) as f:
        data = f.read(MAX_UNPACKED_BYTES + 1)
    if len(data) > MAX_UNPACKED_BYTES:
        raise DocumentError(name, f"a zip bomb? {member} unpacks past "
                            f"{MAX_UNPACKED_BYTES // MiB} MiB")
    return data


def _sections(root: ElementTree.Element) -> tuple[Section, ...]:
    body = root.find(f"{_W}body")
    sections: list[Section] = []
    anchor, lines = "", []
    for block in body if body is not None else ():
        if block.tag == f"{_W}p":
            text = _paragraph(block)
            if _is_heading(block) and text.strip():
                if lines or anchor:
                    sections.append(Section(anchor, "\n".join(lines).strip()))
                anchor, lines = text.strip(), []
            lines.append(text)
        elif block.tag == f"{_W}tbl":
            for row in block.iter(f"{_W}tr"):
                cells = [" ".join(_paragraph(p) for p in cell.iter(f"{_W}p")).strip()
                         for cell in row.iter(f"{_W}tc")]
                lines.append(" | ".join(cells))
    sections.append(Section(anchor, "\n".join(lines).strip()))
    return tuple(s for s in sections if s.text)


def _paragraph(p: ElementTree.Element) -> str:
    out = []
    for node in p.iter():
        if node.tag == f"{_W}t" and node.text:
            out.append(node.text)
        elif node.tag == f"{_W}tab":
            out.append("\t")
        elif node.tag in (f"{_W}br", f"{_W}cr"):
            out.append("\n")
    return "".join(out)


def _is_heading(p: ElementTree.Element) -> bool:
    style = p.find(f"{_W}pPr/{_W}pStyle")
    value = style.get(f"{_W}val", "") if style is not None else ""
    return value.lower().startswith(("heading", "title"))
