"""The models list on a hybrid model (Qwen3.5, Qwen3.5-MoE): the layer kinds it shows, a
mixture's total and active parameters, and a memory estimate that counts every expert and
the linear-attention state pool as the engine allocates them."""

from __future__ import annotations

import pytest

from desktop_app.dialogs.model_rows import format_parameters
from engine import EngineConfig, LLMEngine
from engine.loaders.catalog import model_info
from engine.runner.kv_cache import estimate_memory
from tests.engine.tiny_models import save_tiny_model, tiny_qwen35_config, tiny_qwen35_moe_config

CONFIGS = {"qwen3_5_text": tiny_qwen35_config, "qwen3_5_moe_text": tiny_qwen35_moe_config}


@pytest.fixture(scope="module", params=list(CONFIGS))
def qwen35_dir(request, tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("models") / request.param,
                           CONFIGS[request.param]())


def test_the_list_shows_the_layer_kinds(qwen35_dir):
    info = model_info(qwen35_dir)
    assert info.architecture == qwen35_dir.name
    assert info.layer_summary == "hybrid: 3 linear + 1 full layers"
    assert info.kv_layers == 1


def test_a_mixture_shows_its_total_and_active_parameters(qwen35_dir):
    info = model_info(qwen35_dir)
    if info.architecture == "qwen3_5_text":
        assert info.active_parameters is None
        return
    config = tiny_qwen35_moe_config()
    # Each layer's 8 experts of 3 matrices [32, 64]: a token reads 2 of them; the shared
    # expert and everything else always.
    per_layer = 3 * 32 * config.hidden_size
    idle = config.num_hidden_layers * per_layer * (8 - 2)
    assert info.active_parameters == info.num_parameters - idle
    assert format_parameters(info.num_parameters, info.active_parameters) == (
        f"MoE: {info.num_parameters}, {info.active_parameters} active")


@pytest.mark.parametrize("fields", [{}, {"kv_cache_memory_bytes": 64 << 20,
                                         "max_model_len": 2048}])
def test_the_estimate_counts_the_state_pool_the_engine_allocates(qwen35_dir, fields):
    config = EngineConfig(device="cpu", **fields)
    info = model_info(qwen35_dir)
    estimate = estimate_memory(info, config)
    engine = LLMEngine(str(qwen35_dir), config)
    memory = engine.memory_stats()
    assert estimate.state_bytes == engine.runner.state_pool_bytes == memory.state_pool_bytes > 0
    assert estimate.kv_bytes + engine.kv_cache.pools[0].bytes_per_block == memory.kv_pool_bytes
    # Every expert counts: the weights are all the parameters at float32.
    assert estimate.weights_bytes == info.num_parameters * 4 >= memory.weights_bytes
