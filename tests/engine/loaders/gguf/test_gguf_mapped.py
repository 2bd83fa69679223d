"""Quantized weights mapped from the GGUF file: a model keeps computing when its file is
deleted or replaced under it, the next load of a changed file is a FolioLoadError, and
a directory declaring data past the end of the file (or any other corruption of it) is a
FolioLoadError before anything is read, never a read outside the mapping."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.loaders import FolioLoadError, load_model_files
from engine.loaders.gguf.header import parse_gguf_header
from engine.models import build_model
from tests.engine.loaders.gguf.test_gguf_loader import tiny_state, write_gguf

TOKENS = torch.tensor([3, 9, 4, 17, 2, 8])


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def state() -> dict[str, np.ndarray]:
    return tiny_state()


def _write(path: Path, state: dict[str, np.ndarray]) -> None:
    """Every matrix quantized (K rows Q4_1, the rest Q8_0), so every projection maps."""
    kinds = {name: Q.Q4_1 if "k_proj" in name else Q.Q8_0
             for name, weight in state.items() if weight.ndim == 2}
    write_gguf(path, state, quantized=kinds)


def _model(path: Path):
    loaded = load_model_files(path, keep_quantized=True)
    model = build_model(loaded.config, torch.float32, "cpu")
    model.load_weights(loaded.weights)
    return model


def _logits(model) -> torch.Tensor:
    """Logits of TOKENS through the embedding and LM head (the mapped tables) and every
    quantized projection of the first layer."""
    hidden = model.embed_tokens(TOKENS)
    attn = model.layers[0].self_attn
    hidden = hidden + attn.o_proj(attn.qkv_proj(hidden)[:, :hidden.shape[1]])
    mlp = model.layers[1].mlp
    hidden = hidden + mlp.down_proj(mlp.gate_up_proj(hidden)[:, :mlp.down_proj.in_features])
    return model.lm_head(hidden)


def test_the_model_computes_after_its_file_is_deleted(tmp_path, state):
    path = tmp_path / "tiny.gguf"
    _write(path, state)
    model = _model(path)
    assert model.layers[0].self_attn.qkv_proj.quantized
    before = _logits(model)
    path.unlink()  # the mapping keeps the bytes
    assert torch.equal(_logits(model), before)
    with pytest.raises(FolioLoadError, match=r"tiny\.gguf"):
        _model(path)


def test_a_file_replaced_under_a_loaded_model(tmp_path, state):
    """The way downloads replace files (a new file renamed over the old one): the running
    model keeps the old bytes; the next load reads the new file, here one whose directory
    declares a tensor past its end."""
    path = tmp_path / "tiny.gguf"
    _write(path, state)
    model = _model(path)
    before = _logits(model)
    data = path.read_bytes()
    last = max(parse_gguf_header(path).tensors, key=lambda t: t.offset)
    replacement = tmp_path / "download.part"
    replacement.write_bytes(data[:last.offset + 16])
    replacement.replace(path)
    assert torch.equal(_logits(model), before)
    with pytest.raises(FolioLoadError, match=rf"truncated \(tensor {last.name} ends past"):
        _model(path)


def _entries(data: bytes, names: list[str]) -> list[tuple[int, int]]:
    """(offset of the n_dims field, n_dims) of each directory entry: u64 name length, the
    name, u32 n_dims, u64 dims, u32 type, u64 offset."""
    found = []
    for name in names:
        key = struct.pack("<Q", len(name)) + name.encode()
        at = data.find(key) + len(key)
        found.append((at, struct.unpack_from("<I", data, at)[0]))
    return found


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory, state) -> tuple[bytes, list[tuple[int, int]]]:
    path = tmp_path_factory.mktemp("mapped") / "tiny.gguf"
    _write(path, state)
    data = path.read_bytes()
    names = [t.name for t in parse_gguf_header(path).tensors]
    return data, _entries(data, names)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 10_000), field=st.sampled_from(["dim", "type", "offset"]),
       value=st.integers(0, 2**64 - 1))
def test_a_corrupt_directory_is_a_load_error(tmp_path, tiny_file, which, field, value):
    data, entries = tiny_file
    at, n_dims = entries[which % len(entries)]
    patched = bytearray(data)
    if field == "dim":
        struct.pack_into("<Q", patched, at + 4, value)
    elif field == "type":
        struct.pack_into("<I", patched, at + 4 + 8 * n_dims, value % 2**32)
    else:
        struct.pack_into("<Q", patched, at + 8 + 8 * n_dims, value)
    path = tmp_path / f"fuzz-{which}-{field}.gguf"
    path.write_bytes(bytes(patched))
    try:
        model = _model(path)
    except FolioLoadError:
        return
    except ValueError as exc:  # the model's own shape check, naming the parameter
        assert "parameter" in str(exc)
        return
    finally:
        path.unlink()
    # A corruption that still describes a readable file (an offset inside it) loads, and
    # computes on whatever bytes it names.
    assert _logits(model).shape == (len(TOKENS), model.spec.vocab_size)
