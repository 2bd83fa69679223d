"""Gemma 4 (text): what the spec reads from the config, configs refused by name, and the
whole engine on a tiny random Gemma 4 folder against transformers: greedy replies across
prefill chunkings, a chat whose earlier turns come from the prefix cache, n candidates,
and preemption by recompute and by swap."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma4Config, Gemma4ForConditionalGeneration

from engine import LLM, SamplingParams
from engine.loaders.catalog import model_info
from engine.models import build_model
from engine.models.gemma import FULL, SLIDING
from tests.engine.models.test_gemma import hf_greedy
from tests.engine.tiny_models import (
    byte_level_tokenizer,
    random_prompt,
    tiny_gemma4_config,
)

GREEDY = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
PROMPT = random_prompt(0, 37)  # crosses the 16-token window twice

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def save_gemma4(path, config, seed: int = 0):
    """A random Gemma 4 folder whose replies vary (peaked_weights' unit-scale embeddings
    collapse this model to one repeated token, which would hide any bug), with norms and
    layer scalars off one, so that a norm scaled by 1 + weight, or a scalar left out,
    changes the tokens."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0, 0.08, generator=generator)
            elif name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=generator))
        for i, layer in enumerate(model.model.layers):
            layer.layer_scalar.fill_(0.6 + 0.15 * i)
    model.save_pretrained(path, safe_serialization=True)
    byte_level_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory):
    return save_gemma4(tmp_path_factory.mktemp("models") / "gemma4", tiny_gemma4_config())


@pytest.fixture(scope="module")
def hf_model(gemma4_dir):
    model = AutoModelForCausalLM.from_pretrained(gemma4_dir, dtype=torch.float32).eval()
    model.config._attn_implementation = "eager"
    return model


def test_spec_reads_the_gemma4_changes():
    spec = build_model(tiny_gemma4_config(), torch.float32, "meta").spec
    assert spec.layer_types == (SLIDING, SLIDING, FULL) * 2 and spec.window == 16
    # Global layers: 32-wide heads over one KV head; sliding ones: the config's 16 and 2.
    assert spec.layer_heads == ((2, 16), (2, 16), (1, 32)) * 2
    # The last two layers read the K/V of the last earlier layer of their kind.
    assert spec.kv_source == (0, 1, 2, 3, 3, 2)
    assert spec.layer_intermediate == (128,) * 4 + (256,) * 2
    assert spec.k_eq_v and spec.ple_size == 8 and spec.final_logit_softcap == 30.0
    assert dict((kind, rest) for kind, *rest in spec.rope) == {
        FULL: [1_000_000.0, 0.25, 1.0], SLIDING: [10_000.0, 1.0, 1.0]}


def test_the_kv_cache_holds_only_layers_that_compute_kv(gemma4_dir):
    llm = LLM(str(gemma4_dir), num_gpu_blocks=32, kv_cache_dtype="float16")
    runner = llm.engine.runner
    # Layers 0, 1, 3 (sliding, 2 heads of 16) and 2 (global, 1 head of 32); 4 and 5 none.
    assert [g.layers for g in llm.engine.kv_groups] == [(2,), (0, 1, 3)]
    assert [tuple(c.shape[0:1]) + tuple(c.shape[-2:]) for c in runner.kv_caches] == [
        (1, 1, 32), (3, 2, 16)]


@pytest.mark.parametrize(("field", "value", "words"), [
    ("enable_moe_block", True, "enable_moe_block"),
    ("use_bidirectional_attention", "all", "use_bidirectional_attention"),
    ("num_kv_shared_layers", 6, "num_kv_shared_layers"),
])
def test_unsupported_configs_name_the_field(field, value, words):
    config = tiny_gemma4_config()
    setattr(config, field, value)
    with pytest.raises(ValueError, match=words):
        build_model(config, torch.float32, "meta")


@pytest.mark.parametrize("chunk", [1, 7, 33])
def test_greedy_replies_equal_transformers(gemma4_dir, hf_model, chunk):
    llm = LLM(str(gemma4_dir), num_gpu_blocks=64, max_num_batched_tokens=chunk,
              kv_cache_dtype="float16")  # equal to transformers' on the float16 cache
    [out] = llm.generate([PROMPT], GREEDY)
    assert out.outputs[0].token_ids == hf_greedy(hf_model, PROMPT, 30)
    assert len(set(out.outputs[0].token_ids)) > 10  # a reply that can show a difference


def test_a_chat_reuses_its_earlier_turns(gemma4_dir, hf_model):
    llm = LLM(str(gemma4_dir), num_gpu_blocks=128, kv_cache_dtype="float16")
    ids, previous = list(PROMPT), 0
    for turn in range(3):
        [out] = llm.generate([ids], GREEDY)
        reply = out.outputs[0].token_ids
        assert reply == hf_greedy(hf_model, ids, 30)
        if turn:
            # Everything but the partial last block of the earlier turns came from cache.
            assert out.metrics.num_cached_tokens >= previous - 16
        previous = len(ids) + len(reply)
        ids = ids + reply + random_prompt(turn + 1, 9)


def test_candidates_equal_their_seeded_single_runs(gemma4_dir):
    llm = LLM(str(gemma4_dir), num_gpu_blocks=128)
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    [together] = llm.generate([PROMPT], params)
    for cand in together.outputs:
        alone = SamplingParams(temperature=1.0, seed=11 + cand.index, max_tokens=12,
                               ignore_eos=True)
        assert llm.generate([PROMPT], alone)[0].outputs[0].token_ids == cand.token_ids


@pytest.mark.parametrize("num_host_blocks", [0, 32], ids=["recompute", "swap"])
def test_preemption_changes_no_token(gemma4_dir, num_host_blocks):
    prompts = [random_prompt(seed, 60) for seed in (7, 8, 9)]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    roomy = LLM(str(gemma4_dir), num_gpu_blocks=128, block_size=16)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    tight = LLM(str(gemma4_dir), num_gpu_blocks=10, max_num_batched_tokens=32,
                num_host_blocks=num_host_blocks, block_size=16)
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, params)]
    assert tight.engine.scheduler.num_preemptions > 0
    assert got == expected
    assert tight.engine.kv_stats(with_blocks=False).num_used == 0


def test_a_multimodal_checkpoint_loads_its_text_part(gemma4_dir, tmp_path):
    """Gemma4ForConditionalGeneration (as Google publishes Gemma 4): the vision tower is
    left out and the text weights reply as the text model they are."""
    text = AutoModelForCausalLM.from_pretrained(gemma4_dir, dtype=torch.float32)
    config = Gemma4Config(text_config=text.config.to_dict(), audio_config=None,
                          vision_config=dict(hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2,
                                             num_key_value_heads=2, head_dim=16))
    multimodal = Gemma4ForConditionalGeneration(config).eval()
    multimodal.model.language_model.load_state_dict(text.model.state_dict())
    folder = tmp_path / "gemma4-multimodal"
    multimodal.save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    info = model_info(folder)
    assert info.architecture == "gemma4_text" and info.num_layers == 6
    assert info.num_parameters == model_info(gemma4_dir).num_parameters  # text weights only
    replies = [LLM(str(source), num_gpu_blocks=32).generate([PROMPT], GREEDY)[0]
               .outputs[0].token_ids for source in (gemma4_dir, folder)]
    assert replies[0] == replies[1]
