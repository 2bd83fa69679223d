"""Quantized KV pools in every kind of KV the engine keeps, on tiny models: Gemma 3's
global and sliding groups, Qwen3.5's attention layers beside its linear ones, Gemma 4's
per-layer head sizes. Each group's pool takes the format's dtype and rows; preemption
(recompute and swap), copy-on-write of candidates' shared prompt and the shared-prefix
decode give the tokens the same format gives unpreempted."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from kernels.kv_format import format_named
from tests.engine.tiny_models import (
    save_tiny_model,
    tiny_gemma4_config,
    tiny_gemma_config,
    tiny_qwen35_config,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PREEMPTED = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
PROMPTS = [[random.Random(seed).randrange(256) for _ in range(150)] for seed in (7, 8, 9)]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("models")
    return {
        "gemma3": save_tiny_model(root / "gemma3", tiny_gemma_config(
            3, sliding_window=64, max_position_embeddings=4096)),
        "qwen35": save_tiny_model(root / "qwen35", tiny_qwen35_config()),
        "gemma4": save_tiny_model(root / "gemma4", tiny_gemma4_config()),
    }


def pools_hold_the_format(llm: LLM, name: str) -> None:
    fmt = format_named(name)
    runner = llm.engine.runner
    assert runner.kv_caches and all(c.dtype == fmt.storage for c in runner.kv_caches)
    for g, cache in enumerate(runner.kv_caches):
        _, head_size = runner.shape.heads(_kv_index(llm, runner.kv_groups[g].layers[0]))
        assert cache.shape[-1] == fmt.row_len(head_size)
    assert llm.memory_stats().kv_pool_bytes == sum(c.numel() * c.element_size()
                                                   for c in runner.kv_caches)


def _kv_index(llm: LLM, layer: int) -> int:
    """The KV layer index (KVShape.heads') of model layer ``layer``: linear layers keep
    no KV."""
    linear = set(llm.engine.runner.model.linear_layers())
    return layer - sum(1 for i in linear if i < layer)


def tokens(llm: LLM, prompts=PROMPTS, params=PREEMPTED) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("family", ["gemma3", "qwen35"])
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_preemption_over_quantized_groups_keeps_the_tokens(models, family, name):
    roomy = LLM(str(models[family]), num_gpu_blocks=256, kv_cache_dtype=name)
    pools_hold_the_format(roomy, name)
    expected = tokens(roomy)
    for host in (0, 64):
        # Sequences grow to 14 global blocks of 16 each in a pool of 24 (int4's blocks of
        # 32: 7 in 12; int8's of 64: 4 in 6): someone is preempted.
        tight = LLM(str(models[family]), num_gpu_blocks={"int4": 12, "int8": 6}[name],
                    max_num_batched_tokens=32,
                    num_host_blocks=host, kv_cache_dtype=name)
        kv = tight.engine.kv_cache
        swapped = []
        swap_out = kv.swap_out
        kv.swap_out = lambda seqs, f=swap_out, s=swapped: s.append(len(seqs)) or f(seqs)
        assert tokens(tight) == expected
        assert tight.engine.scheduler.num_preemptions > 0
        assert bool(swapped) == bool(host)


@pytest.mark.parametrize("name", ["int8", "fp8", "int4"])
def test_candidates_over_a_quantized_pool_equal_their_seeded_single_runs(models, name):
    """Three candidates share the prompt's blocks (copy-on-write of its partial block,
    the shared-prefix decode) and each equals its own seeded run."""
    llm = LLM(str(models["gemma3"]), num_gpu_blocks=128, max_num_batched_tokens=64,
              enable_prefix_caching=False, kv_cache_dtype=name)
    prompt = PROMPTS[0][:100]
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=40, ignore_eos=True)
    (out,) = llm.generate([prompt], params)
    for cand in out.outputs:
        alone = SamplingParams(temperature=1.0, seed=11 + cand.index, max_tokens=40,
                               ignore_eos=True)
        assert llm.generate([prompt], alone)[0].outputs[0].token_ids == cand.token_ids


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_gemma4_per_layer_heads_take_the_formats_rows(models, name):
    llm = LLM(str(models["gemma4"]), num_gpu_blocks=64, kv_cache_dtype=name)
    pools_hold_the_format(llm, name)
    shape = llm.engine.runner.shape
    assert len({shape.heads(i) for i in range(shape.num_layers)}) == 2  # 16- and 32-wide
    fmt = format_named(name)
    assert shape.bytes_per_token == sum(2 * nkv * fmt.row_bytes(hd) for nkv, hd in
                                        (shape.heads(i) for i in range(shape.num_layers)))
    # A prompt read in chunks and then its prefix found cached: the same greedy tokens.
    prompt = PROMPTS[1][:120]
    greedy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    first = tokens(llm, [prompt], greedy)
    again = tokens(llm, [prompt], greedy)
    assert first == again and len(first[0]) == 20
