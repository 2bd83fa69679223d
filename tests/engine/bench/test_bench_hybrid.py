"""``folio bench chat`` on a tiny random Qwen3.5: turns 2 on compute only what is new
(the state snapshots at block boundaries), and the summary carries the snapshot
figures."""

from __future__ import annotations

import pytest
import torch

from engine.bench.chat import bench_chat
from engine.bench.setup import BenchContext, BenchSettings
from tests.cpu_pool import CPU_BLOCK_SIZE, cpu_kv_bytes_per_token
from tests.engine.tiny_models import save_tiny_model, tiny_qwen35_config


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("models") / "qwen35", tiny_qwen35_config())
    threads = torch.get_num_threads()
    settings = BenchSettings(model=str(path), threads=1, turns=4, chat_repeats=1,
                             user_tokens=40, reply_tokens=8, kv_blocks=256)
    yield BenchContext.create(settings)
    torch.set_num_threads(threads)


def test_chat_on_a_hybrid_model_computes_only_the_new_tokens(ctx):
    result = bench_chat(ctx)
    targets = {t["name"]: t for t in result["targets"]}
    ratio = targets["Folio computed prompt tokens / new tokens, turns 2-4"]
    assert 1.0 <= ratio["value"] <= 1.3 and ratio["met"]
    summary = result["summary"]
    # (No reply comparison: this tiny model samples its end-of-sequence token, which Folio's
    # ignore_eos keeps and transformers' baseline suppresses.)
    assert summary["snapshot_every_blocks"] == 1
    # 3 linear layers: conv windows (3 x 128 channels: q, k, v x 4 bytes) and 4 x 16 x 16
    # float32 states; the full layer's KV: a default block of 2 heads of 16 elements.
    slot = 3 * (128 * 3 * 4 + 4 * 16 * 16 * 4)
    assert summary["state_slot_bytes"] == slot
    assert summary["snapshot_bytes_per_block / kv_bytes_per_block"] == round(
        slot / (CPU_BLOCK_SIZE * cpu_kv_bytes_per_token(1, 2, 16)), 3)
    assert summary["snapshot_copy_ms"] > 0 and summary["turn1_prefill_ms_per_block"] > 0
