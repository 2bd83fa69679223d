"""The tiny SmolVLM folder (tiny_idefics3.py) converted as llama.cpp converts one: its
text model as a "llama" GGUF (gguf's tensor-name map, Q/K rows in llama.cpp's rope
order, the vocabulary with Idefics3's image tokens as control tokens) and its tower and
connector as an mmproj GGUF (architecture "clip", projector type "idefics3", the keys
SmolVLMModel writes, the embeddings kept F32 as it keeps them, the other matrices F32,
F16 or Q8_0)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.constants import MODEL_ARCH
from safetensors.torch import load_file

from tests.engine.loaders.gguf.test_gguf_families import write_tensors
from tests.engine.loaders.gguf.test_gguf_loader import llama_cpp_permute
from tests.engine.tiny_models import SPECIALS
from tests.engine.vision.tiny_idefics3 import IMAGE_SPECIALS, idefics3_tokenizer


def folder_state(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def vocabulary_metadata(rename: dict[str, str] | None = None) -> dict[str, object]:
    """The folder's vocabulary as a GGUF gpt2 tokenizer (``rename``: tokens spelled
    otherwise, for a vocabulary that lacks one)."""
    tokenizer = idefics3_tokenizer()
    vocab = tokenizer.get_vocab()
    tokens = [(rename or {}).get(t, t) for t in sorted(vocab, key=vocab.get)]
    marked = set(SPECIALS) | set(IMAGE_SPECIALS) | set((rename or {}).values())
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": [0.0] * len(tokens),
            "tokenizer.ggml.token_type": [3 if t in marked else 1 for t in tokens],
            "tokenizer.ggml.bos_token_id": 256, "tokenizer.ggml.eos_token_id": 258,
            "tokenizer.ggml.padding_token_id": 256,
            "tokenizer.chat_template": tokenizer.chat_template}


def write_text_gguf(folder: Path, path: Path, rename: dict[str, str] | None = None) -> Path:
    """The folder's text model (F32) as llama.cpp's "llama" GGUF."""
    config = json.loads((folder / "config.json").read_text())["text_config"]
    layers = config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    names = gguf.get_tensor_name_map(MODEL_ARCH.LLAMA, layers)
    tensors = {}
    for name, tensor in folder_state(folder).items():
        if not name.startswith(("model.text_model.", "lm_head.")):
            continue
        hf = name.replace("model.text_model.", "model.")
        data = tensor.float().numpy()
        if ".q_proj.weight" in hf:
            data = llama_cpp_permute(data, heads)
        elif ".k_proj.weight" in hf:
            data = llama_cpp_permute(data, kv_heads)
        tensors[names.get_name(hf, try_suffixes=(".weight", ".bias"))] = data
    keys = {"context_length": config["max_position_embeddings"], "block_count": layers,
            "embedding_length": config["hidden_size"],
            "feed_forward_length": config["intermediate_size"],
            "attention.head_count": heads, "attention.head_count_kv": kv_heads,
            "rope.freq_base": float(config.get("rope_theta") or
                                    config["rope_parameters"]["rope_theta"]),
            "attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"])}
    metadata = {f"llama.{k}": v for k, v in keys.items()} | vocabulary_metadata(rename)
    write_tensors(path, "llama", metadata, tensors, Q.F32, lambda name, data: False)
    return path


def write_mmproj(folder: Path, path: Path, matrices: Q = Q.F32, projector: str = "idefics3",
                 projection_dim: int | None = None) -> Path:
    """The folder's tower and connector as llama.cpp's mmproj GGUF."""
    config = json.loads((folder / "config.json").read_text())
    vision = config["vision_config"]
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    names = gguf.get_tensor_name_map(MODEL_ARCH.MMPROJ, vision["num_hidden_layers"])
    tensors = {}
    for name, tensor in folder_state(folder).items():
        if not name.startswith(("model.vision_model.", "model.connector.")):
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        tensors[gguf_name] = tensor.float().numpy()
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(projector)
    writer.add_vision_projection_dim(projection_dim or config["text_config"]["hidden_size"])
    writer.add_vision_image_size(vision["image_size"])
    writer.add_vision_patch_size(vision["patch_size"])
    writer.add_vision_embedding_length(vision["hidden_size"])
    writer.add_vision_feed_forward_length(vision["intermediate_size"])
    writer.add_vision_block_count(vision["num_hidden_layers"])
    writer.add_vision_head_count(vision["num_attention_heads"])
    writer.add_vision_image_mean(pre["image_mean"])
    writer.add_vision_image_std(pre["image_std"])
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-5))
    writer.add_vision_projector_scale_factor(config["scale_factor"])
    writer.add_vision_use_gelu(True)
    writer.add_vision_preproc_image_size(pre["size"]["longest_edge"])
    write_mmproj_tensors(writer, tensors, matrices, kept=lambda name: "_embd" in name)
    return path


def write_mmproj_tensors(writer: gguf.GGUFWriter, tensors: dict[str, np.ndarray],
                         matrices: Q, kept) -> None:
    """The tensors stored as llama.cpp's converters store them, then the file closed:
    vectors, and those ``kept(name)`` picks (embeddings), as they are; the other
    matrices in ``matrices`` (F32 as they are, F16, or quantized; a convolution kernel
    past two dimensions F16, as the converters keep them)."""
    for name, data in tensors.items():
        if data.ndim < 2 or matrices == Q.F32 or kept(name):
            writer.add_tensor(name, data)
        elif matrices == Q.F16 or data.ndim > 2:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, matrices), raw_dtype=matrices)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
