"""OLMoE, Qwen3-MoE and Mixtral (engine/models/moe_decoder.py) and gpt-oss
(engine/models/gpt_oss.py) against transformers' OlmoeForCausalLM, Qwen3MoeForCausalLM,
MixtralForCausalLM and GptOssForCausalLM through the paged KV cache (test_llama.py's
PagedHarness): chunked prefill (past gpt-oss's sliding window), decode steps, mixed
batches, greedy generation; for moe_decoder.py's families the checkpoint names of the saved
folders, and the spec's checks (gpt-oss's own are test_gpt_oss.py's)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from engine.models import SUPPORTED_ARCHITECTURES, build_model, checkpoint_shapes
from engine.models.experts import active_parameters
from engine.models.moe_decoder import MoESpec
from tests.engine.models.test_llama import PagedHarness, hf_logits, random_tokens
from tests.engine.tiny_moe import ALL_FAMILIES, FAMILIES, moe_config, moe_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

ATOL = 1e-4


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module", params=ALL_FAMILIES)
def models(request: pytest.FixtureRequest):
    hf_model = moe_model(request.param)
    ours = build_model(hf_model.config)
    ours.load_weights(hf_model.state_dict().items())
    return hf_model, ours


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("chunk", [1, 16, 33])
def test_chunked_prefill_then_decode_matches_transformers(models, build_attention_metadata,
                                                          chunk, head_major):
    hf_model, ours = models
    harness = PagedHarness(ours, build_attention_metadata, seed=chunk, head_major=head_major)
    prompt = random_tokens(41, seed=1)  # five of gpt-oss's windows long
    logits = []
    for start in range(0, len(prompt), chunk):
        logits += harness.step([("a", prompt[start:start + chunk])])
    tokens = list(prompt)
    for _ in range(8):
        tokens.append(int(logits[-1][-1].argmax()))
        logits += harness.step([("a", tokens[-1:])])
    torch.testing.assert_close(torch.cat(logits), hf_logits(hf_model, tokens), atol=ATOL,
                               rtol=0)


def test_mixed_batch_matches_transformers(models, build_attention_metadata):
    hf_model, ours = models
    harness = PagedHarness(ours, build_attention_metadata, seed=3)
    prompts = {"a": random_tokens(30, 2), "b": random_tokens(9, 3)}
    harness.step([("a", prompts["a"][:20])])
    # One step: a's last prefill chunk beside b's whole prompt.
    a_rest, b_all = harness.step([("a", prompts["a"][20:]), ("b", prompts["b"])])
    torch.testing.assert_close(a_rest, hf_logits(hf_model, prompts["a"])[20:], atol=ATOL,
                               rtol=0)
    torch.testing.assert_close(b_all, hf_logits(hf_model, prompts["b"]), atol=ATOL, rtol=0)


def test_greedy_generation_matches_transformers(models, build_attention_metadata):
    hf_model, ours = models
    harness = PagedHarness(ours, build_attention_metadata, seed=5)
    prompt = random_tokens(12, seed=7)
    logits = harness.step([("a", prompt)])[0]
    tokens = list(prompt)
    for _ in range(20):
        tokens.append(int(logits[-1].argmax()))
        logits = harness.step([("a", tokens[-1:])])[0]
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=20,
                                     do_sample=False)[0].tolist()
    assert tokens == expected


def test_checkpoint_names_are_the_saved_folders(family, tmp_path):
    hf_model = moe_model(family)
    hf_model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    shapes = checkpoint_shapes(hf_model.config)
    assert {n: tuple(t.shape) for n, t in saved.items()} == shapes
    # The folder's per-expert matrices load to the same model as the fused state dict.
    from_folder = build_model(hf_model.config)
    from_folder.load_weights(saved.items())
    fused = build_model(hf_model.config)
    fused.load_weights(hf_model.state_dict().items())
    x = torch.tensor(random_tokens(6, seed=8))
    assert torch.equal(from_folder.embed_tokens(x), fused.embed_tokens(x))
    for a, b in zip(from_folder.state_dict().values(), fused.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)


def test_spec_reads_each_family():
    olmoe = build_model(moe_config("olmoe")).spec
    qwen = build_model(moe_config("qwen3_moe")).spec
    mixtral = build_model(moe_config("mixtral", norm_topk_prob=False)).spec
    assert isinstance(olmoe, MoESpec)
    assert (olmoe.num_experts, olmoe.top_k, olmoe.normalize_top_k, olmoe.clip_qkv) == (
        8, 2, False, 2.0)
    assert (qwen.expert_size, qwen.dense_layers, qwen.normalize_top_k, qwen.qk_norm) == (
        32, (1,), True, True)
    assert mixtral.normalize_top_k and mixtral.expert_size == 48
    sparse = build_model(moe_config("qwen3_moe", mlp_only_layers=[],
                                    decoder_sparse_step=2)).spec
    assert sparse.dense_layers == (0,)


def test_active_parameters_count_only_the_routed_experts():
    model = moe_model("olmoe")
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    total = sum(p.numel() for p in model.parameters())
    per_expert = 3 * 64 * 48
    expected = total - 2 * (8 - 2) * per_expert  # two layers, six experts idle in each
    # transformers' fused names, the folders' per-expert ones, GGUF's stacked ones.
    assert active_parameters(shapes, model.config.to_dict()) == expected
    assert active_parameters(checkpoint_shapes(model.config), model.config.to_dict()) == (
        expected)
    gguf = {"blk.0.ffn_up_exps.weight": (8, 48, 64), "blk.0.attn_q.weight": (64, 64)}
    assert active_parameters(gguf, {"num_experts": 8, "num_experts_per_tok": 2}) == (
        2 * 48 * 64 + 64 * 64)
    assert active_parameters(gguf, {}) is None


@pytest.mark.parametrize(("field", "value", "complaint"), [
    ("num_experts_per_tok", 9, "num_experts_per_tok"),
    ("num_experts_per_tok", 0, "num_experts_per_tok"),
    ("clip_qkv", -1.0, "clip_qkv"),
    ("hidden_act", "gelu", "hidden_act"),
])
def test_bad_settings_are_value_errors_naming_the_field(field, value, complaint):
    config = moe_config("olmoe")
    setattr(config, field, value)
    with pytest.raises(ValueError, match=complaint):
        build_model(config, torch.float32, "meta")


def test_the_families_are_registered():
    for name in ("OlmoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"):
        assert name in SUPPORTED_ARCHITECTURES
