"""gpt-oss (engine/models/gpt_oss.py) against transformers' GptOssForCausalLM (float32,
eager attention with its sinks): its router and clamped experts alone; the saved
folder's fused experts; the spec's checks. Chunked prefill past the sliding window,
decode, mixed batches and greedy generation through the paged KV cache are
test_moe_decoder.py's, for every mixture family."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from engine.models import SUPPORTED_ARCHITECTURES, build_model, checkpoint_shapes
from engine.models.experts import active_parameters
from engine.models.gpt_oss import GptOssSpec, split_expert_shapes
from tests.engine.tiny_moe import GPT_OSS, WINDOW, moe_config, moe_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def models():
    hf_model = moe_model(GPT_OSS)
    ours = build_model(hf_model.config)
    ours.load_weights(hf_model.state_dict().items())
    return hf_model, ours


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
    hf_model = moe_model(GPT_OSS)
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
    spec = build_model(moe_config(GPT_OSS), torch.float32, "meta").spec
    assert isinstance(spec, GptOssSpec)
    assert (spec.num_experts, spec.top_k, spec.window, spec.swiglu_limit) == (8, 2, WINDOW, 1.5)
    assert spec.qkv_bias and spec.o_bias and spec.sliding_window is None
    assert spec.rope_scaling["rope_type"] == "yarn"


def test_active_parameters_count_only_the_routed_experts():
    model = moe_model(GPT_OSS)
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
    config = moe_config(GPT_OSS)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=complaint):
        build_model(config, torch.float32, "meta")


def test_the_family_is_registered():
    assert "GptOssForCausalLM" in SUPPORTED_ARCHITECTURES
