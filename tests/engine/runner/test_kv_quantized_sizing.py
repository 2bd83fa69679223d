"""The quantized KV formats in the pool's byte accounting: KVShape's bytes per token and
block, the pool it plans, the model list's estimate and the catalog's per-token bytes all
count a format's rows (its values and its scales), per layer where head sizes differ."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.config import EngineConfig
from engine.runner.kv_cache import KVShape, estimate_memory, planned_blocks
from kernels.kv_format import format_named

# The starter's shape: 30 layers, 3 KV heads of 64, 16-token blocks.
STARTER = {name: KVShape(30, 3, 64, 16, format_named(name).storage)
           for name in ("float16", "int8", "fp8", "int4")}


def test_bytes_per_token_of_the_starter_shape():
    per_token = {name: shape.bytes_per_token for name, shape in STARTER.items()}
    # float16: 2 x 30 x 3 x 64 x 2; 8-bit: 64 values + a float16 scale per row (int8: and
    # a byte of its key block's centers); int4: 32 bytes of nibbles + one float16 scale (a
    # 64-element group).
    assert per_token == {"float16": 23_040, "int8": 12_060, "fp8": 11_880, "int4": 6_300}
    assert per_token["int8"] / per_token["float16"] <= 0.53
    assert per_token["int4"] / per_token["float16"] <= 0.28
    assert STARTER["int8"].bytes_per_block == 16 * 12_060
    assert STARTER["int4"].format.name == "int4" and STARTER["int4"].format.rotated


def test_per_layer_head_sizes_count_each_layers_rows():
    """Gemma 4's shape: sliding layers of 256-wide heads, global layers of 512."""
    shape = KVShape(3, 8, 256, 16, torch.int8, ((8, 256), (8, 256), (2, 512)))
    # int8: codes, a float16 scale, a byte per 64 elements for the key blocks' centers.
    assert shape.block_bytes([0]) == 16 * 2 * 8 * (256 + 2 + 4)
    assert shape.block_bytes([2]) == 16 * 2 * 2 * (512 + 2 + 8)
    assert shape.bytes_per_token == 2 * (2 * 8 * 262) + 2 * 2 * 522
    int4 = KVShape(3, 8, 256, 16, torch.uint8, ((8, 256), (8, 256), (2, 512)))
    # int4: hd / 2 bytes of codes, then the longer of a float16 scale per 64 elements (16
    # bytes) and a key row's share of its block's parameters (23).
    assert int4.block_bytes([2]) == 16 * 2 * 2 * (256 + 23)


def test_a_budget_holds_about_twice_the_blocks_in_int8():
    config = EngineConfig(kv_cache_memory_bytes=64 << 20)
    blocks = {name: planned_blocks(config, STARTER[name], 2048) for name in STARTER}
    assert blocks["float16"] == (64 << 20) // (16 * 23_040) == 182
    assert blocks["int8"] == (64 << 20) // (16 * 12_060) == 347
    assert blocks["int4"] == 4 * 128  # four 2,048-token contexts fit: no more are planned


def _info(**kw):
    base = dict(name="m", format="gguf", context_length=8192, num_layers=30, num_kv_heads=3,
                head_dim=64, num_parameters=134_515_008, size_bytes=90_000_000)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("name", ["float16", "int8", "fp8", "int4"])
def test_the_model_lists_estimate_counts_the_formats_bytes(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    est = estimate_memory(_info(), EngineConfig(kv_cache_dtype=name))
    # Four 8k contexts of 512 blocks each.
    assert est.kv_bytes == 4 * 512 * STARTER[name].bytes_per_block


def test_the_catalog_counts_a_quantized_kv_dtype_by_name():
    from engine.models.spec import kv_bytes_per_token

    assert kv_bytes_per_token(30, 3, 64, "int8") == 12_060
    assert kv_bytes_per_token(30, 3, 64, torch.uint8) == 6_300
    assert kv_bytes_per_token(30, 3, 64, "float32") == 46_080
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_bytes_per_token(30, 3, 64, "q4_0")
