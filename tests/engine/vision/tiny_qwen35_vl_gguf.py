"""The tiny Qwen3.5 vision folder (tiny_qwen35_vl.py) converted as llama.cpp converts one:
its text model as a "qwen35" (or "qwen35moe") GGUF (test_gguf_qwen35.convert's tensors; the folder's
M-RoPE sections as rope.dimension_sections, a fourth 0 after them; the vocabulary with
Qwen's vision tokens as control tokens) and its ViT and merger as an mmproj GGUF as
Qwen3VLVisionModel writes it: architecture "clip", projector type "qwen3vl_merger", the
Conv3d patch kernel as its two temporal slices (``v.patch_embd.weight`` and
``.weight.1``), the merger's MLP as ``mm.0`` / ``mm.2`` and its norm as ``v.post_ln``,
``spatial_merge_size``, the image size the position table spans, the text model's RMS
eps; the other matrices F32 or F16."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import MODEL_ARCH
from safetensors.torch import load_file
from transformers import AutoConfig

from tests.engine.loaders.gguf.test_gguf_families import put
from tests.engine.loaders.gguf.test_gguf_qwen35 import ARCH, convert
from tests.engine.tiny_models import SPECIALS
from tests.engine.vision.tiny_idefics3_gguf import write_mmproj_tensors
from tests.engine.vision.tiny_qwen35_vl import VISION_SPECIALS, qwen35_vl_tokenizer


def vocabulary_metadata() -> dict[str, object]:
    tokenizer = qwen35_vl_tokenizer()
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    marked = set(SPECIALS) | set(VISION_SPECIALS)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": [0.0] * len(tokens),
            "tokenizer.ggml.token_type": [3 if t in marked else 1 for t in tokens],
            "tokenizer.ggml.bos_token_id": 256, "tokenizer.ggml.eos_token_id": 258,
            "tokenizer.ggml.padding_token_id": 256,
            "tokenizer.chat_template": tokenizer.chat_template}


def write_text_gguf(folder: Path, path: Path) -> Path:
    """The folder's text model (F32) as llama.cpp's "qwen35" GGUF, or "qwen35moe" for a
    mixture of experts (its expert keys as write_qwen35_gguf writes them)."""
    config = AutoConfig.from_pretrained(folder).text_config
    arch = ARCH[config.model_type][0]
    state = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if name.startswith("model.language_model."):
            state[name.replace("model.language_model.", "model.", 1)] = tensor
        elif name == "lm_head.weight":
            state[name] = tensor
    rope = config.rope_parameters
    rotary = int(config.head_dim * rope["partial_rotary_factor"])
    keys = {
        "context_length": config.max_position_embeddings, "block_count": config.num_hidden_layers,
        "embedding_length": config.hidden_size,
        "attention.head_count": config.num_attention_heads,
        "attention.head_count_kv": config.num_key_value_heads,
        "attention.key_length": config.head_dim, "attention.value_length": config.head_dim,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "rope.freq_base": float(rope["rope_theta"]), "rope.dimension_count": rotary,
        "rope.dimension_sections": [*rope["mrope_section"], 0],
        "ssm.conv_kernel": config.linear_conv_kernel_dim,
        "ssm.state_size": config.linear_key_head_dim,
        "ssm.group_count": config.linear_num_key_heads,
        "ssm.time_step_rank": config.linear_num_value_heads,
        "ssm.inner_size": config.linear_num_value_heads * config.linear_value_head_dim,
        "full_attention_interval": config.layer_types.index("full_attention") + 1,
    }
    if arch == "qwen35":
        keys["feed_forward_length"] = config.intermediate_size
    else:
        keys |= {"expert_count": config.num_experts,
                 "expert_used_count": config.num_experts_per_tok,
                 "expert_feed_forward_length": config.moe_intermediate_size,
                 "expert_shared_feed_forward_length": config.shared_expert_intermediate_size}
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in {**{f"{arch}.{k}": v for k, v in keys.items()},
                       **vocabulary_metadata()}.items():
        put(writer, key, value)
    for name, (data, _) in convert(state, config).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def mmproj_tensors(folder: Path) -> dict[str, np.ndarray]:
    vision = json.loads((folder / "config.json").read_text())["vision_config"]
    names = gguf.get_tensor_name_map(MODEL_ARCH.MMPROJ, vision["depth"])
    tensors = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if not name.startswith("model.visual."):
            continue
        name = name.removeprefix("model.")
        data = tensor.float().numpy()
        if name == "visual.patch_embed.proj.weight":  # [D, C, T, p, p]: one slice per T
            tensors["v.patch_embd.weight"] = np.ascontiguousarray(data[:, :, 0])
            tensors["v.patch_embd.weight.1"] = np.ascontiguousarray(data[:, :, 1])
            continue
        if name.startswith("visual.merger."):
            part, kind = name.split(".")[2:]
            stem = {"linear_fc1": "mm.0", "linear_fc2": "mm.2", "norm": "v.post_ln"}[part]
            tensors[f"{stem}.{kind}"] = data
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        tensors[gguf_name] = data
    return tensors


def write_mmproj(folder: Path, path: Path, matrices: Q = Q.F32,
                 pixels: tuple[int, int] | None = None,
                 extra_tensors: dict[str, np.ndarray] | None = None) -> Path:
    """The folder's ViT and merger as llama.cpp's mmproj GGUF (``pixels``: the min and
    max pixels as clip.vision keys, which the converter does not write)."""
    config = json.loads((folder / "config.json").read_text())
    vision = config["vision_config"]
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type("qwen3vl_merger")
    writer.add_vision_projection_dim(vision["out_hidden_size"])
    side = int(round(vision["num_position_embeddings"] ** 0.5))
    writer.add_vision_image_size(side * vision["patch_size"])
    writer.add_vision_patch_size(vision["patch_size"])
    writer.add_vision_embedding_length(vision["hidden_size"])
    writer.add_vision_feed_forward_length(vision["intermediate_size"])
    writer.add_vision_block_count(vision["depth"])
    writer.add_vision_head_count(vision["num_heads"])
    writer.add_vision_image_mean(pre["image_mean"])
    writer.add_vision_image_std(pre["image_std"])
    writer.add_vision_use_gelu(True)
    writer.add_vision_spatial_merge_size(vision["spatial_merge_size"])
    writer.add_vision_attention_layernorm_eps(config["text_config"]["rms_norm_eps"])
    if pixels is not None:
        writer.add_vision_min_pixels(pixels[0])
        writer.add_vision_max_pixels(pixels[1])
    write_mmproj_tensors(writer, {**mmproj_tensors(folder), **(extra_tensors or {})}, matrices,
                         kept=lambda name: "position_embd" in name)
    return path
