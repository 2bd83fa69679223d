"""Text files: Markdown (a section per ATX heading, outside code fences), HTML (the
visible text, a section per h1-h3 heading; scripts and styles dropped), and plain text or
source code (one section, its lines as they are)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from engine.documents.document import Document, DocumentError, Section

_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def decode_text(data: bytes, name: str) -> str:
    """UTF-8 (a BOM allowed) or UTF-16 with its BOM; anything else, or NUL bytes (a
    binary file), is refused."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise DocumentError(name, "not valid UTF-16 text") from exc
    if b"\0" in data:
        raise DocumentError(name, "a binary file, not text; Folio reads PDF, DOCX, "
                            "Markdown, HTML, plain text and source code")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(name, f"not UTF-8 text (byte {exc.start})") from exc


def extract_plain(data: bytes, name: str, sha256: str) -> Document:
    text = _normal(decode_text(data, name))
    return Document(name, sha256, "text", (Section("", text),) if text.strip() else ())


def extract_markdown(data: bytes, name: str, sha256: str) -> Document:
    sections: list[Section] = []
    anchor, lines, fenced = "", [], False
    for line in _normal(decode_text(data, name)).split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        heading = None if fenced else _HEADING.match(line)
        if heading and heading.group(2):
            if "\n".join(lines).strip():
                sections.append(Section(anchor, "\n".join(lines).strip()))
            anchor, lines = heading.group(2), []
        lines.append(line)
    if "\n".join(lines).strip():
        sections.append(Section(anchor, "\n".join(lines).strip()))
    return Document(name, sha256, "markdown", tuple(sections))


def extract_html(data: bytes, name: str, sha256: str) -> Document:
    reader = _HTMLText()
    reader.feed(decode_text(data, name))
    reader.close()
    return Document(name, sha256, "html", reader.result())


def _normal(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


class _HTMLText(HTMLParser):
    _SKIP = {"script", "style", "head", "template", "noscript", "svg"}
    _BLOCK = {"p", "div", "br", "li", "tr", "section", "article", "pre", "blockquote",
              "table", "ul", "ol", "dl", "dt", "dd", "header", "footer", "h4", "h5", "h6"}
    _HEADINGS = {"h1", "h2", "h3"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[Section] = []
        self.anchor = ""
        self.parts: list[str] = []
        self.skipping = 0
        self.heading: list[str] | None = None

    def handle_starttag(self, tag, attrs) -> None:
        if tag in self._SKIP:
            self.skipping += 1
        elif tag in self._HEADINGS:
            self.heading = []
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag) -> None:
        if tag in self._SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self._HEADINGS and self.heading is not None:
            title = " ".join("".join(self.heading).split())
            self.heading = None
            self._close()
            self.anchor = title
            self.parts = [title, "\n"]
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data) -> None:
        if self.skipping:
            return
        if self.heading is not None:
            self.heading.append(data)
        else:  # a line break in the source is a space on the page
            self.parts.append(data.replace("\n", " "))

    def _close(self) -> None:
        lines = [" ".join(line.split()) for line in "".join(self.parts).split("\n")]
        text = "\n".join(line for line in lines if line)
        if text:
            self.sections.append(Section(self.anchor, text))

    def result(self) -> tuple[Section, ...]:
        self._close()
        return tuple(self.sections)
