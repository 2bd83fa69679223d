"""`folio bench documents` on the tiny model: what it measured (the document read whole,
the later questions computing only their own tokens, the restart's from disk, the first
read's prefill in a process of its own, the long one searched), never how fast."""

from __future__ import annotations

import os

import torch

from engine.bench.documents import bench_documents
from engine.bench.setup import BenchContext, BenchSettings
from tests.engine.tiny_models import save_tiny_model


def test_documents_reads_whole_then_reuses_and_searches_the_long_one(tmp_path):
    threads = torch.get_num_threads()
    folder = os.environ.get("FOLIO_KV_CACHE_DIR")
    model = save_tiny_model(tmp_path / "tiny")
    settings = BenchSettings(model=str(model), threads=1, reply_tokens=4, kv_blocks=256,
                             document_tokens=300)
    try:
        result = bench_documents(BenchContext.create(settings))
    finally:
        torch.set_num_threads(threads)
    assert os.environ.get("FOLIO_KV_CACHE_DIR") == folder  # put back
    warm, first_read, long_row, *readers = result["rows"]
    assert warm["mode"] == "whole" and 300 <= warm["document_tokens"] < 600
    # Each later question computes its own turn (within a block), not the document.
    for key in ("same_chat", "new_chat", "restart"):
        assert 0 < warm[f"{key}_computed_tokens"] < 80, key
    assert warm["restart_disk_tokens"] >= 300
    # The first read: Folio's prefill of the same ids in a process of its own; llama.cpp
    # needs a .gguf file (or is not installed), so it and the ratio are left out.
    assert first_read["prompt_tokens"] > 300 and first_read["folio_ms"] > 0
    assert "llama_cpp_ms" not in first_read and "folio_over_llama_cpp" not in first_read
    assert any(note.startswith("the first read: llama.cpp skipped") for note in result["notes"])
    assert long_row["mode"] == "retrieval" and long_row["document_tokens"] > 100_000
    assert long_row["prompt_tokens"] < 1024
    assert 0 < long_row["extract_share"] < 1 and 0 < long_row["index_share"] < 1
    assert readers[0]["reader"] == "pypdfium2" and readers[0]["words"] > 30_000
    assert [t["name"] for t in result["targets"]] == [
        "4-page PDF: second question / first question TTFT",
        "4-page PDF: a new chat's first question / the first chat's first TTFT",
        "4-page PDF: a new chat after a restart / the first chat's first TTFT"]
    assert not any("differs" in note for note in result["notes"])
