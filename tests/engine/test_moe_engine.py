"""Mixtures of experts through the whole engine: tiny random OLMoE, Qwen3-MoE, Mixtral and
gpt-oss models, each as a Hugging Face folder and as a GGUF file (Q8_0 experts kept
quantized, the native CPU products; gpt-oss's MXFP4, dequantized on use), chatting two
turns (the second finding the first in the prefix cache and replying as a fresh run
would), four seeded candidates equal to their single runs, and preemption (recompute and
swap) changing no token."""

from __future__ import annotations

import random

import pytest
from gguf import GGMLQuantizationType as Q

from engine import LLM, SamplingParams
from tests.engine.loaders.gguf.test_gguf_gpt_oss import write_gpt_oss_gguf
from tests.engine.loaders.gguf.test_gguf_moe import write_moe_gguf
from tests.engine.tiny_moe import ALL_FAMILIES, GPT_OSS, save_moe_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
PROMPTS = [[random.Random(seed).randrange(256) for _ in range(70)] for seed in (7, 8, 9)]


SOURCES = [(f, kind) for f in ALL_FAMILIES for kind in ("hf", "gguf")]


@pytest.fixture(scope="module", params=SOURCES, ids=lambda p: f"{p[0]}-{p[1]}")
def source(request, tmp_path_factory, monkeypatch_module) -> str:
    family, kind = request.param
    folder = tmp_path_factory.mktemp(family)
    model = save_moe_model(folder, family)
    if kind == "hf":
        return str(folder)
    path = folder / f"{family}.gguf"
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    if family == GPT_OSS:  # its experts in MXFP4, as the released files
        write_gpt_oss_gguf(path, model.config, state)
    else:
        write_moe_gguf(path, family, model.config, state, Q.Q8_0)
    return str(path)


@pytest.fixture(scope="module")
def monkeypatch_module(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("FOLIO_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    yield mp
    mp.undo()


def test_the_second_turn_reuses_the_first_from_the_prefix_cache(source):
    llm = LLM(source, num_gpu_blocks=64)
    messages = [{"role": "user", "content": "Hello, who are you today?"}]
    first = llm.chat(messages, GREEDY).outputs[0]
    messages += [{"role": "assistant", "content": first.text, "token_ids": first.token_ids},
                 {"role": "user", "content": "And what do you do?"}]
    second = llm.chat(messages, GREEDY)
    assert second.metrics.num_cached_tokens >= 16
    fresh = LLM(source, num_gpu_blocks=64, enable_prefix_caching=False)
    assert fresh.chat(messages, GREEDY).outputs[0].token_ids == second.outputs[0].token_ids


def test_candidates_equal_their_seeded_single_runs(source):
    llm = LLM(source, num_gpu_blocks=64)
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=16, ignore_eos=True)
    [together] = llm.generate([PROMPTS[0]], params)
    assert len({tuple(c.token_ids) for c in together.outputs}) > 1
    for cand in together.outputs:
        alone = SamplingParams(temperature=1.0, seed=11 + cand.index, max_tokens=16,
                               ignore_eos=True)
        assert llm.generate([PROMPTS[0]], alone)[0].outputs[0].token_ids == cand.token_ids


@pytest.mark.parametrize("num_host_blocks", [0, 32], ids=["recompute", "swap"])
def test_preemption_changes_no_token(source, num_host_blocks):
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    roomy = LLM(source, num_gpu_blocks=64, block_size=16)
    expected = [o.outputs[0].token_ids for o in roomy.generate(PROMPTS, params)]
    # Each sequence grows to 7 blocks of 16 in a pool of 12: someone is preempted.
    tight = LLM(source, num_gpu_blocks=12, max_num_batched_tokens=32,
                num_host_blocks=num_host_blocks, block_size=16)
    got = [o.outputs[0].token_ids for o in tight.generate(PROMPTS, params)]
    assert tight.engine.scheduler.num_preemptions > 0
    assert got == expected


def test_memory_stats_name_the_expert_bytes(source, tmp_path):
    from tests.engine.tiny_models import save_tiny_model

    stats = LLM(source, num_gpu_blocks=16).memory_stats()
    assert 0 < stats.expert_bytes < stats.weights_bytes
    dense = LLM(str(save_tiny_model(tmp_path / "dense")), num_gpu_blocks=16)
    assert dense.memory_stats().expert_bytes is None
