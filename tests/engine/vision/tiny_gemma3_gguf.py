"""The tiny Gemma 3 vision folder (tiny_gemma3.py) converted as llama.cpp converts one:
its text model as a "gemma3" GGUF (test_gguf_families.write_gguf: Gemma's +1 on the
norms; the layer kinds as per-layer flags; the vocabulary with its one merge and Gemma
3's image tokens as control tokens) and its SigLIP tower and projector as an mmproj GGUF
as Gemma3VisionModel writes it: architecture "clip", projector type "gemma3", the
projection ``mm.input_projection`` as stored ([vision width, text width]), the
soft-embedding norm ``mm.soft_emb_norm`` with 1 added, ``projector.scale_factor`` only
where it is not 4, the position embeddings F32; the other matrices F32 or F16."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import MODEL_ARCH
from safetensors.torch import load_file

from engine.loaders import load_model_files
from engine.models.gemma import SLIDING
from tests.engine.loaders.gguf.test_gguf_families import family_metadata, write_gguf
from tests.engine.tiny_models import SPECIALS
from tests.engine.vision.tiny_gemma3 import BOI, EOI, SOFT, gemma3_tokenizer
from tests.engine.vision.tiny_idefics3_gguf import write_mmproj_tensors


def vocabulary_metadata() -> dict[str, object]:
    tokenizer = gemma3_tokenizer()
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    marked = set(SPECIALS) | {BOI, EOI, SOFT}
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["Ċ Ċ"],
            "tokenizer.ggml.token_type": [3 if t in marked else 1 for t in tokens],
            "tokenizer.ggml.bos_token_id": 256, "tokenizer.ggml.eos_token_id": 258,
            "tokenizer.ggml.padding_token_id": 256,
            "tokenizer.chat_template": tokenizer.chat_template}


def write_text_gguf(folder: Path, path: Path) -> Path:
    """The folder's text model (F32) as llama.cpp's "gemma3" GGUF."""
    loaded = load_model_files(folder)
    config = loaded.config
    metadata = {**family_metadata("gemma3", config), **vocabulary_metadata(),
                "gemma3.attention.sliding_window_pattern":
                    [t == SLIDING for t in config.layer_types]}
    write_gguf(path, "gemma3", config, dict(loaded.weights), Q.F32, metadata=metadata)
    return path


def write_mmproj(folder: Path, path: Path, matrices: Q = Q.F32,
                 scale: int | None = None) -> Path:
    """The folder's tower and projector as llama.cpp's mmproj GGUF (``scale``: a
    projector.scale_factor written whatever the folder's)."""
    config = json.loads((folder / "config.json").read_text())
    vision = config["vision_config"]
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    names = gguf.get_tensor_name_map(MODEL_ARCH.MMPROJ, vision["num_hidden_layers"])
    tensors = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        name = name.removeprefix("model.")  # transformers 5 saves the tower at the top
        if not name.startswith(("vision_tower.", "multi_modal_projector.")):
            continue
        name = name.replace("_weight", ".weight")
        if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
            name = name.replace("vision_tower.", "vision_tower.vision_model.", 1)
        data = tensor.float().numpy()
        if "soft_emb_norm.weight" in name:
            data = data + np.float32(1)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        tensors[gguf_name] = data
    side = vision["image_size"] // vision["patch_size"]
    per_side = int(config["mm_tokens_per_image"] ** 0.5)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type("gemma3")
    writer.add_vision_projection_dim(config["text_config"]["hidden_size"])
    writer.add_vision_image_size(vision["image_size"])
    writer.add_vision_patch_size(vision["patch_size"])
    writer.add_vision_embedding_length(vision["hidden_size"])
    writer.add_vision_feed_forward_length(vision["intermediate_size"])
    writer.add_vision_block_count(vision["num_hidden_layers"])
    writer.add_vision_head_count(vision["num_attention_heads"])
    writer.add_vision_image_mean(pre["image_mean"])
    writer.add_vision_image_std(pre["image_std"])
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    writer.add_vision_use_gelu(True)
    if scale is not None or side // per_side != 4:
        writer.add_vision_projector_scale_factor(scale or side // per_side)
    assert tensors, "no tower tensors in the folder"
    write_mmproj_tensors(writer, tensors, matrices,
                         kept=lambda name: "position_embd" in name)
    return path
