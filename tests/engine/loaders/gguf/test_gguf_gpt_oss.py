"""gpt-oss GGUF files, written here as llama.cpp's converter writes them (GptOssModel):
architecture "gpt-oss", the sinks as attn_sinks, post_attention_norm before the experts,
the router and its bias as ffn_gate_inp, each expert matrix of a layer (gate and up
de-interleaved) in one stacked tensor with a stacked bias, MXFP4 experts, YaRN keys.

Each file loads to the logits of the Hugging Face folder it was converted from, given the
experts as the file holds them (gguf.quants.dequantize of the MXFP4 blocks); kept
quantized, each expert is a view of its MXFP4 rows of the file, multiplied by the PyTorch
dequantization (exactly) or the native kernel (within its rounding of the activations)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.loaders import load_model_files
from engine.models import gguf_family
from kernels.quant.formats import QuantizedTensor
from kernels.quant.mxfp4 import MXFP4_TYPE
from tests.engine.loaders.gguf.test_gguf_families import (
    byte_level_metadata,
    prefill_logits,
    round_trip,
    write_tensors,
)
from tests.engine.tiny_moe import GPT_OSS, moe_config, save_moe_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

_ATTN = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}


def gpt_oss_metadata(config) -> dict[str, object]:
    rope = config.rope_parameters
    keys: dict[str, object] = {
        "context_length": config.max_position_embeddings,
        "block_count": config.num_hidden_layers, "embedding_length": config.hidden_size,
        "feed_forward_length": config.intermediate_size,
        "expert_feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": config.num_key_value_heads,
        "attention.key_length": config.head_dim, "attention.value_length": config.head_dim,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "attention.sliding_window": config.sliding_window,
        "rope.freq_base": float(rope["rope_theta"]),
        "rope.scaling.type": "yarn", "rope.scaling.factor": float(rope["factor"]),
        "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
        "expert_count": config.num_local_experts,
        "expert_used_count": config.num_experts_per_tok,
        # The tiny models' limit (real files leave it out: llama.cpp's 7.0 applies).
        "swiglu_clamp_exp": float(config.swiglu_limit),
    }
    return {f"gpt-oss.{name}": value for name, value in keys.items()}


def gguf_tensors(config, state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """transformers' state dict (experts fused, transposed, gate/up interleaved) as the
    converter's tensors: HF order, [experts, rows, columns] for the stacks."""
    out: dict[str, torch.Tensor] = {"token_embd.weight": state["model.embed_tokens.weight"],
                                    "output_norm.weight": state["model.norm.weight"],
                                    "output.weight": state["lm_head.weight"]}
    for i in range(config.num_hidden_layers):
        prefix, blk = f"model.layers.{i}.", f"blk.{i}."
        out[blk + "attn_norm.weight"] = state[prefix + "input_layernorm.weight"]
        out[blk + "post_attention_norm.weight"] = state[prefix + "post_attention_layernorm.weight"]
        for hf, part in _ATTN.items():
            for kind in ("weight", "bias"):
                out[f"{blk}{part}.{kind}"] = state[f"{prefix}self_attn.{hf}.{kind}"]
        out[blk + "attn_sinks.weight"] = state[prefix + "self_attn.sinks"]
        out[blk + "ffn_gate_inp.weight"] = state[prefix + "mlp.router.weight"]
        out[blk + "ffn_gate_inp.bias"] = state[prefix + "mlp.router.bias"]
        experts = prefix + "mlp.experts."
        gate_up = state[experts + "gate_up_proj"]
        gate_up_bias = state[experts + "gate_up_proj_bias"]
        out[blk + "ffn_gate_exps.weight"] = gate_up[:, :, 0::2].transpose(1, 2)
        out[blk + "ffn_up_exps.weight"] = gate_up[:, :, 1::2].transpose(1, 2)
        out[blk + "ffn_down_exps.weight"] = state[experts + "down_proj"].transpose(1, 2)
        out[blk + "ffn_gate_exps.bias"] = gate_up_bias[:, 0::2]
        out[blk + "ffn_up_exps.bias"] = gate_up_bias[:, 1::2]
        out[blk + "ffn_down_exps.bias"] = state[experts + "down_proj_bias"]
    return {name: np.ascontiguousarray(t.numpy()) for name, t in out.items()}


def write_gpt_oss_gguf(path: Path, config, state: dict[str, torch.Tensor],
                       experts: Q = Q.MXFP4, tokenizer: dict[str, object] | None = None
                       ) -> dict[str, torch.Tensor]:
    """The file, its expert matrices in `experts` (everything else F32); returns `state`
    with the experts as the file holds them (dequantized), for the folder's model.
    ``tokenizer``: its tokenizer keys (the tiny folders' byte-level vocabulary by
    default)."""
    keys = tokenizer if tokenizer is not None else byte_level_metadata()
    write_tensors(path, "gpt-oss", {**gpt_oss_metadata(config), **keys},
                  gguf_tensors(config, state), experts,
                  lambda name, data: name.endswith("_exps.weight"))
    held = dict(state)
    if experts != Q.F32:
        for name in state:
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                data = state[name].transpose(1, 2).contiguous().numpy()  # rows of k = input
                held[name] = round_trip(data, experts).transpose(1, 2)
    return held


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt_oss")
    hf = save_moe_model(path, GPT_OSS, max_position_embeddings=128)
    state = {name: t.detach().clone() for name, t in hf.state_dict().items()}
    return path, hf.config, state


@pytest.mark.parametrize("experts", [Q.F32, Q.MXFP4], ids=["f32", "mxfp4"])
def test_gguf_gives_the_folders_logits(folder, experts, tmp_path, build_attention_metadata):
    source, config, state = folder
    path = tmp_path / "gpt-oss.gguf"
    held = write_gpt_oss_gguf(path, config, state, experts)
    loaded = load_model_files(path)
    reference = load_model_files(source)
    assert loaded.config.model_type == "gpt_oss"
    assert loaded.config.layer_types == reference.config.layer_types
    logits, spec = prefill_logits(loaded.config, loaded.weights, build_attention_metadata)
    expected, folder_spec = prefill_logits(reference.config, held.items(),
                                           build_attention_metadata)
    assert spec == folder_spec
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("native", [False, True], ids=["pytorch", "native"])
def test_kept_quantized_each_expert_is_a_view_of_its_mxfp4_rows(folder, tmp_path, native,
                                                                build_attention_metadata,
                                                                monkeypatch):
    import kernels.quant.mxfp4 as mxfp4

    if native and not mxfp4.native_mxfp4(torch.device("cpu")):
        pytest.skip("the native CPU library (with its MXFP4 kernel) is not built")
    if not native:  # the PyTorch dequantization, the fallback: exact
        monkeypatch.setattr(mxfp4, "_library_takes_mxfp4", lambda: False)
    source, config, state = folder
    path = tmp_path / "gpt-oss.gguf"
    held = write_gpt_oss_gguf(path, config, state)
    weights = dict(load_model_files(path, keep_quantized=True).weights)
    first = weights["model.layers.0.mlp.experts.0.gate_proj.weight"]
    second = weights["model.layers.0.mlp.experts.1.gate_proj.weight"]
    assert isinstance(first, QuantizedTensor) and first.type_id == MXFP4_TYPE
    assert first.shape == (config.intermediate_size, config.hidden_size)
    assert second.data.data_ptr() == first.data.data_ptr() + first.data.numel()
    assert weights["model.layers.1.mlp.experts.7.down_proj.bias"].shape == (config.hidden_size,)
    logits, _ = prefill_logits(load_model_files(path).config, weights.items(),
                               build_attention_metadata)
    expected, _ = prefill_logits(load_model_files(source).config, held.items(),
                                 build_attention_metadata)
    if native:  # the kernel's rounded activations (kernels/cpu/test_quant_mxfp4.py's bounds)
        assert (logits - expected).norm() / expected.norm() < 2e-3
    else:
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


def test_the_registry_maps_the_block_tensors_llama_cpp_lists():
    listed = {name.removeprefix("blk.{bid}.") for name in
              (gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GPT_OSS])
              if name.startswith("blk.")}
    assert listed <= set(gguf_family("gpt-oss").gguf_block_names)
    assert gguf_family("gpt-oss").architecture == "GptOssForCausalLM"


def test_a_file_without_the_clamp_key_gets_gpt_oss_limit_and_its_yarn():
    from engine.loaders.gguf.config import gguf_config_dict

    meta = {"general.architecture": "gpt-oss", **gpt_oss_metadata(moe_config(GPT_OSS)),
            "tokenizer.ggml.tokens": 256}
    del meta["gpt-oss.swiglu_clamp_exp"]
    read = gguf_config_dict(meta, {"output.weight"}, None, Path("x.gguf"))
    assert "swiglu_limit" not in read  # GptOssConfig's default, 7.0
    assert read["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert read["rope_parameters"] == {
        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
        "original_max_position_embeddings": 128, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False}
