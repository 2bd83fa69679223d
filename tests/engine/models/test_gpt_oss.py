"""gpt-oss (engine/models/gpt_oss.py) against transformers' GptOssForCausalLM (float32,
eager attention with its sinks) through the paged KV cache (test_llama.py's
PagedHarness): chunked prefill past the sliding window, decode, mixed batches, greedy
generation; its router and clamped experts alone; the saved folder's fused experts; the
spec's checks."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from engine.models import SUPPORTED_ARCHITECTURES, build_model, checkpoint_shapes
from engine.models.gpt_oss import GptOssSpec, split_expert_shapes
from engine.models.moe import active_parameters
from tests.engine.models.test_llama import PagedHarness, hf_logits, random_tokens
from tests.engine.tiny_gpt_oss import WINDOW, gpt_oss_config, gpt_oss_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

ATOL = 1e-4


@pytest.fixture(scope="module")
def models():
    hf_model = gpt_oss_model()
    ours = build_model(hf_model.config)
    ours.load_weights(hf_model.state_dict().items())
    return hf_model, ours


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("chunk", [1, 16, 33])
def test_chunked_prefill_then_decode_matches_transformers(models, build_attention_metadata,
                                                          chunk, head_major):
    hf_model, ours = models
    harness = PagedHarness(ours, build_attention_metadata, seed=chunk, head_major=head_major)
    prompt = random_tokens(41, seed=1)  # five windows long
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


def test_router_and_experts_match_transformers(models):
    """One layer's MoE block alone: the softmax over the top-k biased logits and the
    clamped, biased SwiGLU experts, against GptOssMLP (with some activations past the
    clamp's limit)."""
    hf_model, ours = models
    hf_mlp, mlp = hf_model.model.layers[1].mlp, ours.layers[1].mlp
    x = 3.0 * torch.randn(23, 64, generator=torch.Generator().manual_seed(4))
    _, hf_scores, hf_ids = hf_mlp.router(x)
    weights, ids = mlp.gate(x)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_scores)
    gate_up = x @ hf_mlp.experts.gate_up_proj[0] + hf_mlp.experts.gate_up_proj_bias[0]
    assert (gate_up.abs() > hf_model.config.swiglu_limit).any()
    with torch.no_grad():
        expected, _ = hf_mlp(x[None])
    torch.testing.assert_close(mlp(x), expected[0], atol=1e-5, rtol=1e-5)


def test_layers_alternate_sliding_and_full(models):
    _, ours = models
    assert ours.layer_windows() == [WINDOW, None, WINDOW, None]
    assert all(layer.self_attn.sinks is not None for layer in ours.layers)


def test_checkpoint_names_are_the_saved_folders(tmp_path):
    hf_model = gpt_oss_model()
    hf_model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    shapes = {n: tuple(t.shape) for n, t in saved.items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in shapes  # fused in the file
    assert split_expert_shapes(shapes) == checkpoint_shapes(hf_model.config)
    from_folder = build_model(hf_model.config)
    from_folder.load_weights(saved.items())
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(from_folder.layers[0].mlp(x), hf_model.model.layers[0].mlp(
        x[None])[0][0], atol=1e-5, rtol=1e-5)


def test_spec_reads_the_config():
    spec = build_model(gpt_oss_config(), torch.float32, "meta").spec
    assert isinstance(spec, GptOssSpec)
    assert (spec.num_experts, spec.top_k, spec.window, spec.swiglu_limit) == (8, 2, WINDOW, 1.5)
    assert spec.qkv_bias and spec.o_bias and spec.sliding_window is None
    assert spec.rope_scaling["rope_type"] == "yarn"


def test_active_parameters_count_only_the_routed_experts():
    model = gpt_oss_model()
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    total = sum(p.numel() for p in model.parameters())
    per_expert = 64 * 2 * 32 + 2 * 32 + 32 * 64 + 64  # gate/up, their biases, down, bias
    expected = total - 4 * (8 - 2) * per_expert  # four layers, six experts idle in each
    assert active_parameters(shapes, model.config.to_dict()) == expected


@pytest.mark.parametrize(("field", "value", "complaint"), [
    ("num_experts_per_tok", 9, "num_experts_per_tok"),
    ("num_local_experts", 0, "num_local_experts"),
    ("swiglu_limit", -1.0, "swiglu_limit"),
    ("layer_types", ["sliding_attention"], "layer_types"),
])
def test_bad_settings_are_value_errors_naming_the_field(field, value, complaint):
    config = gpt_oss_config()
    setattr(config, field, value)
    with pytest.raises(ValueError, match=complaint):
        build_model(config, torch.float32, "meta")


def test_the_family_is_registered():
    assert "GptOssForCausalLM" in SUPPORTED_ARCHITECTURES
