"""How the KV pool's bytes split between a global and a sliding group (group_blocks)."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVGroupSpec
from engine.runner.kv_cache import KVShape, group_blocks

# Gemma 3-like: 6 layers, one global per five sliding ones; a block of one layer = 1 KiB.
SHAPE = KVShape(6, 1, 16, 16, torch.float16)  # 2 * 1 * 16 * 2 B * 16 tokens = 1 KiB/layer
GROUPS = [KVGroupSpec((5,)), KVGroupSpec((0, 1, 2, 3, 4), 1024)]


def test_one_group_keeps_the_pool():
    assert group_blocks(EngineConfig(), SHAPE, 100, [KVGroupSpec(tuple(range(6)))]) == [100]


def test_the_sliding_group_gets_its_windows_and_the_global_group_the_rest():
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=512)
    # Per sequence: ceil((1024 + 512) / 16) + 1 = 97 blocks; 4 sequences: 388.
    counts = group_blocks(config, SHAPE, 2048, GROUPS)
    assert counts[1] == 4 * 97
    # Every byte left goes to the one global layer: 2048 * 6 - 388 * 5 layer-blocks.
    assert counts[0] == 2048 * 6 - 388 * 5
    assert counts[0] * 1 + counts[1] * 5 <= 2048 * 6


def test_a_small_pool_never_gives_the_sliding_group_more_than_before():
    config = EngineConfig(max_num_seqs=64)
    assert group_blocks(config, SHAPE, 64, GROUPS) == [64, 64]
