"""The whole engine on a tiny random Llama saved as a real model folder, against
transformers running the same weights."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import DynamicCache

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.core.scheduler import RequestTooLargeError
from engine.llm_engine import LLMEngine
from engine.loaders.base import FolioLoadError
from engine.outputs import FinishedEvent
from tests.engine.tiny_models import random_prompt
from tests.engine.tools.tool_models import scripted

PROMPT = random_prompt(0, 40)
GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
# Equal to transformers token for token on the CPU's float16 cache in 16-token blocks; the
# default int8 cache is held to float16's replies in tests/engine/test_kv_precision_engine.py.
F16 = "float16"


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], num_tokens: int) -> list[int]:
    cache = DynamicCache()
    ids = torch.tensor([prompt])
    out: list[int] = []
    for _ in range(num_tokens):
        logits = model(input_ids=ids, cache=cache, use_cache=True).logits
        token = int(logits[0, -1].argmax())
        out.append(token)
        ids = torch.tensor([[token]])
    return out


@pytest.mark.parametrize("chunk", [1, 7, 16, 33, 512])
def test_greedy_matches_transformers_with_chunked_prefill(tiny_dir, hf_model, chunk):
    llm = LLM(str(tiny_dir), num_gpu_blocks=64, max_num_batched_tokens=chunk, kv_cache_dtype=F16)
    [out] = llm.generate([PROMPT], GREEDY)
    assert out.outputs[0].token_ids == hf_greedy(hf_model, PROMPT, 32)
    assert out.outputs[0].finish_reason == "length"
    assert out.metrics.num_prompt_tokens == len(PROMPT)


def test_follow_up_turn_reuses_the_cached_prefix(llm, hf_model):
    [first] = llm.generate([PROMPT], GREEDY)
    follow_up = PROMPT + first.outputs[0].token_ids + [65, 66, 67, 68, 69]
    [second] = llm.generate([follow_up], GREEDY)
    # Every token the first turn computed is found again: its full blocks, and its
    # partial last block copied (its last reply token was never computed).
    assert second.metrics.num_cached_tokens == len(PROMPT) + 32 - 1
    assert second.outputs[0].token_ids == hf_greedy(hf_model, follow_up, 32)


def test_batch_mixing_prefill_and_decode(tiny_dir, hf_model):
    engine = LLMEngine(str(tiny_dir), EngineConfig(num_gpu_blocks=64, kv_cache_dtype=F16))
    other = random_prompt(1, 43)
    first = engine.add_request(PROMPT, GREEDY)
    done = {}
    for _ in range(3):  # the first request is now decoding
        engine.step()
    second = engine.add_request(other, GREEDY)
    mixed = engine.scheduler.schedule
    seen = []

    def spy():
        out = mixed()
        seen.append(sorted(item.num_new_tokens for item in out.scheduled))
        return out

    engine.scheduler.schedule = spy
    while engine.has_unfinished_requests():
        for event in engine.step():
            if isinstance(event, FinishedEvent):
                done[event.request_id] = event.output.outputs[0].token_ids
    assert seen[0] == [1, len(other)]  # one decode token and a whole prompt in one step
    assert done[first] == hf_greedy(hf_model, PROMPT, 32)
    assert done[second] == hf_greedy(hf_model, other, 32)


def test_candidates_share_the_prompt_and_match_single_runs(tiny_dir):
    engine = LLMEngine(str(tiny_dir), EngineConfig(num_gpu_blocks=64, kv_cache_dtype=F16))
    computed = []
    execute = engine.runner.execute

    def spy(out):
        computed.append(out.num_batched_tokens)
        return execute(out)

    engine.runner.execute = spy
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    request_id = engine.add_request(PROMPT, params)
    engine.step()  # the prefill, then the fork
    request = engine.scheduler.requests[request_id]
    assert len(request.seqs) == 4
    full_blocks = len(PROMPT) // 16
    tables = [engine.kv_cache.block_tables(seq)[0][:full_blocks] for seq in request.seqs]
    assert all(t == tables[0] for t in tables)
    pool = engine.kv_cache.pools[0]
    assert [pool.blocks[b].ref_count for b in tables[0]] == [4] * full_blocks
    result = None
    while result is None:
        for event in engine.step():
            if isinstance(event, FinishedEvent):
                result = event.output
    # The prompt was computed once; then each candidate computed its own tokens.
    assert sum(computed) == len(PROMPT) + 4 * (8 - 1)
    outputs = [o.token_ids for o in result.outputs]
    assert len({tuple(o) for o in outputs}) == 4
    for i, tokens in enumerate(outputs):
        alone = SamplingParams(temperature=1.0, seed=7 + i, max_tokens=8, ignore_eos=True)
        rid = engine.add_request(PROMPT, alone)
        res = None
        while res is None:
            for event in engine.step():
                if isinstance(event, FinishedEvent) and event.request_id == rid:
                    res = event.output
        assert res.outputs[0].token_ids == tokens


@pytest.mark.parametrize("host_blocks", [0, 64])
def test_preemption_in_a_small_pool_gives_the_large_pool_results(tiny_dir, host_blocks):
    prompts = [random_prompt(i, 20 + i) for i in range(6)]
    params = SamplingParams(max_tokens=150, temperature=0, ignore_eos=True)
    big = LLM(str(tiny_dir), num_gpu_blocks=256, kv_cache_dtype=F16)
    small = LLM(str(tiny_dir), num_gpu_blocks=24, num_host_blocks=host_blocks,
                kv_cache_dtype=F16)
    expected = [out.outputs[0].token_ids for out in big.generate(prompts, params)]
    got = [out.outputs[0].token_ids for out in small.generate(prompts, params)]
    assert small.engine.scheduler.num_preemptions > 0
    assert got == expected
    assert all(len(tokens) == 150 for tokens in got)
    assert small.kv_stats().num_used == 0


def test_bad_requests_get_clear_errors_and_the_engine_keeps_serving(tiny_dir, hf_model):
    llm = LLM(str(tiny_dir), num_gpu_blocks=64, max_model_len=64, kv_cache_dtype=F16)
    with pytest.raises(RequestTooLargeError, match="context holds 64"):
        llm.generate([list(range(100))], GREEDY)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 259\)"):
        llm.generate([[5, 9999]], GREEDY)
    with pytest.raises(ValueError, match="max_tokens"):
        llm.generate([PROMPT], SamplingParams(max_tokens=0))
    [out] = llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert out.outputs[0].token_ids == hf_greedy(hf_model, PROMPT, 8)
    tiny_pool = LLM(str(tiny_dir), num_gpu_blocks=2, kv_cache_dtype=F16)
    with pytest.raises(RequestTooLargeError, match="whole KV pool"):
        tiny_pool.generate([PROMPT], GREEDY)


def test_generation_stops_at_the_context_length(tiny_dir):
    llm = LLM(str(tiny_dir), num_gpu_blocks=64, max_model_len=48)
    [out] = llm.generate([PROMPT], GREEDY)
    assert out.outputs[0].finish_reason == "context"  # not max_tokens: the context is full
    assert len(out.outputs[0].token_ids) == 48 - len(PROMPT)


def test_missing_model_names_the_path(tmp_path):
    with pytest.raises(FolioLoadError, match="nowhere"):
        LLM(str(tmp_path / "nowhere"))


def test_stop_strings_cut_the_text(llm):
    [free] = llm.generate([PROMPT], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    text = free.outputs[0].text
    stop = text[5:8]
    assert stop and stop not in text[:5]
    [cut] = llm.generate([PROMPT], SamplingParams(max_tokens=32, temperature=0,
                                                  ignore_eos=True, stop=[stop]))
    assert cut.outputs[0].text == text[:text.index(stop)]
    assert cut.outputs[0].finish_reason == "stop"


def test_special_tokens_show_in_the_text_only_when_asked(tiny_dir):
    """What the server's tool parser needs: Llama's <|python_tag|> or Mistral's
    [TOOL_CALLS] are special tokens; the end-of-turn token stays out either way."""
    llm = LLM(str(tiny_dir), num_gpu_blocks=64)
    sampler = scripted(llm)
    sampler.script = llm.tokenizer.encode("a<|im_start|>b", add_special_tokens=False)
    [hidden] = llm.generate([PROMPT], SamplingParams(max_tokens=8))
    [shown] = llm.generate([PROMPT], SamplingParams(max_tokens=8, skip_special_tokens=False))
    assert (hidden.outputs[0].text, shown.outputs[0].text) == ("ab", "a<|im_start|>b")
    assert shown.outputs[0].finish_reason == "stop"  # on <|im_end|>, not shown


@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton kernels need CUDA or TRITON_INTERPRET=1",
)
@pytest.mark.parametrize("shared_prefix", ["0", "1"])
def test_triton_backend_gives_the_reference_backends_tokens(tiny_dir, monkeypatch, shared_prefix):
    monkeypatch.setenv("FOLIO_SHARED_PREFIX", shared_prefix)
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=10, ignore_eos=True)
    prompt = random_prompt(3, 70)  # four full blocks shared by the three candidates
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(tiny_dir), num_gpu_blocks=64, max_num_batched_tokens=33,
                  attention_backend=backend)
        assert llm.engine.runner.backend.name == backend
        [out] = llm.generate([prompt], params)
        results[backend] = [o.token_ids for o in out.outputs]
    assert results["triton"] == results["torch"]
