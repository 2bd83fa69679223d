"""KV groups through the whole engine, on a tiny Gemma 3 (three sliding layers with a
64-token window, one global layer): a 2,000-token chat holds only the window in the
sliding group after every step, frees every block of every group at the end, and
replies exactly as the same model with one pool for every layer (kv_groups=False);
candidates, preemption (recompute and swap) and the Triton kernels stay correct."""

from __future__ import annotations

import os
import random

import pytest
import torch

from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.cli import format_kv_stats
from engine.core.kv_cache_manager import KVCacheManager
from tests.engine.engine_runs import run_to_end
from tests.engine.tiny_models import save_tiny_model, tiny_gemma_config

WINDOW, BLOCK = 64, 16
GLOBAL, SLIDING = 0, 1
# The window's blocks (a window starting mid-block spans one more) and one block of room.
SLIDING_BOUND = -(-(WINDOW + BLOCK - 1) // BLOCK) + 1
GREEDY = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
PREEMPTED = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
PROMPTS = [[random.Random(seed).randrange(256) for _ in range(150)] for seed in (7, 8, 9)]

# Tiny tensors: one torch thread is several times faster on a shared machine.
pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    config = tiny_gemma_config(3, sliding_window=WINDOW, max_position_embeddings=4096)
    return save_tiny_model(tmp_path_factory.mktemp("models") / "gemma3_w64", config)


def user_text(turn: int) -> str:
    rng = random.Random(turn)
    words = ["paged", "window", "block", "cache", "token", "layer", "chat", "slide"]
    return " ".join(rng.choice(words) for _ in range(70))  # about 420 byte-level tokens


def engine_for(path, **fields) -> LLMEngine:
    fields = {"num_gpu_blocks": 256, "max_num_batched_tokens": 128, "block_size": BLOCK,
              **fields}
    return LLMEngine(str(path), EngineConfig(device="cpu", **fields))


def held(table: list[int], null: int) -> int:
    return sum(1 for b in table if b != null)


def run_chat(engine: LLMEngine, turns: int = 4, after_step=None,
             cached: list[int] | None = None) -> tuple[list[list[int]], int]:
    """A chat of ``turns`` turns, each reply spliced into the next prompt by its ids;
    returns the replies and the whole chat's length (``cached`` gets each turn's prefix
    hit)."""
    messages: list[dict] = []
    replies: list[list[int]] = []
    num_tokens = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": user_text(turn)})
        engine.add_request(messages, GREEDY)
        output = run_to_end(engine, after_step)
        if cached is not None:
            cached.append(output.metrics.num_cached_tokens)
        num_tokens = len(output.prompt_token_ids) + len(output.outputs[0].token_ids)
        reply = output.outputs[0]
        messages.append({"role": "assistant", "content": reply.text,
                         "token_ids": reply.token_ids})
        replies.append(reply.token_ids)
    return replies, num_tokens


def assert_all_free(engine: LLMEngine) -> None:
    stats = engine.kv_stats(with_blocks=False)
    assert stats.num_used == 0
    assert all(g.num_used == 0 and g.num_free == g.num_blocks for g in stats.groups)


def test_a_long_chat_holds_only_the_window_in_the_sliding_group(gemma3_dir):
    engine = engine_for(gemma3_dir)
    assert isinstance(engine.kv_cache, KVCacheManager)
    nulls = [p.null_id for p in engine.kv_cache.pools]
    assert [(g.name, g.layers) for g in engine.kv_groups] == [
        ("global", (3,)), ("sliding (window 64)", (0, 1, 2))]
    peak = {"global": 0, "sliding": 0}

    def check(engine: LLMEngine) -> None:
        stats = engine.kv_stats(with_blocks=False)
        seqs = [s for r in engine.scheduler.running for s in r.seqs]
        for seq in seqs:
            tables = engine.kv_cache.block_tables(seq)
            sliding = held(tables[SLIDING], nulls[SLIDING])
            assert sliding <= SLIDING_BOUND, (seq.num_computed_tokens, tables)
            assert held(tables[GLOBAL], nulls[GLOBAL]) == len(tables[GLOBAL])
            peak["sliding"] = max(peak["sliding"], sliding)
            peak["global"] = max(peak["global"], len(tables[GLOBAL]))
        global_used, sliding_used = (g.num_used for g in stats.groups)
        assert global_used == sum(len(engine.kv_cache.block_tables(s)[GLOBAL]) for s in seqs)
        assert sliding_used <= SLIDING_BOUND * len(seqs)

    hits: list[int] = []
    replies, num_tokens = run_chat(engine, after_step=check, cached=hits)
    assert num_tokens >= 2000
    # The global layer held the whole chat; each sliding layer at most the bound.
    # (The last sampled token is never computed: it has no slot.)
    assert peak["global"] == -(-(num_tokens - 1) // BLOCK)
    print(f"KV held after each step of a {num_tokens}-token chat: global up to "
          f"{peak['global']} blocks, sliding up to {peak['sliding']} (bound {SLIDING_BOUND})")
    assert 0 < peak["sliding"] <= SLIDING_BOUND
    assert_all_free(engine)

    single = engine_for(gemma3_dir, kv_groups=False)
    assert len(single.kv_groups) == 1
    single_hits: list[int] = []
    assert run_chat(single, cached=single_hits)[0] == replies
    # The sliding group kept the blocks before each turn's end cached: same hits.
    assert hits == single_hits and all(hit > 0 for hit in hits[1:])
    assert_all_free(single)


def test_an_aborted_request_frees_every_group(gemma3_dir):
    engine = engine_for(gemma3_dir)
    prompt = [random.Random(5).randrange(256) for _ in range(600)]
    engine.add_request(prompt, GREEDY, request_id="long")
    for _ in range(7):  # past the prompt's chunks, into decoding
        engine.step()
    seq = engine.scheduler.requests["long"].seqs[0]
    null = engine.kv_cache.pools[SLIDING].null_id
    assert seq.num_computed_tokens > 600
    assert held(engine.kv_cache.block_tables(seq)[SLIDING], null) <= SLIDING_BOUND
    text = format_kv_stats(engine.kv_stats())
    assert "\n  global: 1 layer," in text and "\n  sliding (window 64): 3 layers" in text
    engine.abort("long")
    assert_all_free(engine)


def test_candidates_equal_their_seeded_single_runs(gemma3_dir):
    # No prefix cache: a single run that found the prompt cached would prefill its tail
    # in another chunk, whose float32 rows can differ from the first run's in the last
    # bit, and the float16 pool's rounding turns such a bit into a different token.
    llm = LLM(str(gemma3_dir), num_gpu_blocks=128, max_num_batched_tokens=64,
              enable_prefix_caching=False)
    prompt = [random.Random(6).randrange(256) for _ in range(150)]  # past the window
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=40, ignore_eos=True)
    [together] = llm.generate([prompt], params)
    for cand in together.outputs:
        alone = SamplingParams(temperature=1.0, seed=11 + cand.index, max_tokens=40,
                               ignore_eos=True)
        assert llm.generate([prompt], alone)[0].outputs[0].token_ids == cand.token_ids
    assert_all_free(llm.engine)


@pytest.fixture(scope="module")
def unpreempted(gemma3_dir) -> list[list[int]]:
    roomy = LLM(str(gemma3_dir), num_gpu_blocks=256, kv_groups=False, block_size=BLOCK)
    return [o.outputs[0].token_ids for o in roomy.generate(PROMPTS, PREEMPTED)]


@pytest.mark.parametrize("num_host_blocks", [0, 64], ids=["recompute", "swap"])
def test_preemption_keeps_every_group_right(gemma3_dir, unpreempted, num_host_blocks):
    # Sequences grow to 14 global blocks each in a pool of 24: someone is preempted.
    tight = LLM(str(gemma3_dir), num_gpu_blocks=24, max_num_batched_tokens=32,
                num_host_blocks=num_host_blocks, block_size=BLOCK)
    kv = tight.engine.kv_cache
    swapped = []
    swap_out = kv.swap_out
    kv.swap_out = lambda seqs: swapped.append(len(seqs)) or swap_out(seqs)
    got = [o.outputs[0].token_ids for o in tight.generate(PROMPTS, PREEMPTED)]
    assert tight.engine.scheduler.num_preemptions > 0
    assert bool(swapped) == bool(num_host_blocks)
    assert got == unpreempted
    assert_all_free(tight.engine)


@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton kernels need CUDA or TRITON_INTERPRET=1",
)
@pytest.mark.parametrize("shared_prefix", ["0", "1"])
def test_triton_reads_the_groups_tables_as_the_reference(gemma3_dir, monkeypatch,
                                                         shared_prefix):
    """Sliding tables with released entries (block 0 in the metadata), candidates
    sharing blocks in both groups: the Triton kernels give the torch backend's tokens."""
    monkeypatch.setenv("FOLIO_SHARED_PREFIX", shared_prefix)
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=8, ignore_eos=True)
    prompt = [random.Random(10).randrange(256) for _ in range(100)]  # past the window
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(gemma3_dir), num_gpu_blocks=64, max_num_batched_tokens=48,
                  attention_backend=backend)
        [out] = llm.generate([prompt], params)
        results[backend] = [o.token_ids for o in out.outputs]
    assert results["triton"] == results["torch"]
