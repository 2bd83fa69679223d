"""Qwen3.5 and Qwen3.5-MoE GGUF files (``qwen35``, ``qwen35moe``), written here as
llama.cpp's converter writes them (Qwen3_5TextModel / Qwen3_5MoeTextModel over
Qwen3NextModel): gguf's own tensor-name map, +1 on the zero-centred norms but not on the
linear layers' gated norm, ssm_a = -exp(A_log), dt_bias as ssm_dt.bias, the depthwise
conv squeezed to [C, K], the linear layers' value heads reordered from grouped by k head
to tiled (every tensor that has them), and for the MoE each layer's experts stacked into
ffn_{gate,up,down}_exps beside the shared expert's *_shexp and its gate. The file must
chat exactly as the folder it came from (F32), and greedy-equal to it when quantized
(Q8_0) on weights that quantization noise does not throw off (calm_qwen35_weights); a
K-quant file (Q4_K where a row holds whole 256-value blocks, Q8_0 elsewhere) moves them
further, so it is greedy-equal to the folder of its own weights read back by gguf."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.constants import MODEL_ARCH

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.loaders import load_model_files
from engine.loaders.catalog import model_info
from engine.outputs import FinishedEvent
from kernels.quant.formats import QuantizedTensor
from tests.engine.loaders.gguf.quantized_files import encode, file_type, held_folder
from tests.engine.loaders.gguf.test_gguf_families import byte_level_metadata, put
from tests.engine.tiny_models import (
    calm_qwen35_weights,
    random_prompt,
    save_tiny_model,
    tiny_qwen35_config,
    tiny_qwen35_moe_config,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

ARCH = {"qwen3_5_text": ("qwen35", MODEL_ARCH.QWEN35),
        "qwen3_5_moe_text": ("qwen35moe", MODEL_ARCH.QWEN35MOE)}
_EXPERT_PARTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                 "down_proj": "ffn_down_exps"}


def tiled(t: torch.Tensor, dim: int, k_heads: int, per_k: int, size: int) -> torch.Tensor:
    """Value heads [k0v0, k0v1, k1v0, ...] (grouped) to [k0v0, k1v0, k0v1, ...] (tiled)."""
    shape = list(t.shape)
    split = t.reshape(*shape[:dim], k_heads, per_k, size, *shape[dim + 1:])
    return split.transpose(dim, dim + 1).reshape(shape)


def convert(state: dict[str, torch.Tensor], config) -> dict[str, tuple[np.ndarray, str]]:
    """The file's tensors: GGUF name -> (data, the Hugging Face name it came from)."""
    kh, vh = config.linear_num_key_heads, config.linear_num_value_heads
    per_k, dv = vh // kh, config.linear_value_head_dim
    key_dim = kh * config.linear_key_head_dim
    names = gguf.get_tensor_name_map(ARCH[config.model_type][1], config.num_hidden_layers)
    out, experts = {}, {}
    for name, t in state.items():
        t = t.detach().clone().float()
        if ".mlp.experts." in name:  # model.layers.N.mlp.experts.E.<part>.weight
            head, _, tail = name.partition(".mlp.experts.")
            expert, part = tail.split(".")[:2]
            gguf_name = f"blk.{head.split('.')[2]}.{_EXPERT_PARTS[part]}.weight"
            experts.setdefault(gguf_name, {})[int(expert)] = t, name
            continue
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
        out[gguf_name] = t.numpy(), name
    for gguf_name, by_expert in experts.items():
        stacked = torch.stack([by_expert[e][0] for e in sorted(by_expert)])
        out[gguf_name] = stacked.numpy(), by_expert[0][1]
    return out


def write_qwen35_gguf(path: Path, folder: Path, matrices: Q = Q.F32) -> Path:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    arch = ARCH[config.model_type][0]
    writer = gguf.GGUFWriter(str(path), arch)
    keys = {
        "context_length": config.max_position_embeddings, "block_count": config.num_hidden_layers,
        "embedding_length": config.hidden_size,
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
    if arch == "qwen35":
        keys["feed_forward_length"] = config.intermediate_size
    else:  # no feed_forward_length: every layer is sparse (the converter writes none)
        keys |= {"expert_count": config.num_experts,
                 "expert_used_count": config.num_experts_per_tok,
                 "expert_feed_forward_length": config.moe_intermediate_size,
                 "expert_shared_feed_forward_length": config.shared_expert_intermediate_size}
    for key, value in {**{f"{arch}.{k}": v for k, v in keys.items()},
                       **byte_level_metadata()}.items():
        put(writer, key, value)
    for name, (data, hf_name) in convert(state, config).items():
        data, raw = encode(data, file_type(hf_name, data.shape, matrices))
        writer.add_tensor(name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Per family: its folder's config, and the K-quant file's (rows of 256 values: the
# hidden size, so the matrices reading it take Q4_K and the rest Q8_0; as many value heads
# as key heads, so llama.cpp's tiling moves no row and the held folder is the file's).
FAMILIES = {"qwen35": tiny_qwen35_config, "qwen35_moe": tiny_qwen35_moe_config}
K_QUANT_SIZES = dict(hidden_size=256, linear_num_value_heads=2)
CASES = [("qwen35", Q.F32), ("qwen35_moe", Q.F32), ("qwen35", Q.Q8_0), ("qwen35_moe", Q.Q8_0),
         ("qwen35", Q.Q4_K), ("qwen35_moe", Q.Q4_K)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each family's folders on calm weights: the plain tiny one, and a K-quant one."""
    root = tmp_path_factory.mktemp("qwen35")
    made = {}

    def folder(family: str, k_quant: bool) -> Path:
        if (family, k_quant) not in made:
            config = FAMILIES[family](**(K_QUANT_SIZES if k_quant else {}))
            made[family, k_quant] = save_tiny_model(root / f"{family}-{k_quant}", config,
                                                    init=calm_qwen35_weights)
        return made[family, k_quant]
    return folder


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


@pytest.mark.parametrize(("family", "matrices"), CASES,
                         ids=[f"{f}-{m.name.lower()}" for f, m in CASES])
def test_the_file_chats_as_its_folder(folders, family, matrices, tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    folder = folders(family, matrices == Q.Q4_K)
    path = write_qwen35_gguf(tmp_path / f"{family}.gguf", folder, matrices)
    if matrices != Q.F32:  # kept quantized as the file stores them
        weights = dict(load_model_files(path, keep_quantized=True).weights)
        kinds = {w.type_id for w in weights.values() if isinstance(w, QuantizedTensor)}
        assert matrices in kinds
    if matrices == Q.Q4_K:
        folder = held_folder(folder, tmp_path / "held", matrices)
    assert greedy(path) == greedy(folder)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_list_reads_the_files_layers(folders, family, tmp_path):
    info = model_info(write_qwen35_gguf(tmp_path / "x.gguf", folders(family, False)))
    assert info.layer_summary == "hybrid: 3 linear + 1 full layers"
    assert info.hybrid is not None and info.hybrid.deltanet.v_heads_tiled
    if family == "qwen35":
        assert (info.architecture, info.active_parameters) == ("qwen3_5_text", None)
    else:
        assert info.architecture == "qwen3_5_moe_text"
        assert 0 < info.active_parameters < info.num_parameters


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_the_registry_maps_the_block_tensors_llama_cpp_lists(arch):
    from engine.models import gguf_family

    model_arch = MODEL_ARCH.QWEN35 if arch == "qwen35" else MODEL_ARCH.QWEN35MOE
    listed = {name.removeprefix("blk.{bid}.") for name in
              (gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[model_arch])
              if name.startswith("blk.")}
    mapped = {part.removesuffix(".bias") for part in gguf_family(arch).gguf_block_names}
    # ffn_gate_up_exps: gate and up experts fused in one tensor, which Folio does not read
    # (the converters write them apart).
    assert listed - mapped <= {"ffn_gate_up_exps"}
