"""OLMoE, Qwen3-MoE and Mixtral GGUF files, written here as llama.cpp's converter writes
them (OlmoeModel, Qwen3MoeModel, LlamaModel with experts): the router as ffn_gate_inp and
every expert of a layer in one stacked 3-D tensor per matrix (ffn_gate_exps,
ffn_up_exps, ffn_down_exps), Mixtral as a "llama" file with expert_count and permuted
Q/K rows.

Each file loads to the logits of the Hugging Face folder it was converted from (the F32
file to the folder's exactly, the Q8_0 one to the folder's model given the dequantized
matrices); kept quantized, each expert is a view of its rows of the file.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.loaders import FolioLoadError, load_model_files
from engine.loaders.gguf.config import gguf_config_dict
from engine.models import gguf_family
from kernels.quant.formats import QuantizedTensor
from tests.engine.loaders.gguf.test_gguf_families import (
    byte_level_metadata,
    prefill_logits,
    round_trip,
    write_tensors,
)
from tests.engine.loaders.gguf.test_gguf_loader import llama_cpp_permute
from tests.engine.tiny_moe import FAMILIES, byte_moe_config, save_moe_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

GGUF_ARCH = {"olmoe": "olmoe", "qwen3_moe": "qwen3moe", "mixtral": "llama"}
CONFIGS = {family: lambda family=family: byte_moe_config(family, max_position_embeddings=128)
           for family in FAMILIES}
_ATTN = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
         "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}


def family_metadata(family: str, config) -> dict[str, object]:
    arch = GGUF_ARCH[family]
    keys: dict[str, object] = {
        "context_length": config.max_position_embeddings,
        "block_count": config.num_hidden_layers, "embedding_length": config.hidden_size,
        "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": config.num_key_value_heads,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "rope.freq_base": float(config.rope_parameters["rope_theta"]),
        "expert_count": config.num_experts if family != "mixtral" else config.num_local_experts,
        "expert_used_count": config.num_experts_per_tok,
    }
    if family == "qwen3_moe":
        keys |= {"expert_feed_forward_length": config.moe_intermediate_size,
                 "attention.key_length": config.head_dim,
                 "attention.value_length": config.head_dim}
    if family == "olmoe" and config.clip_qkv is not None:
        keys["attention.clamp_kqv"] = float(config.clip_qkv)
    return {f"{arch}.{name}": value for name, value in keys.items()}


def gguf_tensors(family: str, config, state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """transformers 5's state dict (experts fused) as the converter's tensors."""
    out: dict[str, np.ndarray] = {"token_embd.weight": state["model.embed_tokens.weight"],
                                  "output_norm.weight": state["model.norm.weight"],
                                  "output.weight": state["lm_head.weight"]}
    for i in range(config.num_hidden_layers):
        prefix, blk = f"model.layers.{i}.", f"blk.{i}."
        out[blk + "attn_norm.weight"] = state[prefix + "input_layernorm.weight"]
        out[blk + "ffn_norm.weight"] = state[prefix + "post_attention_layernorm.weight"]
        for hf, part in _ATTN.items():
            name = f"{prefix}self_attn.{hf}.weight"
            if name in state:
                out[f"{blk}{part}.weight"] = state[name]
        if family == "mixtral":  # LlamaModel.modify_tensors
            out[blk + "attn_q.weight"] = llama_cpp_permute(out[blk + "attn_q.weight"],
                                                           config.num_attention_heads)
            out[blk + "attn_k.weight"] = llama_cpp_permute(out[blk + "attn_k.weight"],
                                                           config.num_key_value_heads)
        gate_up = state[prefix + "mlp.experts.gate_up_proj"]
        size = gate_up.shape[1] // 2
        out[blk + "ffn_gate_inp.weight"] = state[prefix + "mlp.gate.weight"]
        out[blk + "ffn_gate_exps.weight"] = gate_up[:, :size]
        out[blk + "ffn_up_exps.weight"] = gate_up[:, size:]
        out[blk + "ffn_down_exps.weight"] = state[prefix + "mlp.experts.down_proj"]
    return {name: np.ascontiguousarray(t.numpy() if isinstance(t, torch.Tensor) else t)
            for name, t in out.items()}


def write_moe_gguf(path: Path, family: str, config, state: dict[str, torch.Tensor],
                   matrices: Q, metadata: dict[str, object] | None = None,
                   ) -> dict[str, torch.Tensor]:
    """The file; returns `state` as the file holds it (matrices dequantized), fused as
    transformers keeps it, for the folder's model to run."""
    base = {**family_metadata(family, config), **byte_level_metadata()}
    # Norms, and the router as llama.cpp keeps it, stay F32.
    write_tensors(path, GGUF_ARCH[family], base if metadata is None else metadata,
                  gguf_tensors(family, config, state), matrices,
                  lambda name, data: data.ndim > 1 and not name.endswith("ffn_gate_inp.weight"))
    held = {}
    for name, tensor in state.items():
        if tensor.dim() >= 2 and matrices != Q.F32 and not name.endswith("mlp.gate.weight"):
            tensor = round_trip(tensor.numpy(), matrices)
        held[name] = tensor
    return held


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FOLIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module", params=list(CONFIGS))
def converted(request, tmp_path_factory, build_attention_metadata):
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    hf = save_moe_model(folder, family, max_position_embeddings=128)
    reference = load_model_files(folder)
    logits, spec = prefill_logits(reference.config, reference.weights, build_attention_metadata)
    state = {name: t.detach().clone() for name, t in hf.state_dict().items()}
    return SimpleNamespace(family=family, config=hf.config, state=state, folder=reference,
                           logits=logits, spec=spec)


@pytest.mark.parametrize("matrices", [Q.F32, Q.Q8_0], ids=["f32", "q8_0"])
def test_gguf_gives_the_folders_logits(converted, matrices, tmp_path,
                                       build_attention_metadata):
    c = converted
    path = tmp_path / f"{c.family}.gguf"
    held = write_moe_gguf(path, c.family, c.config, c.state, matrices)
    loaded = load_model_files(path)
    assert loaded.config.model_type == c.folder.config.model_type
    assert set(loaded.weights.shapes) == set(c.folder.weights.shapes)
    logits, spec = prefill_logits(loaded.config, loaded.weights, build_attention_metadata)
    assert spec == c.spec
    if matrices == Q.F32:
        assert torch.equal(logits, c.logits)
    else:
        expected, _ = prefill_logits(c.folder.config, held.items(), build_attention_metadata)
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
        # (not compared with the F32 logits: a router score that rounding moves past
        # another sends a token to another expert, and the random model amplifies it)
        assert not torch.equal(logits, c.logits)


def test_kept_quantized_each_expert_is_a_view_of_its_rows(converted, tmp_path,
                                                          build_attention_metadata):
    c = converted
    path = tmp_path / f"{c.family}.gguf"
    held = write_moe_gguf(path, c.family, c.config, c.state, Q.Q8_0)
    loaded = load_model_files(path, keep_quantized=True)
    weights = dict(loaded.weights)
    gate, up, down = ("w1", "w3", "w2") if c.family == "mixtral" else (
        "gate_proj", "up_proj", "down_proj")
    block = "block_sparse_moe" if c.family == "mixtral" else "mlp"
    first = weights[f"model.layers.0.{block}.experts.0.{gate}.weight"]
    second = weights[f"model.layers.0.{block}.experts.1.{gate}.weight"]
    assert isinstance(first, QuantizedTensor) and first.type_id == Q.Q8_0
    size = getattr(c.config, "moe_intermediate_size", c.config.intermediate_size)
    assert first.shape == (size, c.config.hidden_size)
    # Consecutive runs of one mapped file: expert 1's rows start where expert 0's end.
    assert second.data.data_ptr() == first.data.data_ptr() + first.data.numel()
    for name in (f"experts.3.{up}", f"experts.7.{down}"):
        assert isinstance(weights[f"model.layers.1.{block}.{name}.weight"], QuantizedTensor)
    logits, _ = prefill_logits(loaded.config, weights.items(), build_attention_metadata)
    expected, _ = prefill_logits(c.folder.config, held.items(), build_attention_metadata)
    # The native products round the activations: close, not equal. 37 rows take the 16-bit
    # tiles on AVX-512 (within 0.05) but 8-bit ones on AVX2 and the portable path (0.10-0.13,
    # 0.4-0.6% of the largest logit); an expert read from another's rows is off by the
    # logits' whole scale.
    assert (logits - expected).abs().max() < 0.015 * expected.abs().max()


def test_the_engine_chats_the_same_from_the_file_and_the_folder(converted, tmp_path):
    from engine import LLM, SamplingParams

    c = converted
    path = tmp_path / f"{c.family}.gguf"
    write_moe_gguf(path, c.family, c.config, c.state, Q.F32)
    messages = [{"role": "user", "content": "hello, world"}]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    replies = [LLM(str(source), num_gpu_blocks=16).chat(messages, params).outputs[0]
               for source in (c.folder.source, path)]
    assert replies[0].token_ids == replies[1].token_ids


@pytest.mark.parametrize(("arch", "experts", "family"), [
    ("olmoe", 8, "OlmoeForCausalLM"), ("qwen3moe", 8, "Qwen3MoeForCausalLM"),
    ("llama", 8, "MixtralForCausalLM"), ("llama", 0, "LlamaForCausalLM")])
def test_a_llama_file_with_experts_is_mixtral(arch, experts, family):
    assert gguf_family(arch, experts).architecture == family


@pytest.mark.parametrize("arch", ["olmoe", "qwen3moe"])
def test_the_registry_maps_the_block_tensors_llama_cpp_lists(arch):
    model_arch = gguf.MODEL_ARCH.OLMOE if arch == "olmoe" else gguf.MODEL_ARCH.QWEN3MOE
    listed = {name.removeprefix("blk.{bid}.") for name in
              (gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[model_arch])
              if name.startswith("blk.")}
    assert listed <= set(gguf_family(arch).gguf_block_names)


def header(family: str, config) -> dict[str, object]:
    """The metadata as the header reader gives it (arrays as their lengths)."""
    return {"general.architecture": GGUF_ARCH[family], **family_metadata(family, config),
            "tokenizer.ggml.tokens": config.vocab_size}


def test_the_keys_give_each_family_its_routing():
    names = {"output.weight"}
    for family, make in CONFIGS.items():
        meta = header(family, make())
        read = gguf_config_dict(meta, names, None, Path("x.gguf"))
        assert read["num_experts_per_tok"] == 2
        assert read["norm_topk_prob"] == (family != "olmoe")
    meta["llama.expert_weights_norm"] = False
    assert gguf_config_dict(meta, names, None, Path("x.gguf"))["norm_topk_prob"] is False


@pytest.mark.parametrize(("key", "value", "complaint"), [
    ("expert_used_count", 9, "at most expert_count"),
    ("expert_used_count", None, "expert_used_count is missing"),
    ("expert_feed_forward_length", None, "expert_feed_forward_length is missing"),
    ("expert_weights_norm", 3, "a flag"),
])
def test_bad_expert_keys_are_named(key, value, complaint):
    meta = header("qwen3_moe", CONFIGS["qwen3_moe"]())
    if value is None:
        meta.pop(f"qwen3moe.{key}")
    else:
        meta[f"qwen3moe.{key}"] = value
    with pytest.raises(FolioLoadError, match=complaint):
        gguf_config_dict(meta, {"output.weight"}, None, Path("x.gguf"))
