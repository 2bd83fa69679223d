"""Mixtures of experts in the models catalog: every expert counted in the parameters and
the memory estimate (all must be resident or mapped), and what one token reads as the
active parameters, from a folder's and a GGUF file's headers alike."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q

from engine.config import EngineConfig
from engine.loaders.catalog import model_info
from engine.runner.kv_cache import estimate_memory
from tests.engine.loaders.gguf.test_gguf_moe import write_moe_gguf
from tests.engine.tiny_moe import FAMILIES, save_moe_model


@pytest.mark.parametrize("family", FAMILIES)
def test_folder_and_file_count_every_expert_and_the_active_ones(family, tmp_path):
    model = save_moe_model(tmp_path, family)
    config = model.config
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    active = total - experts + experts * config.num_experts_per_tok // 8
    folder = model_info(tmp_path)
    assert (folder.num_parameters, folder.active_parameters) == (total, active)
    path = tmp_path / "m.gguf"
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    write_moe_gguf(path, family, config, state, Q.Q8_0)
    file = model_info(path)
    assert (file.num_parameters, file.active_parameters) == (total, active)
    # The estimate holds every expert: the file as mapped, or all of them in float32.
    dense = estimate_memory(folder, EngineConfig(device="cpu", weights="float32"))
    assert dense.weights_bytes == 4 * total
    assert estimate_memory(file, EngineConfig(device="cpu")).weights_bytes == (
        path.stat().st_size)


def test_a_dense_model_has_no_active_count(tmp_path):
    from tests.engine.tiny_models import save_tiny_model

    assert model_info(save_tiny_model(tmp_path / "dense")).active_parameters is None


def test_gpt_oss_folder_counts_every_expert_and_the_active_ones(tmp_path):
    from tests.engine.loaders.gguf.test_gguf_gpt_oss import write_gpt_oss_gguf
    from tests.engine.tiny_moe import GPT_OSS, save_moe_model

    model = save_moe_model(tmp_path, GPT_OSS)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    active = total - experts + experts * 2 // 8
    info = model_info(tmp_path)
    assert (info.num_parameters, info.active_parameters) == (total, active)
    path = tmp_path / "m.gguf"
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    write_gpt_oss_gguf(path, model.config, state)
    file = model_info(path)
    assert (file.num_parameters, file.active_parameters) == (total, active)
    assert estimate_memory(file, EngineConfig(device="cpu")).weights_bytes == (
        path.stat().st_size)


def test_gpt_oss_20b_shows_as_the_models_dialog_expects():
    """openai/gpt-oss-20b's shapes (transformers' defaults are the 120b's but for the
    layers and experts): 20.9B parameters, 4.2B read per token by the catalog's one rule
    for every family (OLMoE's 1.3B too), which counts the input embedding's matrix as
    read; OpenAI's model card quotes 3.6B active, the same less that matrix (0.58B)."""
    import torch
    import transformers

    from desktop_app.dialogs.model_rows import format_parameters
    from engine.models.experts import active_parameters

    config = transformers.GptOssConfig(num_hidden_layers=24, num_local_experts=32)
    with torch.device("meta"):
        model = transformers.GptOssForCausalLM(config)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    total = sum(p.numel() for p in model.parameters())
    assert format_parameters(total, active_parameters(shapes, config.to_dict())) == (
        "MoE: 20.9 B, 4.2 B active")
    embedding = config.vocab_size * config.hidden_size
    assert format_parameters(active_parameters(shapes, config.to_dict()) - embedding) == (
        "3.6 B")
