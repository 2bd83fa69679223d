"""A minimal DOCX for the document tests: a zip with ``word/document.xml`` holding
headings, paragraphs and a table (text known in advance), as Word lays them out."""

from __future__ import annotations

import io
import zipfile
from xml.sax.saxutils import escape

_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def _paragraph(text: str, style: str | None = None) -> str:
    props = f'<w:pPr><w:pStyle w:val="{style}"/></w:pPr>' if style else ""
    return f"<w:p>{props}<w:r><w:t xml:space=\"preserve\">{escape(text)}</w:t></w:r></w:p>"


def write_docx(blocks: list, extra: dict[str, bytes] | None = None) -> bytes:
    """``blocks``: ("h1", text), ("p", text) or ("table", [[cell, ...], ...])."""
    body = []
    for kind, value in blocks:
        if kind == "table":
            rows = "".join("<w:tr>" + "".join(f"<w:tc>{_paragraph(c)}</w:tc>" for c in row)
                           + "</w:tr>" for row in value)
            body.append(f"<w:tbl>{rows}</w:tbl>")
        else:
            body.append(_paragraph(value, "Heading1" if kind == "h1" else None))
    xml = (f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
           f'<w:document xmlns:w="{_NS}"><w:body>{"".join(body)}</w:body></w:document>')
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", xml)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return out.getvalue()
