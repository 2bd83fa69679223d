"""KV pool sizing."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.runner.kv_cache import CPU_DEFAULT_KV_BYTES, KVShape, num_blocks_for

CPU = torch.device("cpu")
# The starter's shape: 30 layers, 3 KV heads of 64, fp32 -> 737,280 bytes per 16-token block.
STARTER = KVShape(30, 3, 64, 16, torch.float32)


def test_block_bytes_of_the_starter_shape():
    assert STARTER.bytes_per_token == 46_080
    assert STARTER.bytes_per_block == 737_280


def test_explicit_block_count_wins():
    assert num_blocks_for(EngineConfig(num_gpu_blocks=24), STARTER, CPU, 8192) == 24


def test_byte_budget_gives_whole_blocks():
    config = EngineConfig(kv_cache_memory_bytes=10 * 737_280 + 5)
    assert num_blocks_for(config, STARTER, CPU, 8192) == 10


def test_cpu_default_is_one_gib_capped_at_eight_contexts():
    assert num_blocks_for(EngineConfig(), STARTER, CPU, 8192) == CPU_DEFAULT_KV_BYTES // 737_280
    tiny = KVShape(2, 2, 16, 16, torch.float32)  # 4 KiB blocks: a gigabyte would be 262k
    assert num_blocks_for(EngineConfig(), tiny, CPU, 1024) == 8 * 1024 // 16


def test_a_budget_too_small_for_one_block_is_an_error():
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        num_blocks_for(EngineConfig(kv_cache_memory_bytes=1000), STARTER, CPU, 8192)
