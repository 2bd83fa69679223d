"""EngineConfig and SamplingParams: defaults, and each bad field named in its ValueError."""

from __future__ import annotations

import math
import re

import pytest

from engine.config import MIN_BLOCK_SIZES, EngineConfig, default_block_size
from engine.sampling_params import SamplingParams


def test_engine_config_defaults() -> None:
    config = EngineConfig()
    assert config.block_size is None  # settled with the KV dtype (runner/device.py)
    assert config.num_gpu_blocks is None
    assert config.num_host_blocks == 0
    assert config.max_num_seqs == 64
    assert config.max_num_batched_tokens == 512
    assert config.enable_prefix_caching is True
    assert config.dtype is None and config.device is None  # auto: engine/runner/device.py
    assert config.weights == "stored" and config.gpu_memory_utilization is None
    assert config.preemption_mode == "recompute"
    assert config.cuda_graphs is True  # used only on CUDA with Triton (runner/cuda_graphs.py)
    assert config.warm_up is False  # measured: it cost more at load than it saved


def test_engine_config_swap_mode_follows_host_blocks() -> None:
    assert EngineConfig(num_host_blocks=8).preemption_mode == "swap"


@pytest.mark.parametrize(
    "field, value",
    [
        ("block_size", 0),
        ("block_size", 12),
        ("block_size", 128),
        ("num_gpu_blocks", 0),
        ("num_gpu_blocks", -3),
        ("kv_cache_memory_bytes", 0),
        ("kv_cache_memory_bytes", -1),
        ("gpu_memory_utilization", 0.0),
        ("gpu_memory_utilization", 1.5),
        ("gpu_memory_utilization", math.nan),
        ("num_host_blocks", -1),
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("max_model_len", 0),
        ("dtype", "float64"),
        ("dtype", "fp16"),
        ("attention_backend", "cuda"),
        ("device", "gpu"),
        ("device", "cuda:x"),
        ("device", 0),
        ("weights", "q4"),
        ("weights", None),
        ("num_threads", 0),
        ("cuda_graphs", 1),
        ("cuda_graphs", None),
        ("warm_up", "yes"),
        ("speculative", "draft:"),
        ("speculative", "draft: "),
        ("speculative", "mtp:"),
        ("num_speculative_tokens", 0),
        ("num_speculative_tokens", 65),
        ("num_speculative_tokens", 2.5),
    ],
)
def test_engine_config_rejects_bad_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^EngineConfig\.{field} must be "):
        EngineConfig(**{field: value})


@pytest.mark.parametrize(
    "field, value",
    [
        ("block_size", 8),
        ("block_size", 32),
        ("num_gpu_blocks", 1),
        ("kv_cache_memory_bytes", 1),
        ("gpu_memory_utilization", 1.0),
        ("num_host_blocks", 0),
        ("max_model_len", 1),
        ("dtype", "bfloat16"),
        ("dtype", None),
        ("device", "cuda:1"),
        ("device", "mps"),
        ("weights", "float32"),
        ("attention_backend", "triton"),
        ("attention_backend", "torch"),
        ("attention_backend", "cpu"),
        ("num_threads", 2),
    ],
)
def test_engine_config_accepts_edge_values(field: str, value: object) -> None:
    assert getattr(EngineConfig(**{field: value}), field) == value


def test_engine_config_error_shows_the_value() -> None:
    with pytest.raises(ValueError) as info:
        EngineConfig(block_size=12)
    assert str(info.value) == ("EngineConfig.block_size must be one of (8, 16, 32, 64) or "
                               "None, got 12")


def test_sampling_params_defaults() -> None:
    params = SamplingParams()
    assert (params.n, params.temperature, params.top_p, params.top_k) == (1, 1.0, 1.0, 0)
    assert (params.min_p, params.repetition_penalty, params.seed) == (0.0, 1.0, None)
    assert (params.max_tokens, params.stop, params.stop_token_ids) == (256, [], [])
    assert params.ignore_eos is False
    assert params.skip_special_tokens is True
    assert params.greedy is False
    assert SamplingParams(temperature=0.0).greedy is True


def test_sampling_params_single_stop_string_becomes_a_list() -> None:
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]


def test_sampling_params_copies_its_lists() -> None:
    stop_ids = [2, 3]
    params = SamplingParams(stop_token_ids=stop_ids)
    stop_ids.append(4)
    assert params.stop_token_ids == [2, 3]


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", 0),
        ("n", 2.0),
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_k", -1),
        ("top_k", 5.0),
        ("min_p", -0.1),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("seed", 1.5),
        ("seed", "7"),
        ("max_tokens", 0),
        ("max_tokens", 3.0),
        ("stop", [""]),
        ("stop", ["ok", 3]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [1, "2"]),
        ("skip_special_tokens", "no"),
        ("prediction", 3),
        ("prediction", [1, -2]),
        ("prediction", [1, "2"]),
    ],
)
def test_sampling_params_rejects_bad_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^SamplingParams\.{re.escape(field)} must be "):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", 8),
        ("temperature", 0.0),
        ("top_p", 1.0),
        ("top_k", 0),
        ("min_p", 1.0),
        ("repetition_penalty", 0.5),
        ("seed", 0),
        ("max_tokens", 1),
        ("stop_token_ids", [0]),
        ("prediction", "text"),
        ("prediction", [0, 5]),
    ],
)
def test_sampling_params_accepts_edge_values(field: str, value: object) -> None:
    assert getattr(SamplingParams(**{field: value}), field) == value


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: SamplingParams(temperature="hot"), "temperature"),
        (lambda: SamplingParams(n=True), "n"),
        (lambda: SamplingParams(max_tokens=1.5), "max_tokens"),
        (lambda: SamplingParams(seed="7"), "seed"),
        (lambda: EngineConfig(max_num_seqs="4"), "max_num_seqs"),
        (lambda: EngineConfig(gpu_memory_utilization="most"), "gpu_memory_utilization"),
    ],
)
def test_a_value_of_the_wrong_type_names_its_field(make, field):
    with pytest.raises(ValueError, match=rf"\.{field} must be an? (integer|number)"):
        make()


def test_cpu_activation_bits_are_8_or_16():
    assert EngineConfig().cpu_activation_bits == 16
    assert EngineConfig(cpu_activation_bits=8).cpu_activation_bits == 8
    with pytest.raises(ValueError, match="cpu_activation_bits"):
        EngineConfig(cpu_activation_bits=4)


def test_block_size_defaults_to_the_formats_least_and_refuses_less():
    """int4's keys need blocks of 32 tokens, int8's of 64 (a block's key parameters live
    in its rows); the other formats take the default 16. Without a format, the block size
    waits for the device's (tests/engine/runner/test_device_resolution.py)."""
    assert EngineConfig().block_size is None
    assert [default_block_size(n) for n in (None, "float16", "int8")] == [16, 16, 64]
    assert EngineConfig(kv_cache_dtype="fp8").block_size == 16
    assert EngineConfig(kv_cache_dtype="int8").block_size == 64
    assert EngineConfig(kv_cache_dtype="int4").block_size == 32
    assert EngineConfig(kv_cache_dtype="int4", block_size=64).block_size == 64
    with pytest.raises(ValueError, match=r"EngineConfig\.block_size must be >= 32 with "
                                         r"kv_cache_dtype 'int4'"):
        EngineConfig(kv_cache_dtype="int4", block_size=16)
    with pytest.raises(ValueError, match=r"EngineConfig\.block_size must be >= 64 with "
                                         r"kv_cache_dtype 'int8'"):
        EngineConfig(kv_cache_dtype="int8", block_size=32)


def test_the_least_block_sizes_are_the_formats():
    """MIN_BLOCK_SIZES (config imports no torch) is KVFormat.min_block_size."""
    from kernels.kv_format import format_named

    for name, least in MIN_BLOCK_SIZES.items():
        assert format_named(name).min_block_size == least
