"""The document store: text extracted once per content hash, kept on disk for the next
process, shared whatever the file's name; a damaged or older entry is read again."""

from __future__ import annotations

import json

from engine.bench.pdf_writer import write_pdf
from engine.documents import DocumentStore, documents_root, sha256_of
from engine.documents import store as store_module


def test_a_file_is_extracted_once_and_found_by_its_bytes(tmp_path):
    pdf = write_pdf([["alpha beta"], ["gamma"]])
    store = DocumentStore(tmp_path)
    first = store.open(pdf, "a.pdf")
    again = store.open(pdf, "renamed.pdf")
    assert store.extracted == 1
    assert again.name == "renamed.pdf" and again.sections == first.sections
    assert (tmp_path / f"{sha256_of(pdf)}.json").is_file()
    # A new process (a new store) reads the file, not the PDF.
    later = DocumentStore(tmp_path)
    assert later.open(pdf, "a.pdf") == first and later.extracted == 0


def test_a_damaged_or_older_entry_is_extracted_again(tmp_path, monkeypatch):
    text = b"# Title\nbody"
    store = DocumentStore(tmp_path)
    store.open(text, "n.md")
    path = store.path(sha256_of(text))
    path.write_text("{not json")
    fresh = DocumentStore(tmp_path)
    assert fresh.open(text, "n.md").sections[0].anchor == "Title" and fresh.extracted == 1
    data = json.loads(path.read_text())
    monkeypatch.setattr(store_module, "EXTRACTOR_VERSION", data["version"] + 1)
    newer = DocumentStore(tmp_path)
    newer.open(text, "n.md")
    assert newer.extracted == 1


def test_an_unwritable_folder_leaves_the_store_working(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = DocumentStore(blocker / "documents")
    assert store.open(b"hello", "x.txt").text == "hello"
    assert store.open(b"hello", "x.txt").text == "hello" and store.extracted == 1


def test_the_folder_sits_beside_the_kv_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("FOLIO_DOCUMENTS_DIR", raising=False)
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path))
    assert documents_root() == tmp_path / "documents"
    monkeypatch.setenv("FOLIO_DOCUMENTS_DIR", str(tmp_path / "elsewhere"))
    assert documents_root() == tmp_path / "elsewhere"
