"""The models list on a hybrid model: the layer kinds it shows, and a memory estimate
that counts the linear-attention state pool as the engine allocates it."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine
from engine.loaders.catalog import model_info
from engine.runner.kv_cache import estimate_memory
from tests.engine.tiny_models import save_tiny_model, tiny_qwen35_config


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("models") / "qwen35", tiny_qwen35_config())


def test_the_list_shows_the_layer_kinds(qwen35_dir):
    info = model_info(qwen35_dir)
    assert info.architecture == "qwen3_5_text"
    assert info.layer_summary == "hybrid: 3 linear + 1 full layers"
    assert info.kv_layers == 1


@pytest.mark.parametrize("fields", [{}, {"kv_cache_memory_bytes": 64 << 20,
                                         "max_model_len": 2048}])
def test_the_estimate_counts_the_state_pool_the_engine_allocates(qwen35_dir, fields):
    config = EngineConfig(device="cpu", **fields)
    estimate = estimate_memory(model_info(qwen35_dir), config)
    engine = LLMEngine(str(qwen35_dir), config)
    memory = engine.memory_stats()
    assert estimate.state_bytes == engine.runner.state_pool_bytes == memory.state_pool_bytes > 0
    assert estimate.kv_bytes + engine.kv_cache.pools[0].bytes_per_block == memory.kv_pool_bytes
