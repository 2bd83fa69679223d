"""The disk tier over quantized KV pools: blocks are stored as the pool holds them, the
format named in the group fingerprint, so a chat reopened with the same kv_cache_dtype
is warm (its blocks read from disk) and replies as the engine kept open, while an engine
with another dtype never reads those files (it recomputes, and replies as itself)."""

from __future__ import annotations

import pytest

from engine import LLM, EngineConfig
from tests.engine.test_disk_tier_engine import GREEDY, ON, chat, next_turn

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_KV_CACHE_DIR", str(tmp_path / "kv"))
    return tmp_path / "kv"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.engine.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


def new_llm(model, kv_cache_dtype: str) -> LLM:
    return LLM(str(model), EngineConfig(device="cpu", weights="float32", num_gpu_blocks=64,
                                        kv_disk_bytes=ON, kv_cache_dtype=kv_cache_dtype))


def disk_hits(llm: LLM, messages: list[dict]):
    out = llm.chat(next_turn(messages), GREEDY)
    return out, out.metrics.num_disk_tokens


@pytest.mark.parametrize("kv_dtype,other", [("int8", "float16"), ("int4", "int8"),
                                            ("fp8", "int8"), ("float16", "int8")])
def test_a_reopened_chat_is_warm_in_its_own_format_and_cold_in_another(tiny, cache,
                                                                      kv_dtype, other):
    first = new_llm(tiny, kv_dtype)
    messages, _ = chat(first, 6)
    kept_open = first.chat(next_turn(messages), GREEDY)
    first.close()
    assert any(cache.rglob("*.kvb"))

    # Another format: the files are never read; its reply is its own format's.
    foreign = new_llm(tiny, other)
    out, hits = disk_hits(foreign, messages)
    assert hits == 0 and out.metrics.num_cached_tokens == 0
    assert foreign.kv_stats(with_blocks=False).disk.hit_blocks == 0
    foreign.close()

    reopened = new_llm(tiny, kv_dtype)
    out, hits = disk_hits(reopened, messages)
    bs = reopened.engine.config.block_size  # 16, int4's 32
    full_blocks = (out.metrics.num_prompt_tokens - 1) // bs * bs
    assert hits == out.metrics.num_cached_tokens == full_blocks > 0
    assert out.outputs[0].token_ids == kept_open.outputs[0].token_ids
    assert reopened.kv_stats(with_blocks=False).disk.skipped_files == 0
    reopened.close()


def test_the_fingerprint_names_a_quantized_format_and_keeps_float_pools(tiny, cache,
                                                                       monkeypatch):
    """Float pools keep the fingerprint they had before the formats (their dtype's
    string), so files a float16 cache wrote stay readable; a quantized one is named, int4
    with its keys per channel and int8 with its keys around their block's centers (files
    of their earlier per-token key rows are never read)."""
    from engine import build

    seen = []
    real = build.fingerprint
    monkeypatch.setattr(build, "fingerprint",
                        lambda model, *rest: seen.append(model) or real(model, *rest))
    for name, tag in [("float16", "torch.float16"), ("int8", "int8/keys-around-centers"),
                      ("fp8", "fp8"), ("int4", "int4/keys-per-channel")]:
        new_llm(tiny, name).close()
        assert seen[-1][2] == tag
