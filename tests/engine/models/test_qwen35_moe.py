"""Qwen3.5-MoE (engine/models/qwen35_moe.py): its spec read from transformers' config, its
checkpoint names those of the folders transformers saves, transformers 5's fused
in-memory experts loading to the same weights, and bad expert fields named. (Its replies
against transformers through the engine: tests/engine/test_hybrid_engine.py.)"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from engine.models import build_model, checkpoint_shapes
from engine.models.qwen35_moe import Qwen35MoeSpec
from tests.engine.tiny_models import calm_qwen35_weights, tiny_qwen35_moe_config


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_qwen35_moe_config()).eval()
    calm_qwen35_weights(model, 0)
    return model


def test_the_spec_reads_the_experts_and_the_hybrid_layers(hf_model):
    spec = build_model(hf_model.config, torch.float32, "meta").spec
    assert isinstance(spec, Qwen35MoeSpec)
    assert spec.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    experts = spec.experts
    assert (experts.num_experts, experts.top_k, experts.expert_size,
            experts.shared_expert_size) == (8, 2, 32, 64)
    assert experts.normalize_top_k  # always, as transformers' router does


def test_checkpoint_names_are_the_saved_folders_and_fused_experts_load_alike(hf_model,
                                                                              tmp_path):
    hf_model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert {n: tuple(t.shape) for n, t in saved.items()} == checkpoint_shapes(hf_model.config)
    assert "model.layers.0.mlp.shared_expert_gate.weight" in saved
    from_folder = build_model(hf_model.config)
    from_folder.load_weights(saved.items())
    fused = build_model(hf_model.config)
    state = hf_model.state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    fused.load_weights(state.items())
    for a, b in zip(from_folder.state_dict().values(), fused.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("field", "value", "complaint"), [
    ("num_experts_per_tok", 9, "num_experts_per_tok must be between 1 and num_experts"),
    ("num_experts", 0, "num_experts must be a positive integer"),
    ("shared_expert_intermediate_size", -4, "shared_expert_intermediate_size"),
])
def test_bad_expert_fields_are_named(field, value, complaint):
    config = tiny_qwen35_moe_config()
    setattr(config, field, value)
    with pytest.raises(ValueError, match=complaint):
        build_model(config, torch.float32, "meta")
