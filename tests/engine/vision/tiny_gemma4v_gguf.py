"""The tiny Gemma 4 vision folder (tiny_gemma4v.py) converted as llama.cpp converts one:
its text model as a "gemma4" GGUF (test_gguf_gemma4.write_gemma4_gguf, with the folder's
vocabulary and its image tokens as control tokens) and its tower and embedder as an
mmproj GGUF as Gemma4VisionAudioModel writes it: architecture "clip", projector type
"gemma4v", encoder layers renamed to ``vision_model.model.`` before gguf's name map, the
patch matrix as a [hidden, 3, p, p] kernel, the position tables F32 under ``.weight``, each
clipped linear's ranges as one-value tensors (``.input_min`` ...), the image mean 0 and
std 1 of Gemma 4's processor; the other matrices F32, F16 or Q8_0."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import MODEL_ARCH
from safetensors.torch import load_file

from engine.loaders import load_model_files
from tests.engine.loaders.gguf.test_gguf_gemma4 import write_gemma4_gguf
from tests.engine.tiny_models import SPECIALS
from tests.engine.vision.tiny_gemma4v import BEGIN, END, IMAGE, gemma4v_tokenizer
from tests.engine.vision.tiny_idefics3_gguf import write_mmproj_tensors

CLAMPS = (".input_min", ".input_max", ".output_min", ".output_max")


def vocabulary_metadata() -> dict[str, object]:
    """The folder's vocabulary (its image tokens included) as a GGUF gpt2 tokenizer."""
    tokenizer = gemma4v_tokenizer()
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    marked = set(SPECIALS) | {BEGIN, IMAGE, END}
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": [0.0] * len(tokens),
            "tokenizer.ggml.token_type": [3 if t in marked else 1 for t in tokens],
            "tokenizer.ggml.bos_token_id": 256, "tokenizer.ggml.eos_token_id": 258,
            "tokenizer.ggml.padding_token_id": 256,
            "tokenizer.chat_template": tokenizer.chat_template}


def write_text_gguf(folder: Path, path: Path) -> Path:
    """The folder's text model (F32) as llama.cpp's "gemma4" GGUF."""
    loaded = load_model_files(folder)
    write_gemma4_gguf(path, loaded.config, dict(loaded.weights), metadata=vocabulary_metadata())
    return path


def write_mmproj(folder: Path, path: Path, matrices: Q = Q.F32, projector: str = "gemma4v",
                 extra: dict[str, int] | None = None,
                 mean: tuple[float, ...] = (0.0, 0.0, 0.0), audio: bool = False) -> Path:
    """The folder's tower and embedder as llama.cpp's mmproj GGUF (``extra``: more
    clip.vision.* integer keys, by their names under that prefix; ``audio``: with an
    audio encoder's tensors beside them, as E2B's file holds one)."""
    config = json.loads((folder / "config.json").read_text())
    vision = config["vision_config"]
    names = gguf.get_tensor_name_map(MODEL_ARCH.MMPROJ, vision["num_hidden_layers"])
    tensors = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if not name.startswith(("model.vision_tower.", "model.embed_vision.")):
            continue
        data = tensor.float()
        if data.dim() == 0:
            data = data.reshape(1)
        name = (name.replace("model.vision_tower.encoder.", "vision_model.model.")
                .replace(".linear.weight", ".weight"))
        if name.endswith("position_embedding_table"):
            name += ".weight"
        if name.endswith("patch_embedder.input_proj.weight"):
            p = vision["patch_size"]
            data = data.reshape(data.shape[0], p, p, 3).permute(0, 3, 1, 2).contiguous()
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias", *CLAMPS))
        assert gguf_name is not None, name
        tensors[gguf_name] = data.numpy()
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_vision_projector_type(projector)
    if audio:
        writer.add_clip_has_audio_encoder(True)
        writer.add_clip_audio_projector_type("gemma4a")
        tensors["a.blk.0.ffn_up.weight"] = np.ones((8, 4), dtype=np.float32)
        tensors["mm.a.input_projection.weight"] = np.ones((8, 4), dtype=np.float32)
    writer.add_vision_projection_dim(config["text_config"]["hidden_size"])
    writer.add_vision_image_size(224)  # the converter's placeholder
    writer.add_vision_patch_size(vision["patch_size"])
    writer.add_vision_embedding_length(vision["hidden_size"])
    writer.add_vision_feed_forward_length(vision["intermediate_size"])
    writer.add_vision_block_count(vision["num_hidden_layers"])
    writer.add_vision_head_count(vision["num_attention_heads"])
    writer.add_vision_image_mean(list(mean))
    writer.add_vision_image_std([1.0, 1.0, 1.0])
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_use_gelu(True)
    writer.add_vision_projector_scale_factor(vision["pooling_kernel_size"])
    for key, value in (extra or {}).items():
        writer.add_uint32(f"clip.vision.{key}", value)
    write_mmproj_tensors(writer, tensors, matrices, kept=lambda name: "position_embd" in name)
    return path


def budget_pixels(budget: int, folder: Path) -> int:
    """clip.vision.image_max_pixels for a token budget of the folder's tower."""
    vision = json.loads((folder / "config.json").read_text())["vision_config"]
    return budget * (vision["patch_size"] * vision["pooling_kernel_size"]) ** 2
