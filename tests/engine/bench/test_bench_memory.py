"""``folio bench memory`` and ``folio bench 8b`` end to end on tiny models (each side in its
own process): what they report and which targets they can judge, never how fast or how big."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.bench import synthetic
from engine.bench.eight_b import DECODE_TARGET, LOADS_TARGET, bench_8b
from engine.bench.memory import bench_memory, gguf_tensor_bytes
from engine.bench.setup import BenchContext, BenchSettings
from tests.cpu_pool import CPU_KV_ITEM_BYTES
from tests.engine.tiny_models import save_tiny_model

LLAMA = importlib.util.find_spec("llama_cpp") is not None
TINY = synthetic.Shape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
                       intermediate=512, context=256)


@pytest.fixture()
def ctx_for(tmp_path):
    threads = torch.get_num_threads()

    def make(model: str) -> BenchContext:
        return BenchContext.create(BenchSettings(
            model=model, threads=1, reply_tokens=4, memory_context=512, memory_turns=1,
            eightb_prompt_tokens=8, eightb_tokens=3, eightb_rounds=2, eightb_timeout_s=300))

    yield make
    torch.set_num_threads(threads)


def test_memory_measures_each_folio_side_in_its_own_process(ctx_for, tmp_path):
    model = save_tiny_model(tmp_path / "tiny-llama")
    result = bench_memory(ctx_for(str(model)))
    rows = {row["side"]: row for row in result["rows"]}
    assert set(rows) == {"folio_stored", "folio_float32"}  # llama.cpp needs a GGUF file
    for row in rows.values():
        assert row["peak_rss_mib"] > row["weights_mib"] > 0
        # One 512-token context and the pool's null block (16 tokens): 2 layers x K, V x
        # 2 KV heads x 16 elements per token.
        assert row["kv_mib"] == round((512 + 16) * 2 * 2 * 2 * 16 * CPU_KV_ITEM_BYTES / 2**20, 1)
    assert result["targets"] == []  # no GGUF bytes, no llama.cpp: nothing to judge
    assert result["summary"]["gguf_tensor_bytes"] is None
    assert not [n for n in result["notes"] if n.startswith("folio")]


def test_8b_on_a_tiny_synthetic_file(ctx_for, tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(synthetic, "LLAMA3_8B", TINY)
    ctx = ctx_for("starter")
    result = bench_8b(ctx)
    assert result["notes"][0].startswith("model: ") and "written now" in result["notes"][0]
    assert not [n for n in result["notes"] if n.startswith("8b probe")], result["notes"]
    assert result["summary"]["rounds_done"] == 2
    folio = result["rows"][0]
    assert folio["side"] == "folio (stored)" and folio["tok_s"] > 0 and folio["weights_gib"]
    names = [t["name"] for t in result["targets"]]
    assert names == ([LOADS_TARGET, DECODE_TARGET] if LLAMA else [LOADS_TARGET])
    assert result["targets"][0]["met"]
    # The memory workload's denominator, on this file: every tensor's bytes.
    path = synthetic.synthetic_path(TINY)
    assert result["setup"]["model"] == str(path)
    assert gguf_tensor_bytes(path) == sum(synthetic.tensor_nbytes(d, k) for _, d, k in
                                          synthetic.tensor_plan(TINY, 49152))
