"""Gemma 2 and Gemma 3 beyond the per-family harness of test_llama.py: what the spec reads
from the config, bad configs, and the whole engine on tiny Gemma folders against
transformers (greedy replies across the sliding window, a cached prefix, n candidates)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from engine import LLM, SamplingParams
from engine.models import build_model
from engine.models.gemma import FULL, SLIDING
from tests.engine.tiny_models import save_tiny_model, tiny_gemma_config

GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 256) for _ in range(length)]


PROMPT = prompt(0, 37)  # crosses the 16-token window twice


@pytest.fixture(scope="module", params=[2, 3], ids=["gemma2", "gemma3"])
def tiny_dir(request, tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("models") / f"gemma{request.param}",
                           tiny_gemma_config(request.param))


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    model.config._attn_implementation = "eager"
    return model


@torch.inference_mode()
def hf_greedy(model, ids: list[int], num_tokens: int) -> list[int]:
    cache = DynamicCache(config=model.config)
    inputs = torch.tensor([ids])
    out: list[int] = []
    for _ in range(num_tokens):
        logits = model(input_ids=inputs, cache=cache, use_cache=True).logits
        out.append(int(logits[0, -1].argmax()))
        inputs = torch.tensor([[out[-1]]])
    return out


def test_spec_reads_the_gemma2_quirks():
    spec = build_model(tiny_gemma_config(2), torch.float32, "meta").spec
    assert spec.layer_types == (SLIDING, FULL, SLIDING, FULL)  # alternating by default
    assert (spec.window, spec.attn_logit_softcap, spec.final_logit_softcap) == (16, 3.0, 8.0)
    assert spec.attn_scale == 16 ** -0.5 and spec.embed_scale == 64 ** 0.5
    assert spec.hidden_act == "gelu_pytorch_tanh" and not spec.qk_norm
    assert spec.max_context_len == 1024  # the window is attention's, not the context's


def test_spec_reads_the_gemma3_quirks():
    spec = build_model(tiny_gemma_config(3), torch.float32, "meta").spec
    assert spec.layer_types == (SLIDING, SLIDING, SLIDING, FULL)
    assert spec.qk_norm and spec.attn_logit_softcap is None and spec.final_logit_softcap is None
    assert spec.rope[SLIDING] == (10000.0, None)
    assert spec.rope[FULL] == (1000000.0, {"rope_type": "linear", "factor": 4.0})


@pytest.mark.parametrize(("field", "value", "words"), [
    ("layer_types", ["sliding_attention"] * 3, "layer_types"),
    ("layer_types", ["local"] * 4, "layer_types"),
    ("sliding_window", 0, "sliding_window"),
])
def test_bad_configs_name_the_field(field, value, words):
    config = tiny_gemma_config(2)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=words):
        build_model(config, torch.float32, "meta")


@pytest.mark.parametrize("chunk", [1, 7, 16, 33])
def test_greedy_replies_equal_transformers(tiny_dir, hf_model, chunk):
    llm = LLM(str(tiny_dir), num_gpu_blocks=64, max_num_batched_tokens=chunk,
              kv_cache_dtype="float16")  # equal to transformers' on the float16 cache
    [out] = llm.generate([PROMPT], GREEDY)
    assert out.outputs[0].token_ids == hf_greedy(hf_model, PROMPT, 40)


def test_a_cached_prefix_and_a_mixed_batch(tiny_dir, hf_model):
    llm = LLM(str(tiny_dir), num_gpu_blocks=128)
    [first] = llm.generate([PROMPT], GREEDY)
    follow_up = PROMPT + first.outputs[0].token_ids + [65, 66, 67]
    other = prompt(1, 23)
    second, third = llm.generate([follow_up, other], GREEDY)
    assert second.metrics.num_cached_tokens >= 64
    assert second.outputs[0].token_ids == hf_greedy(hf_model, follow_up, 40)
    assert third.outputs[0].token_ids == hf_greedy(hf_model, other, 40)


def test_candidates_equal_their_seeded_single_runs(tiny_dir):
    llm = LLM(str(tiny_dir), num_gpu_blocks=128)
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    [together] = llm.generate([PROMPT], params)
    for cand in together.outputs:
        alone = SamplingParams(temperature=1.0, seed=11 + cand.index, max_tokens=12,
                               ignore_eos=True)
        assert llm.generate([PROMPT], alone)[0].outputs[0].token_ids == cand.token_ids
