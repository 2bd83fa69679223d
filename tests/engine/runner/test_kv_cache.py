"""KV pool sizing on the CPU (CUDA sizing: tests/engine/runner/test_kv_budget_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.runner.kv_cache import (
    CONCURRENT_CONTEXTS,
    DEFAULT_KV_BUDGET_BYTES,
    KVBudgetError,
    KVShape,
    num_blocks_for,
)

CPU = torch.device("cpu")
# The starter's shape: 30 layers, 3 KV heads of 64, fp32 -> 737,280 bytes per 16-token block.
STARTER = KVShape(30, 3, 64, 16, torch.float32)
CONTEXT_BLOCKS = 8192 // 16  # one full 8k context of the starter: 360 MiB


def test_block_bytes_of_the_starter_shape():
    assert STARTER.bytes_per_token == 46_080
    assert STARTER.bytes_per_block == 737_280
    assert STARTER.context_blocks(8192) == CONTEXT_BLOCKS
    assert STARTER.context_blocks(8193) == CONTEXT_BLOCKS + 1


def test_explicit_block_count_wins():
    assert num_blocks_for(EngineConfig(num_gpu_blocks=24), STARTER, CPU, 8192) == 24


def test_a_budget_bounds_the_few_contexts():
    config = EngineConfig(kv_cache_memory_bytes=2 * CONTEXT_BLOCKS * 737_280 + 5)
    assert num_blocks_for(config, STARTER, CPU, 8192) == 2 * CONTEXT_BLOCKS
    roomy = EngineConfig(kv_cache_memory_bytes=64 << 30)  # more than the contexts need
    assert num_blocks_for(roomy, STARTER, CPU, 8192) == CONCURRENT_CONTEXTS * CONTEXT_BLOCKS


def test_default_is_a_few_contexts_capped_but_never_below_one():
    assert num_blocks_for(EngineConfig(), STARTER, CPU, 8192) == CONCURRENT_CONTEXTS * 512
    # A 128k context of the starter (5.6 GiB) is over the default cap: one context still fits.
    assert num_blocks_for(EngineConfig(), STARTER, CPU, 131072) == 131072 // 16
    # Contexts of 32k: four would be 5.6 GiB, so the 2 GiB default cap decides.
    assert num_blocks_for(EngineConfig(), STARTER, CPU, 32768) == \
        DEFAULT_KV_BUDGET_BYTES // 737_280


def test_server_style_sizing_is_cuda_only():
    config = EngineConfig(gpu_memory_utilization=0.9)
    assert num_blocks_for(config, STARTER, CPU, 8192) == CONCURRENT_CONTEXTS * 512


def test_a_budget_smaller_than_one_context_names_the_setting_and_the_need():
    config = EngineConfig(kv_cache_memory_bytes=256 << 20)
    with pytest.raises(KVBudgetError, match=r"^EngineConfig\.kv_cache_memory_bytes: one full "
                       r"context \(8192 tokens\) needs 360 MiB .* leaves 256 MiB") as info:
        num_blocks_for(config, STARTER, CPU, 8192)
    assert isinstance(info.value, ValueError)
    assert (info.value.setting, info.value.needed) == ("kv_cache_memory_bytes", 512 * 737_280)
    # The same budget is enough once the context is shorter.
    assert num_blocks_for(config, STARTER, CPU, 2048) == (256 << 20) // 737_280
