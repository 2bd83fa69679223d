"""A PDF's text layer, a section per page (anchor ``page N``), through PDFium
(``pypdfium2``): of the readers compared (docs/DOCUMENTS.md) the fastest by a factor of
ten, with the text in reading order and the page breaks kept. Folio does no OCR: a PDF
whose pages hold no text (a scan) is refused, saying so."""

from __future__ import annotations

import re

from engine.documents.document import Document, DocumentError, Section
from engine.documents.limits import MAX_PDF_PAGES

# PDFium marks a hyphen it found at a line's end (a word broken across lines) as U+FFFE.
_BROKEN_WORD = re.compile("\ufffe\r?\n")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def extract_pdf(data: bytes, name: str, sha256: str) -> Document:
    import pypdfium2

    try:
        pdf = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise DocumentError(name, "the PDF is encrypted (it needs a password); "
                                "save a copy without the password and attach that") from exc
        raise DocumentError(name, f"not a readable PDF ({exc})") from exc
    try:
        if len(pdf) > MAX_PDF_PAGES:
            raise DocumentError(name, f"{len(pdf)} pages; Folio reads PDFs of at most "
                                f"{MAX_PDF_PAGES} pages")
        sections = tuple(Section(f"page {i + 1}", _page_text(pdf[i]))
                         for i in range(len(pdf)))
    finally:
        pdf.close()
    if not any(s.text for s in sections):
        raise DocumentError(name, "the PDF has no text (scanned pages?); Folio does no OCR")
    return Document(name, sha256, "pdf", sections)


def _page_text(page) -> str:
    textpage = page.get_textpage()
    try:
        text = textpage.get_text_range()
    finally:
        textpage.close()
        page.close()
    text = _BROKEN_WORD.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text).strip()
