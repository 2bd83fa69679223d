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
