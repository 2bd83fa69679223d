"""KV pool sizing on CUDA (faked): the budget and free memory both cap the pool; server-style
sizing only without a budget; estimates use the same rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.config import EngineConfig
from engine.runner.kv_cache import (
    CONCURRENT_CONTEXTS,
    CUDA_RESERVE_BYTES,
    KVBudgetError,
    KVShape,
    estimate_memory,
    num_blocks_for,
)
from tests.cpu_pool import CPU_BLOCK_SIZE, cpu_kv_bytes_per_token

GPU = torch.device("cuda", 0)
GIB = 1 << 30
# The starter in bf16: 368,640 bytes per 16-token block, 180 MiB per 8k context.
SHAPE = KVShape(30, 3, 64, 16, torch.bfloat16)
PER_BLOCK = 368_640
CONTEXT = 8192 // 16


def fake_memory(monkeypatch, free: int, total: int = 140 * GIB) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))


def test_default_is_a_few_contexts_whatever_is_free(monkeypatch):
    fake_memory(monkeypatch, free=100 * GIB)
    assert num_blocks_for(EngineConfig(), SHAPE, GPU, 8192) == CONCURRENT_CONTEXTS * CONTEXT


def test_never_more_than_the_budget_whatever_is_free(monkeypatch):
    fake_memory(monkeypatch, free=100 * GIB)
    config = EngineConfig(kv_cache_memory_bytes=300 << 20)  # 1.67 contexts
    assert num_blocks_for(config, SHAPE, GPU, 8192) == (300 << 20) // PER_BLOCK


def test_never_more_than_is_free(monkeypatch):
    free = CUDA_RESERVE_BYTES + 2 * CONTEXT * PER_BLOCK
    fake_memory(monkeypatch, free=free)
    config = EngineConfig(kv_cache_memory_bytes=4 * GIB)
    assert num_blocks_for(config, SHAPE, GPU, 8192) == 2 * CONTEXT


def test_too_little_free_for_one_context_names_max_model_len(monkeypatch):
    fake_memory(monkeypatch, free=CUDA_RESERVE_BYTES + 100 * PER_BLOCK)
    with pytest.raises(KVBudgetError, match=r"^EngineConfig\.max_model_len: .* only 35 MiB "
                                            r"of device memory is free"):
        num_blocks_for(EngineConfig(), SHAPE, GPU, 8192)


def test_a_budget_smaller_than_one_context_is_an_error(monkeypatch):
    fake_memory(monkeypatch, free=100 * GIB)
    with pytest.raises(ValueError, match=r"^EngineConfig\.kv_cache_memory_bytes: one full "
                                         r"context \(8192 tokens\) needs 180 MiB"):
        num_blocks_for(EngineConfig(kv_cache_memory_bytes=100 << 20), SHAPE, GPU, 8192)


def test_server_style_takes_the_share_of_the_card_only_without_a_budget(monkeypatch):
    fake_memory(monkeypatch, free=120 * GIB, total=140 * GIB)  # 20 GiB in use
    config = EngineConfig(gpu_memory_utilization=0.5)  # 70 GiB share - 20 in use = 50 GiB
    assert num_blocks_for(config, SHAPE, GPU, 8192) == 50 * GIB // PER_BLOCK
    budget = EngineConfig(gpu_memory_utilization=0.5, kv_cache_memory_bytes=GIB)
    assert num_blocks_for(budget, SHAPE, GPU, 8192) == CONCURRENT_CONTEXTS * CONTEXT
    fake_memory(monkeypatch, free=10 * GIB, total=140 * GIB)  # the share is all in use
    with pytest.raises(KVBudgetError, match="gpu_memory_utilization"):
        num_blocks_for(config, SHAPE, GPU, 8192)


def _info(**kw):
    base = dict(name="m", format="gguf", context_length=8192, num_layers=30, num_kv_heads=3,
                head_dim=64, num_parameters=134_515_008, size_bytes=90_000_000)
    return SimpleNamespace(**{**base, **kw})


def test_the_estimate_uses_the_engines_rule(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = _info()
    # CPU, quantized weights as stored: the file, plus four 8k contexts in the default pool
    # (the native kernels' int8 in 64-token blocks, else float32 in 16).
    per_token = cpu_kv_bytes_per_token(30, 3, 64)
    block = CPU_BLOCK_SIZE * per_token
    est = estimate_memory(info, EngineConfig())
    assert (est.weights_bytes, est.kv_bytes) == (90_000_000, 4 * 8192 * per_token)
    dense = estimate_memory(info, EngineConfig(weights="float32", max_model_len=2048))
    assert (dense.weights_bytes, dense.kv_bytes) == (134_515_008 * 4, 4 * 2048 * per_token)
    budget = 2 * 8192 * per_token + block // 2  # two contexts and half a block
    hf = estimate_memory(_info(format="hf"), EngineConfig(kv_cache_memory_bytes=budget))
    assert hf.weights_bytes == 134_515_008 * 4 and hf.kv_bytes == 2 * 8192 * per_token
    # A budget below one context shows what one context needs: the least that loads.
    small = estimate_memory(info, EngineConfig(kv_cache_memory_bytes=16 << 20))
    assert small.kv_bytes == 8192 * per_token
    assert small.total_bytes == 90_000_000 + 8192 * per_token


def test_the_estimate_on_a_gpu_is_in_bfloat16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    est = estimate_memory(_info(format="hf"), EngineConfig())
    assert (est.weights_bytes, est.kv_bytes) == (134_515_008 * 2, 4 * CONTEXT * PER_BLOCK)
