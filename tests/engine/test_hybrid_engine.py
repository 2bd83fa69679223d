"""A tiny random Qwen3.5 (3 Gated DeltaNet layers + 1 full-attention layer), and the same
layers as a Qwen3.5-MoE (a folder, and a Q8_0 GGUF file of it, experts kept quantized),
through the whole engine: greedy equal to transformers; a 6-turn chat whose turns compute only the
new message plus at most a block (state snapshots at block boundaries), replying as with
prefix caching off; n=4 candidates equal their seeded single runs; recompute and swap
preemption equal an unpreempted run; every block and state slot free after a chat and
after an abort."""

from __future__ import annotations

import random

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM

from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.outputs import FinishedEvent
from tests.engine.engine_runs import run_to_end
from tests.engine.loaders.gguf.test_gguf_qwen35 import write_qwen35_gguf
from tests.engine.tiny_models import (
    calm_qwen35_weights,
    random_prompt,
    save_tiny_model,
    tiny_qwen35_config,
    tiny_qwen35_moe_config,
)

BLOCK = 16
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
PREEMPTED = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
PROMPTS = [random_prompt(seed, 120) for seed in (3, 4, 5)]

pytestmark = pytest.mark.usefixtures("single_torch_thread")


SOURCES = ["qwen35", "qwen35_moe", "qwen35_moe-q8_0"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("models")
    return {"qwen35": save_tiny_model(root / "qwen35", tiny_qwen35_config()),
            "qwen35_moe": save_tiny_model(root / "qwen35_moe", tiny_qwen35_moe_config(),
                                          init=calm_qwen35_weights)}


@pytest.fixture(scope="module", params=SOURCES)
def source(request, folders, tmp_path_factory):
    """(what the engine loads, the folder transformers loads)."""
    family, _, matrices = request.param.partition("-")
    folder = folders[family]
    if not matrices:
        return folder, folder
    mp = pytest.MonkeyPatch()
    mp.setenv("FOLIO_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    request.addfinalizer(mp.undo)
    path = tmp_path_factory.mktemp("files") / f"{request.param}.gguf"
    return write_qwen35_gguf(path, folder, Q[matrices.upper()]), folder


@pytest.fixture(scope="module")
def qwen35_dir(source):
    return source[0]


def engine_for(path, **fields) -> LLMEngine:
    fields = {"num_gpu_blocks": 128, "max_num_batched_tokens": 48, **fields}
    return LLMEngine(str(path), EngineConfig(device="cpu", **fields))


def assert_all_free(engine: LLMEngine) -> None:
    """No block of any group and no state slot held; nothing swapped out."""
    for manager in engine.kv_cache.managers:
        assert all(b.ref_count == 0 for b in manager.pool.blocks), manager
        assert not manager.pool.host_refs and not manager.tables
    state = engine.kv_cache.managers[-1]
    assert state.num_live == 0 and not state.reserved


def test_groups_and_greedy_equal_transformers(source):
    engine = engine_for(source[0])
    assert [(g.name, g.layers) for g in engine.kv_groups] == [
        ("global", (3,)), ("linear state", (0, 1, 2))]
    hf = AutoModelForCausalLM.from_pretrained(source[1], dtype=torch.float32).eval()
    prompt = PROMPTS[0]
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=24,
                               do_sample=False)[0, len(prompt):].tolist()
    engine.add_request(prompt, GREEDY, request_id="r")
    output = None
    while engine.has_unfinished_requests():
        for event in engine.step():
            if isinstance(event, FinishedEvent):
                output = event.output
    assert output is not None and list(output.outputs[0].token_ids) == expected
    assert_all_free(engine)


def user_text(turn: int) -> str:
    rng = random.Random(turn)
    return " ".join(rng.choice(["state", "delta", "chunk", "block", "turn"])
                    for _ in range(12))


def reply(engine: LLMEngine, messages: list[dict]):
    """The greedy reply to ``messages``, run to its end."""
    engine.add_request(messages, GREEDY)
    return run_to_end(engine)


def run_chat(engine: LLMEngine, turns: int) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Replies, and per turn (computed prompt tokens, tokens new since the last turn's
    prompt and reply)."""
    messages: list[dict] = []
    replies, computed = [], []
    previous = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": user_text(turn)})
        output = reply(engine, messages)
        prompt_len = len(output.prompt_token_ids)
        computed.append((prompt_len - output.metrics.num_cached_tokens, prompt_len - previous))
        answer = output.outputs[0]
        previous = prompt_len + len(answer.token_ids)
        messages.append({"role": "assistant", "content": answer.text,
                         "token_ids": answer.token_ids})
        replies.append(list(answer.token_ids))
    return replies, computed


def test_a_chat_computes_only_each_new_message(qwen35_dir):
    engine = engine_for(qwen35_dir)
    replies, computed = run_chat(engine, 6)
    block = engine.config.block_size  # the default's (int8's 64 on the native kernels)
    for turn, (done, new) in enumerate(computed[1:], start=2):
        # The new message, and what follows the last snapshot: the last reply token
        # (never computed) and less than a block before it.
        assert new <= done <= new + block, (turn, computed)
    assert_all_free(engine)
    cold = engine_for(qwen35_dir, enable_prefix_caching=False)
    cold_replies, cold_computed = run_chat(cold, 6)
    assert cold_replies == replies
    assert all(done > new + block for done, new in cold_computed[1:])
    assert_all_free(cold)


def test_candidates_equal_their_seeded_single_runs(qwen35_dir):
    llm = LLM(str(qwen35_dir), num_gpu_blocks=128, max_num_batched_tokens=40)
    prompt = random_prompt(6, 90)
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=20, ignore_eos=True)
    [together] = llm.generate([prompt], params)
    assert len({tuple(c.token_ids) for c in together.outputs}) > 1
    for cand in together.outputs:
        alone = SamplingParams(temperature=1.0, seed=11 + cand.index, max_tokens=20,
                               ignore_eos=True)
        assert llm.generate([prompt], alone)[0].outputs[0].token_ids == cand.token_ids
    assert_all_free(llm.engine)


@pytest.fixture(scope="module")
def unpreempted(qwen35_dir) -> list[list[int]]:
    roomy = LLM(str(qwen35_dir), num_gpu_blocks=128, enable_prefix_caching=False,
                block_size=BLOCK)
    return [o.outputs[0].token_ids for o in roomy.generate(PROMPTS, PREEMPTED)]


@pytest.mark.parametrize("num_host_blocks", [0, 32], ids=["recompute", "swap"])
def test_preemption_keeps_the_states_right(qwen35_dir, unpreempted, num_host_blocks):
    # Each sequence grows to 12 blocks in a pool of 20: someone is preempted.
    tight = LLM(str(qwen35_dir), num_gpu_blocks=20, max_num_batched_tokens=32,
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


def test_an_aborted_request_frees_its_slots(qwen35_dir):
    engine = engine_for(qwen35_dir)
    engine.add_request(random_prompt(8, 200), SamplingParams(n=3, max_tokens=50, seed=1),
                       request_id="long")
    for _ in range(6):  # past the prompt's chunks and the fork, into decoding
        engine.step()
    request = engine.scheduler.requests["long"]
    assert len(request.seqs) == 3 and engine.kv_cache.managers[-1].num_live == 3
    engine.abort("long")
    assert_all_free(engine)


def test_more_candidates_than_state_slots_is_refused_by_name(qwen35_dir):
    engine = engine_for(qwen35_dir)
    slots = engine.kv_cache.managers[-1].pool.num_blocks
    with pytest.raises(ValueError, match=r"SamplingParams\.n: .* state pool has"):
        engine.add_request([1, 2, 3], SamplingParams(n=slots + 1))
    assert not engine.has_unfinished_requests()


def test_memory_stats_name_the_expert_bytes(source, request):
    stats = LLM(str(source[0]), num_gpu_blocks=16).memory_stats()
    assert stats.state_pool_bytes > 0
    if "moe" in request.node.callspec.id:
        assert 0 < stats.expert_bytes < stats.weights_bytes
    else:
        assert stats.expert_bytes is None
