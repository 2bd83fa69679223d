"""The quantized KV caches through the engine on the starter: teacher-forced next-token
distributions over a fixed 2,048-token text against the float16 cache (mean KL, the
issue's targets), greedy replies after ~1,100 words of context, and the pool's dtype and
bytes as the engine reports them."""

from __future__ import annotations

import pytest

import kernels.cpu
from engine import LLM, EngineConfig, SamplingParams
from engine.bench.kv_quality import mean_kl, teacher_forced_logprobs
from engine.bench.kv_text import QUESTIONS, TEXT, leading_paragraphs

pytestmark = pytest.mark.slow

TOKENS, BLOCK = 2048, 16
# The targets: mean KL of the next-token distributions against the float16 cache.
KL_TARGET = {"int8": 0.002, "int4": 0.02}


def starter(kv_cache_dtype: str, **fields) -> LLM:
    return LLM("starter", EngineConfig(kv_cache_dtype=kv_cache_dtype, device="cpu",
                                       max_model_len=4096, **fields))


@pytest.fixture(scope="module")
def kl_by_dtype():
    logprobs = {}
    for name in ("float16", "int8", "int4"):
        with starter(name, num_gpu_blocks=TOKENS // BLOCK + 1) as llm:  # int4: room to spare
            assert llm.engine.runner.shape.format.name == name
            ids = llm.tokenizer.encode(TEXT)[:TOKENS]
            assert len(ids) == TOKENS
            logprobs[name] = teacher_forced_logprobs(llm, ids)
    ref = logprobs.pop("float16")
    return {name: mean_kl(ref, lp) for name, lp in logprobs.items()}


def test_int8_teacher_forced_kl_against_float16_is_under_target(kl_by_dtype):
    assert 0 < kl_by_dtype["int8"] <= KL_TARGET["int8"]


def test_int4_teacher_forced_kl_against_float16_is_under_target(kl_by_dtype):
    """Measured 0.015 nats on the native kernels (keys per channel over 32-token blocks,
    kernels/kv_key_channels.py; the int4 rows before them: 0.042)."""
    assert 0 < kl_by_dtype["int4"] <= KL_TARGET["int4"]


def greedy_replies(name: str) -> list[list[int]]:
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    context = leading_paragraphs(1100)
    with starter(name) as llm:
        return [list(llm.chat([{"role": "user", "content": f"{context}\n\n{question}"}],
                              params).outputs[0].token_ids) for question in QUESTIONS]


@pytest.fixture(scope="module")
def int8_replies_equal() -> int:
    assert len(leading_paragraphs(1100).split()) >= 1100
    float16, int8 = greedy_replies("float16"), greedy_replies("int8")
    return sum(a == b for a, b in zip(float16, int8, strict=True))


@pytest.mark.skipif(not kernels.cpu.available(),
                    reason="the issue's bar is measured on the native kernels (folio bench "
                    "kv); the PyTorch path's arithmetic keeps 2 of these 5 replies")
def test_int8_greedy_replies_after_a_long_context_match_float16(int8_replies_equal):
    """The issue's 4 of 5, on the native kernels. Measured 4 with int8 keys around their
    block's centers (kernels/kv_key_centers.py): the fifth parts at its 29th token, where
    float16's two likeliest tokens are 0.0085 nats apart. int8 rows with a scale per token
    and head alone kept 3 (one more parted at its 2nd token, a 0.064-nat gap). These
    near-ties fall with the arithmetic's order: the PyTorch backend keeps 2 of 5 of the
    same format (teacher-forced KL 0.00008 there too)."""
    assert int8_replies_equal >= 4


def test_int8_greedy_replies_after_a_long_context_stay_near_float16(int8_replies_equal):
    """On any backend: a regression guard under the issue's bar (the PyTorch path
    measured 2 of 5)."""
    assert int8_replies_equal >= 2


@pytest.mark.parametrize("name,per_token", [("float16", 23_040), ("int8", 12_060),
                                            ("fp8", 11_880), ("int4", 6_300)])
def test_the_engine_reports_the_pools_format_and_bytes(name, per_token):
    with starter(name, num_gpu_blocks=8) as llm:
        stats = llm.memory_stats()
        assert (stats.kv_dtype, stats.kv_bytes_per_token) == (name, per_token)
        # The pool holds 9 blocks (with the null one) of the format's rows; int4's blocks
        # hold 32 tokens, int8's 64.
        block = {"int4": 32, "int8": 64}.get(name, BLOCK)
        assert stats.kv_pool_bytes == 9 * block * per_token
        kv = llm.kv_stats(with_blocks=False)
        assert kv.bytes_per_block == block * per_token
