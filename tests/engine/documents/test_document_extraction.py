"""Attached files to text: PDFs and DOCX files written here (text known in advance) with
their page and section anchors, Markdown, HTML, text and code; and each bad input refused
with a DocumentError (a ValueError) naming the file and the reason."""

from __future__ import annotations

import pytest

from engine.bench.pdf_writer import write_pdf
from engine.documents import DocumentError, Section, extract, kind_of
from engine.documents import extract_docx as docx_module
from engine.documents.limits import MAX_FILE_BYTES, MiB
from tests.engine.documents.docx_writer import write_docx


def test_a_pdf_reads_page_by_page_with_page_anchors():
    pdf = write_pdf([["Quarterly report", "Revenue rose (again) by 12%."],
                     ["Costs fell in the north office.", "Café prices held."],
                     ["Outlook: steady."]])
    doc = extract(pdf, "report.pdf")
    assert doc.kind == "pdf"
    assert doc.sections == (
        Section("page 1", "Quarterly report\nRevenue rose (again) by 12%."),
        Section("page 2", "Costs fell in the north office.\nCafé prices held."),
        Section("page 3", "Outlook: steady."))


def test_a_page_without_text_keeps_its_number():
    doc = extract(write_pdf([["first"], [], ["third"]]), "gap.pdf")
    assert [s.anchor for s in doc.sections] == ["page 1", "page 2", "page 3"]
    assert doc.sections[1].text == ""


def test_an_encrypted_pdf_is_refused_saying_so():
    pdf = write_pdf([["secret plans"]], user_password="hunter2")
    with pytest.raises(DocumentError, match=r"^locked\.pdf: the PDF is encrypted"):
        extract(pdf, "locked.pdf")


def test_a_pdf_without_a_text_layer_says_there_is_no_ocr():
    with pytest.raises(DocumentError, match=r"scan\.pdf: the PDF has no text.*no OCR"):
        extract(write_pdf([[], []]), "scan.pdf")


def test_a_damaged_pdf_is_refused():
    with pytest.raises(DocumentError, match=r"broken\.pdf: not a readable PDF"):
        extract(b"%PDF-1.4\nnothing else", "broken.pdf")


def test_a_docx_reads_its_headings_as_sections():
    data = write_docx([("p", "Preface text."), ("h1", "Scope"), ("p", "Covers the pumps."),
                       ("table", [["part", "count"], ["valve", "12"]]),
                       ("h1", "Safety"), ("p", "Wear gloves & goggles.")])
    doc = extract(data, "manual.docx")
    assert doc.kind == "docx"
    assert doc.sections == (
        Section("", "Preface text."),
        Section("Scope", "Scope\nCovers the pumps.\npart | count\nvalve | 12"),
        Section("Safety", "Safety\nWear gloves & goggles."))


def test_a_docx_zip_bomb_is_refused_by_its_ratio():
    bomb = write_docx([("p", "hi")], {"word/media/zeros.bin": bytes(20 * MiB)})
    with pytest.raises(DocumentError, match=r"bomb\.docx: a zip bomb\?.*zeros\.bin"):
        extract(bomb, "bomb.docx")


def test_a_docx_zip_bomb_is_refused_by_its_declared_size(monkeypatch):
    monkeypatch.setattr(docx_module, "MAX_UNPACKED_BYTES", 4 * MiB)
    parts = {f"word/media/{i}.bin": bytes(MiB) for i in range(5)}
    with pytest.raises(DocumentError, match=r"big\.docx: a zip bomb\? it unpacks to 5 MiB"):
        extract(write_docx([("p", "hi")], parts), "big.docx")


def test_a_docx_with_entities_or_no_body_is_refused():
    with pytest.raises(DocumentError, match="not a DOCX"):
        extract(write_docx([], {}).replace(b"word/document.xml", b"word/documenx.xml"),
                "odd.docx")
    with pytest.raises(DocumentError, match="not a readable DOCX"):
        extract(b"PK not really", "zip.docx")


def test_markdown_sections_follow_headings_outside_code_fences():
    text = "intro\n\n# Install\nrun it\n```\n# not a heading\n```\n## Use\nask\n"
    doc = extract(text.encode(), "README.md")
    assert [s.anchor for s in doc.sections] == ["", "Install", "Use"]
    assert "# not a heading" in doc.sections[1].text


def test_html_keeps_visible_text_under_its_headings():
    html = ("<html><head><title>t</title><style>p{}</style></head><body><p>Lead &amp; "
            "intro</p><h2>Prices</h2><p>Tea  costs\n 3</p><script>x()</script>"
            "<ul><li>one</li><li>two</li></ul></body></html>")
    doc = extract(html.encode(), "page.html")
    assert doc.sections == (Section("", "Lead & intro"),
                            Section("Prices", "Prices\nTea costs 3\none\ntwo"))


def test_text_and_code_are_one_section_as_written():
    code = "def f(x):\r\n    return x  # ok\r\n"
    doc = extract(code.encode(), "tool.py")
    assert doc.kind == "text" and doc.sections == (Section("", "def f(x):\n    return x  # ok\n"),)
    assert extract("plain".encode("utf-16"), "notes.txt").text == "plain"


def test_the_size_limit_and_unknown_types_are_named():
    limit = MAX_FILE_BYTES // MiB
    with pytest.raises(DocumentError, match=rf"huge\.txt: 32\.0 MiB.*at most {limit} MiB"):
        extract(b"a" * (MAX_FILE_BYTES + 1), "huge.txt")
    with pytest.raises(DocumentError, match=r"sheet\.xlsx: unknown type \(\.xlsx\)"):
        extract(b"PK\3\4", "sheet.xlsx")
    with pytest.raises(DocumentError, match=r"blob\.txt: a binary file"):
        extract(b"\0\1\2", "blob.txt")
    with pytest.raises(DocumentError, match=r"empty\.md: the file is empty"):
        extract(b"", "empty.md")
    assert issubclass(DocumentError, ValueError)


def test_the_kind_comes_from_the_name_then_the_type_then_the_bytes():
    assert kind_of("a.PDF", b"") == "pdf"
    assert kind_of("attachment", b"", "text/markdown") == "markdown"
    assert kind_of("attachment", b"%PDF-1.7") == "pdf"
    assert kind_of("Makefile", b"all:") == "text"
