"""The shipped model catalog: every entry valid and of a family Folio runs, the memory it
needs computed from its facts, and the search over it."""

from __future__ import annotations

import json

import pytest

from desktop_app.data import model_catalog
from desktop_app.data.model_catalog import load_catalog, memory_needed, parse_entry, search
from engine.config import EngineConfig
from engine.models import SUPPORTED_MODEL_TYPES

LLAMA_1B = {"name": "Llama 3.2 1B Instruct", "family": "Llama 3.2", "architecture": "llama",
            "repo": "bartowski/Llama-3.2-1B-Instruct-GGUF",
            "file": "Llama-3.2-1B-Instruct-Q4_K_M.gguf", "quantization": "Q4_K_M",
            "parameters": 1235814400, "file_bytes": 807690000, "context": 131072,
            "layers": 16, "kv_heads": 8, "head_dim": 64}


def test_the_shipped_catalog_loads_and_names_real_families():
    entries = load_catalog()
    assert len(entries) >= 12
    assert {e.architecture for e in entries} <= set(SUPPORTED_MODEL_TYPES)
    families = {e.family for e in entries}
    assert {"SmolLM2", "Llama 3.2", "Qwen3", "Gemma 3", "Phi-3", "Mistral"} <= families
    assert len({(e.repo, e.file) for e in entries}) == len(entries)  # no entry twice
    for e in entries:
        # A download's size against its parameters: between 3 and 17 bits a weight (a
        # quantized file, or bfloat16 with its embeddings), so no size is off by 10x.
        assert 3 <= 8 * e.file_bytes / e.parameters <= 17, e.name


def test_memory_needed_is_the_weights_and_a_kv_pool_from_the_entrys_shape():
    entry = parse_entry(LLAMA_1B)
    config = EngineConfig(max_model_len=4096, kv_cache_dtype="float16", block_size=16)
    # A GGUF kept quantized counts as its file; the KV pool is four 4096-token contexts
    # (under the 2 GiB cap), K and V of 16 layers x 8 heads x 64 in float16.
    per_token = 2 * 16 * 8 * 64 * 2
    assert memory_needed(entry, config) == LLAMA_1B["file_bytes"] + 4 * 4096 * per_token
    # Float weights count their parameters at the dtype's bytes instead of the file.
    dense = EngineConfig(max_model_len=4096, kv_cache_dtype="float16", weights="float32")
    assert memory_needed(entry, dense) == 4 * LLAMA_1B["parameters"] + 4 * 4096 * per_token
    # A bigger context costs more KV: the formula reads the entry's context and shape.
    assert memory_needed(entry, EngineConfig(max_model_len=8192, kv_cache_dtype="float16")) \
        > memory_needed(entry, config)


@pytest.mark.parametrize("change, field", [
    ({"repo": "no-owner"}, "repo"),
    ({"architecture": "bert"}, "architecture"),
    ({"layers": 0}, "layers"),
    ({"file_bytes": "800 MB"}, "file_bytes"),
    ({"file": "weights.bin"}, "file"),
    ({"name": " "}, "name"),
    ({"active_parameters": 2_000_000_000}, "active_parameters"),
])
def test_a_malformed_entry_names_its_field(change, field):
    with pytest.raises(ValueError, match=rf"models\[3\] \(.*\)\.{field}:"):
        parse_entry({**LLAMA_1B, **change}, 3)


def test_a_catalog_file_without_a_model_list_is_refused(tmp_path):
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"models": {"name": "x"}}))
    with pytest.raises(ValueError, match="models:"):
        load_catalog(path)


def test_search_matches_every_word_in_name_family_repo_or_quantization():
    entries = load_catalog()
    assert [e.name for e in search(entries, "qwen3 4b")] == ["Qwen3 4B"]
    assert {e.family for e in search(entries, "LLAMA 3.2")} == {"Llama 3.2"}
    # SmolLM2 is a Llama: the architecture is searched too.
    assert {e.family for e in search(entries, "llama")} == {"Llama 3.2", "Llama 3.1", "SmolLM2"}
    assert all(e.quantization == "Q8_0" for e in search(entries, "q8_0"))
    assert search(entries, "  ") == list(entries)
    assert search(entries, "no such model") == []
    assert model_catalog.CATALOG_FILE == "catalog.json"
