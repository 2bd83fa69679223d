"""GGUF loading with keep_quantized (EngineConfig(weights="stored")), on the starter (a Q4_1
file with a tied Q8_0 token_embd): which tensors stay blocks, the model's bytes, the Q/K
un-permutation of byte rows, and damaged files (each a FolioLoadError naming the tensor,
after which the engine still loads and serves)."""

from __future__ import annotations

import shutil
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.loaders import FolioLoadError, load_model_files
from engine.loaders.gguf.header import parse_gguf_header
from engine.models import build_model
from engine.outputs import ErrorEvent, FinishedEvent
from kernels.quant.formats import BY_NAME, QuantizedTensor
from kernels.quant.matrix import dequantize_cpu
from kernels.quant.torch_packed import Int4Packed

pytestmark = pytest.mark.slow

Q4_1, Q8_0 = BY_NAME["Q4_1"].type_id, BY_NAME["Q8_0"].type_id
LAYERS = 30
HEADS, KV_HEADS, HIDDEN = 9, 3, 576


@pytest.fixture(scope="module")
def starter() -> Path:
    from engine.loaders.catalog import starter_path

    return starter_path()


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory) -> Path:
    # One conversion of the starter's header and tokenizer for the whole module.
    return tmp_path_factory.mktemp("folio-quantized-cache")


@pytest.fixture(autouse=True)
def _cache(module_cache, monkeypatch):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(module_cache))


@pytest.fixture(scope="module")
def quantized_load(starter, module_cache):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FOLIO_CACHE_DIR", str(module_cache))
        loaded = load_model_files(starter, keep_quantized=True)
        weights = dict(loaded.weights)
    return loaded, weights


def _tensor_bytes(starter: Path) -> int:
    total = 0
    for tensor in parse_gguf_header(starter).tensors:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.qtype)]
        total += int(np.prod(tensor.shape)) * block_bytes // block
    return total


def test_quantized_matrices_come_out_as_blocks(quantized_load):
    loaded, weights = quantized_load
    assert len(weights) == 272
    kinds: dict[str, int] = {}
    for name, tensor in weights.items():
        if name.endswith("norm.weight"):
            assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32, name
            assert tensor.shape == (HIDDEN,)
            kinds["float"] = kinds.get("float", 0) + 1
            continue
        assert isinstance(tensor, QuantizedTensor), name
        n, k = tensor.shape
        assert tensor.data.dtype == torch.uint8
        assert tuple(tensor.data.shape) == (n, tensor.format.row_bytes(k)), name
        kinds[tensor.format.name] = kinds.get(tensor.format.name, 0) + 1
    assert kinds == {"float": 61, "Q4_1": 210, "Q8_0": 1}
    embed = weights["model.embed_tokens.weight"]
    assert embed.type_id == Q8_0 and embed.shape == (49152, HIDDEN)
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert q.type_id == Q4_1 and q.shape == (HIDDEN, HIDDEN)
    assert weights["model.layers.7.self_attn.k_proj.weight"].shape == (192, HIDDEN)
    assert weights["model.layers.7.mlp.down_proj.weight"].shape == (HIDDEN, 1536)
    assert loaded.config.tie_word_embeddings


def test_quantized_matrices_are_views_of_the_mapped_file(quantized_load, starter):
    """No byte of a quantized matrix is copied at load: each is the file's own bytes,
    Q/K included (their llama.cpp row order is an index, not a move)."""
    _, weights = quantized_load
    header = {t.name: t for t in parse_gguf_header(starter).tensors}
    raw = np.memmap(starter, dtype=np.uint8, mode="r")
    q = weights["model.layers.3.self_attn.q_proj.weight"]
    entry = header["blk.3.attn_q.weight"]
    assert q.row_order is not None and sorted(q.row_order.tolist()) == list(range(HIDDEN))
    assert torch.equal(q.data.flatten(), torch.from_numpy(
        np.array(raw[entry.offset:entry.offset + q.data.numel()])))
    v = weights["model.layers.3.self_attn.v_proj.weight"]
    assert v.row_order is None
    # One mapping holds them all: their addresses lie as far apart as their offsets.
    v_entry = header["blk.3.attn_v.weight"]
    assert v.data.data_ptr() - q.data.data_ptr() == v_entry.offset - entry.offset


def test_quantized_model_holds_about_the_files_bytes(quantized_load, starter,
                                                     without_native_cpu):
    loaded, weights = quantized_load
    model = build_model(loaded.config, torch.float32, "cpu")
    model.load_weights(weights.items())
    file_bytes = _tensor_bytes(starter)
    held = model.weight_bytes()
    # Q4_1 matrices: int4pack at their own 5 bits (all row counts are whole 64-row tiles);
    # the Q8_0 table as two 4-bit halves, 10 bits a weight for 8.5: ~1.055x in all.
    assert held <= 1.1 * file_bytes, (held, file_bytes)
    assert held < 0.2 * 4 * 134_515_008  # far below the float32 model
    assert model.embed_tokens.storage is model.lm_head.storage  # one table, counted once
    for layer in model.layers:
        assert layer.self_attn.qkv_proj.quantized
        assert layer.self_attn.qkv_proj.weight.numel() == 0


def test_q_and_k_byte_rows_are_unpermuted(quantized_load, starter, module_cache,
                                          without_native_cpu):
    """The float path dequantizes then un-permutes rows; the quantized path un-permutes
    the byte rows. Dequantized, the blocks must be the float path's matrices bit for bit,
    and the model's stacked q/k/v layout must hold them in that row order."""
    loaded, weights = quantized_load
    wanted = {f"model.layers.{i}.self_attn.{p}_proj.weight"
              for i in (0, 13, LAYERS - 1) for p in "qkv"}
    floats = {name: tensor for name, tensor in load_model_files(starter).weights
              if name in wanted}
    assert set(floats) == wanted
    for name in sorted(wanted):
        block = weights[name].in_order()
        assert torch.equal(dequantize_cpu(block.data, block.type_id), floats[name]), name
    # Into the model: q, k, v (all Q4_1) merge into one int4pack run; its rows are the
    # float path's within the bf16 rounding of each group's scale and zero (2**-8 of
    # |d (q - 8)| + |m + 8d|, < 2**-7 of a row in norm), while rows out of order differ
    # by their whole size.
    model = build_model(loaded.config, torch.float32, "cpu")
    model.load_weights(weights.items())
    for index in (0, 13, LAYERS - 1):
        qkv = model.layers[index].self_attn.qkv_proj
        (run,) = qkv.storage.runs
        assert isinstance(run, Int4Packed) and run.shape == (HIDDEN + 2 * 192, HIDDEN)
        rows = run.rows(None, torch.float32).double()
        dense = torch.cat([floats[f"model.layers.{index}.self_attn.{p}_proj.weight"]
                           for p in "qkv"]).double()
        per_row = (rows - dense).norm(dim=1) / dense.norm(dim=1)
        assert per_row.max() < 2.0 ** -7, (index, per_row.max().item())


# ----------------------------------------------------------------------- damaged files
def _directory_entry(data: bytes, name: str) -> tuple[int, int]:
    """(offset of the entry's n_dims field, its n_dims) in the header's tensor directory:
    an entry is u64 name length, the name, u32 n_dims, u64 dims (row length first),
    u32 type, u64 offset."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.find(key)
    assert at > 0 and data.find(key, at + 1) == -1
    dims_at = at + len(key)
    return dims_at, struct.unpack_from("<I", data, dims_at)[0]


def _patched_copy(starter: Path, path: Path, name: str, *, qtype: int | None = None,
                  row: int | None = None) -> Path:
    data = bytearray(starter.read_bytes())
    dims_at, n_dims = _directory_entry(bytes(data[:4 << 20]), name)
    if row is not None:
        struct.pack_into("<Q", data, dims_at + 4, row)
    if qtype is not None:
        struct.pack_into("<I", data, dims_at + 4 + 8 * n_dims, qtype)
    path.write_bytes(bytes(data))
    return path


@pytest.fixture
def scratch(tmp_path):
    # Copies of the starter (~100 MB each) go as soon as the test ends: pytest keeps the
    # temporary folders of its last runs.
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_truncated_inside_a_quantized_tensor_names_it(starter, scratch):
    header = parse_gguf_header(starter)
    tensor = next(t for t in header.tensors if t.name == "blk.12.attn_q.weight")
    assert tensor.qtype == Q4_1
    cut = scratch / "cut.gguf"
    with open(starter, "rb") as source, open(cut, "wb") as target:
        target.write(source.read(tensor.offset + 1000))  # inside its first rows
    with pytest.raises(FolioLoadError, match=r"cut\.gguf: truncated \(tensor "
                                             r"blk\.12\.attn_q\.weight ends past"):
        load_model_files(cut, keep_quantized=True)


def test_unknown_block_type_names_the_tensor(starter, scratch):
    path = _patched_copy(starter, scratch / "type99.gguf", "blk.3.attn_v.weight", qtype=99)
    assert parse_gguf_header(path).tensors[0].qtype == Q8_0  # the others untouched
    with pytest.raises(FolioLoadError, match=r"type99\.gguf: tensor blk\.3\.attn_v\.weight "
                                             r"has block type 99"):
        load_model_files(path, keep_quantized=True)


def test_ragged_row_names_the_tensor(starter, scratch):
    path = _patched_copy(starter, scratch / "ragged.gguf", "blk.5.ffn_up.weight", row=560)
    shape = next(t.shape for t in parse_gguf_header(path).tensors
                 if t.name == "blk.5.ffn_up.weight")
    assert shape == (1536, 560)
    with pytest.raises(FolioLoadError, match=r"ragged\.gguf: tensor blk\.5\.ffn_up\.weight has "
                                             r"rows of 560 values, not a multiple of its "
                                             r"Q4_1 block of 32"):
        load_model_files(path, keep_quantized=True)


def test_the_engine_serves_after_a_failed_load(starter, scratch):
    from engine import LLM, SamplingParams
    from engine.config import EngineConfig
    from engine.worker import EngineWorker

    bad = _patched_copy(starter, scratch / "bad.gguf", "blk.0.attn_q.weight", qtype=99)
    with pytest.raises(FolioLoadError, match=r"blk\.0\.attn_q\.weight"):
        LLM(str(bad), EngineConfig(max_model_len=256))
    bad.unlink()
    llm = LLM("starter", EngineConfig(max_model_len=256))
    # Through the worker thread, the way the app and the server submit requests.
    worker = EngineWorker(llm).start()
    events: list = []
    done = threading.Event()

    def on_event(event) -> None:
        events.append(event)
        if isinstance(event, FinishedEvent | ErrorEvent):
            done.set()

    try:
        worker.submit([{"role": "user", "content": "What is the capital of France?"}],
                      SamplingParams(max_tokens=12, temperature=0), on_event)
        assert done.wait(120)
    finally:
        worker.shutdown()
    assert isinstance(events[-1], FinishedEvent), events[-1]
    assert "Paris" in events[-1].output.outputs[0].text
