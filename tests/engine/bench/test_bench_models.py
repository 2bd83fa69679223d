"""``folio bench models`` on a tiny model hosted twice (A and B): the rows and targets, and
the prefix cache each case finds (the timings of a tiny model say nothing)."""

from __future__ import annotations

import pytest
import torch

from engine.bench.models import bench_models
from engine.bench.setup import BenchContext, BenchSettings
from tests.engine.tiny_models import save_tiny_model


def test_models_bench_keeps_a_prefix_cache_across_a_switch(tmp_path):
    path = save_tiny_model(tmp_path / "tiny-llama")
    settings = BenchSettings(model=str(path), threads=1, reply_tokens=4, kv_blocks=128,
                             models_second="", models_repeats=1)
    threads = torch.get_num_threads()
    try:
        result = bench_models(BenchContext.create(settings))
    finally:
        torch.set_num_threads(threads)
    stay, switch, unloaded, cold_a, cold_b = result["rows"]
    # A's chat is in its cache after a turn on B, as without the switch; unloaded, it is not.
    assert stay["cached_tokens"] == switch["cached_tokens"] > 0
    assert unloaded["cached_tokens"] == 0
    for row in (cold_a, cold_b):
        assert row["ttft_ms"] > 0 and row["load_ms"] > 0
    assert [t["name"] for t in result["targets"]] == [
        "follow-up on model A after a turn on model B, TTFT / the same follow-up without "
        "the switch",
        "first request to model A not loaded: TTFT / its load time + its TTFT",
        "first request to model B not loaded: TTFT / its load time + its TTFT"]


def test_models_bench_settings_are_checked():
    with pytest.raises(ValueError, match="models_repeats"):
        BenchSettings(models_repeats=0)
    with pytest.raises(ValueError):
        BenchSettings(models_second="2b")
