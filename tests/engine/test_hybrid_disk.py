"""A hybrid model's chat reopened after a restart: the linear-attention state snapshots go
to the disk tier with the full-attention blocks, so the next turn computes only the new
message and less than a block, replying as the engine kept open; a damaged snapshot
file is recomputed with the same reply."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine
from tests.engine.test_hybrid_engine import (
    assert_all_free,
    folders,
    reply,
    user_text,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

__all__ = ["folders"]  # the hybrid engine tests' module fixture, shared


@pytest.fixture(scope="module")
def qwen35_dir(folders):
    """The dense tiny Qwen3.5 folder: the snapshots' disk path is the same for the MoE."""
    return folders["qwen35"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(tmp_path / "kv"))
    return tmp_path / "kv"


def engine_for(path, **fields) -> LLMEngine:
    fields = {"num_gpu_blocks": 128, "max_num_batched_tokens": 48, "kv_disk_bytes": 1 << 30,
              **fields}
    return LLMEngine(str(path), EngineConfig(device="cpu", **fields))


def closed_chat(path, turns: int = 3) -> tuple[list[dict], list[int]]:
    """A chat on an engine that is then closed; the next turn and its kept-open reply."""
    engine = engine_for(path)
    messages: list[dict] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": user_text(turn)})
        out = reply(engine, messages).outputs[0]
        messages.append({"role": "assistant", "content": out.text,
                         "token_ids": out.token_ids})
    engine.close()
    messages.append({"role": "user", "content": user_text(turns)})
    kept_open = reply(engine, messages).outputs[0].token_ids
    return messages, kept_open


def new_tokens(engine: LLMEngine, messages: list[dict]) -> int:
    """The next turn's prompt tokens after the history's prompt and reply."""
    history, prompt = engine.encode(messages[:-1]), engine.encode(messages)
    return len(prompt) - next(i for i, (a, b) in enumerate(zip(history, prompt,
                                                               strict=False)) if a != b)


def test_a_reopened_hybrid_chat_resumes_from_a_snapshot_on_disk(qwen35_dir, cache):
    messages, kept_open = closed_chat(qwen35_dir)
    assert any(cache.glob("*/1/*.kvb")), "the snapshots (group 1) were not saved"
    reopened = engine_for(qwen35_dir)
    out = reply(reopened, messages)
    m = out.metrics
    computed = m.num_prompt_tokens - m.num_cached_tokens
    new = new_tokens(reopened, messages)
    assert new <= computed < new + reopened.config.block_size
    assert m.num_disk_tokens == m.num_cached_tokens
    assert out.outputs[0].token_ids == kept_open
    assert reopened.kv_stats(with_blocks=False).disk.skipped_files == 0
    assert_all_free(reopened)


def test_a_damaged_snapshot_file_is_recomputed(qwen35_dir, cache):
    messages, kept_open = closed_chat(qwen35_dir)
    for path in cache.glob("*/1/*.kvb"):  # every snapshot: flip a byte of its payload
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    reopened = engine_for(qwen35_dir)
    out = reply(reopened, messages)
    # No snapshot to resume from: the whole prompt is computed, with the same reply.
    assert out.metrics.num_cached_tokens == 0
    assert out.outputs[0].token_ids == kept_open
    assert reopened.kv_stats(with_blocks=False).disk.skipped_files > 0
    assert_all_free(reopened)
