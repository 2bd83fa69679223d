"""LLMEngine picks its device, dtype and KV pool through runner/device.py and kv_cache.py."""

from __future__ import annotations

import pytest
import torch

import kernels.cpu
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.runner.kv_cache import CONCURRENT_CONTEXTS, KVBudgetError
from kernels import default_backend_name


def test_defaults_on_a_machine_without_cuda(tiny_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    engine = LLMEngine(str(tiny_dir), EngineConfig())
    r = engine.resolved_device
    assert (r.device.type, r.dtype, r.backend, r.label) == (
        "cpu", torch.float32, default_backend_name("cpu"), "CPU")
    # The dock's line names the CPU's kernel path.
    assert engine.memory_stats().device == f"CPU, {kernels.cpu.status()}"
    # The default pool: a few full contexts of the model (1024 tokens), in int8's 64-token
    # blocks on the native kernels, float32's 16 on PyTorch's.
    native = kernels.cpu.available()
    assert (r.kv_format.name, engine.config.block_size) == (
        ("int8", 64) if native else ("float32", 16))
    blocks = CONCURRENT_CONTEXTS * 1024 // engine.config.block_size
    assert engine.kv_stats(with_blocks=False).num_blocks == blocks


def test_a_budget_below_one_context_stops_the_load(tiny_dir):
    # The tiny model: 2 layers x 2 KV heads x 16 dims x 2 (K, V) x 4 bytes = 512 B a token.
    with pytest.raises(KVBudgetError, match=r"kv_cache_memory_bytes: one full context "
                                            r"\(1024 tokens\)"):
        LLMEngine(str(tiny_dir), EngineConfig(device="cpu", kv_cache_memory_bytes=1000))
