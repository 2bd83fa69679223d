"""Qwen3.5 GGUF files (``qwen35``), written here as llama.cpp's converter writes them
(Qwen3_5TextModel over Qwen3NextModel): gguf's own tensor-name map, +1 on the
zero-centred norms but not on the linear layers' gated norm, ssm_a = -exp(A_log),
dt_bias as ssm_dt.bias, the depthwise conv squeezed to [C, K], and the linear layers'
value heads reordered from grouped by k head to tiled (every tensor that has them). The
file must chat exactly as the folder it came from."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import MODEL_ARCH

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.loaders.catalog import model_info
from engine.outputs import FinishedEvent
from tests.engine.loaders.gguf.test_gguf_families import byte_level_metadata, put
from tests.engine.tiny_models import random_prompt, save_tiny_model, tiny_qwen35_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def tiled(t: torch.Tensor, dim: int, k_heads: int, per_k: int, size: int) -> torch.Tensor:
    """Value heads [k0v0, k0v1, k1v0, ...] (grouped) to [k0v0, k1v0, k0v1, ...] (tiled)."""
    shape = list(t.shape)
    split = t.reshape(*shape[:dim], k_heads, per_k, size, *shape[dim + 1:])
    return split.transpose(dim, dim + 1).reshape(shape)


def convert(state: dict[str, torch.Tensor], config) -> dict[str, np.ndarray]:
    kh, vh = config.linear_num_key_heads, config.linear_num_value_heads
    per_k, dv = vh // kh, config.linear_value_head_dim
    key_dim = kh * config.linear_key_head_dim
    names = gguf.get_tensor_name_map(MODEL_ARCH.QWEN35, config.num_hidden_layers)
    out = {}
    for name, t in state.items():
        t = t.detach().clone().float()
        if "linear_attn." in name:
            part = name.split("linear_attn.")[1]
            if part in ("in_proj_qkv.weight", "conv1d.weight"):
                qk, v = t[:2 * key_dim], t[2 * key_dim:]
                t = torch.cat([qk, tiled(v, 0, kh, per_k, dv)])
                if part == "conv1d.weight":
                    t = t.squeeze(1)
            elif part == "in_proj_z.weight":
                t = tiled(t, 0, kh, per_k, dv)
            elif part in ("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias"):
                t = tiled(t, 0, kh, per_k, 1)
            elif part == "out_proj.weight":
                t = tiled(t, 1, kh, per_k, dv)
            if part == "A_log":
                t = -t.exp()
        elif name.endswith("norm.weight"):
            t = t + 1  # the zero-centred RMSNorms; the gated one keeps its weight
        if name.endswith("linear_attn.dt_bias"):
            gguf_name = name.replace("model.layers.", "blk.").replace("linear_attn.dt_bias",
                                                                    "ssm_dt.bias")
        else:
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
            assert gguf_name is not None, name
        out[gguf_name] = t.numpy()
    return out


def write_qwen35_gguf(path: Path, folder: Path) -> Path:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    writer = gguf.GGUFWriter(str(path), "qwen35")
    keys = {
        "context_length": config.max_position_embeddings, "block_count": config.num_hidden_layers,
        "embedding_length": config.hidden_size, "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": config.num_key_value_heads,
        "attention.key_length": config.head_dim, "attention.value_length": config.head_dim,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "rope.freq_base": float(config.rope_parameters["rope_theta"]),
        "rope.dimension_count": int(config.head_dim * 0.25),
        "ssm.conv_kernel": config.linear_conv_kernel_dim,
        "ssm.state_size": config.linear_key_head_dim,
        "ssm.group_count": config.linear_num_key_heads,
        "ssm.time_step_rank": config.linear_num_value_heads,
        "ssm.inner_size": config.linear_num_value_heads * config.linear_value_head_dim,
        "full_attention_interval": 4,
        # The multimodal rope's sections, which llama.cpp requires (text turns all alike).
        "rope.dimension_sections": [11, 11, 10, 0],
    }
    for key, value in {**{f"qwen35.{k}": v for k, v in keys.items()},
                       **byte_level_metadata()}.items():
        put(writer, key, value)
    for name, data in convert(state, config).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35")
    folder = save_tiny_model(root / "folder", tiny_qwen35_config())
    return folder, write_qwen35_gguf(root / "tiny-qwen35.gguf", folder)


def greedy(path: Path) -> list[int]:
    engine = LLMEngine(str(path), EngineConfig(device="cpu", num_gpu_blocks=64,
                                               max_num_batched_tokens=40))
    engine.add_request(random_prompt(2, 70), SamplingParams(max_tokens=16, temperature=0,
                                                            ignore_eos=True))
    while engine.has_unfinished_requests():
        for event in engine.step():
            if isinstance(event, FinishedEvent):
                return list(event.output.outputs[0].token_ids)
    raise AssertionError("no output")


def test_the_file_chats_as_its_folder(files, tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    folder, path = files
    assert greedy(path) == greedy(folder)


def test_the_list_reads_the_files_layers(files):
    info = model_info(files[1])
    assert (info.architecture, info.layer_summary) == (
        "qwen3_5_text", "hybrid: 3 linear + 1 full layers")
    assert info.hybrid is not None and info.hybrid.deltanet.v_heads_tiled
