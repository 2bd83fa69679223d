"""A GGUF model's eyes from llama.cpp's ``mmproj`` file (engine/loaders/gguf/mmproj.py
finds and reads its header): the projector types Folio runs, each one entry of
``PROJECTORS``, and the loader that fills the family's encoder from the file.

An entry gives the names of the file's tensors as the family encoder's parameters (one
table: llama.cpp's ``v.*`` / ``mm.*`` stems, ``{}`` a block index; a stem's suffix,
``.weight``, ``.bias`` or a clipped linear's ``.input_min`` and the like, is kept, and a
tensor may have none) and a builder that
makes the family's parts from the file's ``clip.vision.*`` keys, the state and the text
model's tokenizer (whose vocabulary must hold the family's image tokens). Tensors are
dequantized by gguf's own tables (F32, F16, BF16, Q8_0 and the rest it knows).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engine.loaders.base import FolioLoadError
from engine.loaders.gguf.mmproj import MmprojHeader
from engine.vision.model import VisionModel, VisionParts, placed_model

# SigLIP's tower as llama.cpp names it (gguf's MODEL_TENSOR.V_ENC_* and V_POST_NORM),
# to the parameter names of engine/vision/siglip.py (Hugging Face's, under vision_model.).
SIGLIP_TOWER = {
    "v.patch_embd": "vision_model.embeddings.patch_embedding",
    "v.position_embd": "vision_model.embeddings.position_embedding",
    "v.blk.{}.attn_q": "vision_model.encoder.layers.{}.self_attn.q_proj",
    "v.blk.{}.attn_k": "vision_model.encoder.layers.{}.self_attn.k_proj",
    "v.blk.{}.attn_v": "vision_model.encoder.layers.{}.self_attn.v_proj",
    "v.blk.{}.attn_out": "vision_model.encoder.layers.{}.self_attn.out_proj",
    "v.blk.{}.ln1": "vision_model.encoder.layers.{}.layer_norm1",
    "v.blk.{}.ln2": "vision_model.encoder.layers.{}.layer_norm2",
    "v.blk.{}.ffn_up": "vision_model.encoder.layers.{}.mlp.fc1",
    "v.blk.{}.ffn_down": "vision_model.encoder.layers.{}.mlp.fc2",
    "v.post_ln": "vision_model.post_layernorm",
}

# Gemma 3's SigLIP tower and projector (Gemma3VisionModel) to engine/vision/gemma3.py's
# names; the builder makes the projection a bare parameter and takes back the 1 the
# converter added to the soft-embedding norm.
GEMMA3_TOWER = {
    **{stem: target.replace("vision_model.", "vision_tower.", 1)
       for stem, target in SIGLIP_TOWER.items()},
    "mm.input_projection": "multi_modal_projector.mm_input_projection",
    "mm.soft_emb_norm": "multi_modal_projector.mm_soft_emb_norm",
}

# Gemma 4's tower as llama.cpp names it (Gemma4VisionAudioModel in convert_hf_to_gguf.py)
# to the parameter stems of engine/vision/gemma4_tower.py; the builder moves a linear
# map's weight under its ``.linear`` and turns the file's patch kernel and one-value
# clamp ranges back into the checkpoint's shapes.
GEMMA4_TOWER = {
    "v.patch_embd": "vision_tower.patch_embedder.input_proj",
    "v.position_embd": "vision_tower.patch_embedder.position_embedding_table",
    "v.blk.{}.attn_q": "vision_tower.encoder.layers.{}.self_attn.q_proj",
    "v.blk.{}.attn_k": "vision_tower.encoder.layers.{}.self_attn.k_proj",
    "v.blk.{}.attn_v": "vision_tower.encoder.layers.{}.self_attn.v_proj",
    "v.blk.{}.attn_out": "vision_tower.encoder.layers.{}.self_attn.o_proj",
    "v.blk.{}.attn_q_norm": "vision_tower.encoder.layers.{}.self_attn.q_norm",
    "v.blk.{}.attn_k_norm": "vision_tower.encoder.layers.{}.self_attn.k_norm",
    "v.blk.{}.ln1": "vision_tower.encoder.layers.{}.input_layernorm",
    "v.blk.{}.attn_post_norm": "vision_tower.encoder.layers.{}.post_attention_layernorm",
    "v.blk.{}.ln2": "vision_tower.encoder.layers.{}.pre_feedforward_layernorm",
    "v.blk.{}.ffn_post_norm": "vision_tower.encoder.layers.{}.post_feedforward_layernorm",
    "v.blk.{}.ffn_gate": "vision_tower.encoder.layers.{}.mlp.gate_proj",
    "v.blk.{}.ffn_up": "vision_tower.encoder.layers.{}.mlp.up_proj",
    "v.blk.{}.ffn_down": "vision_tower.encoder.layers.{}.mlp.down_proj",
    "v.std_bias": "vision_tower.std_bias",
    "v.std_scale": "vision_tower.std_scale",
    "mm.input_projection": "embed_vision.embedding_projection",
}

# Qwen3-VL's / Qwen3.5's ViT and merger as llama.cpp names them (Qwen3VLVisionModel) to
# the parameter stems of engine/vision/qwen35_tower.py; the Conv3d patch kernel comes as
# its two temporal slices (``v.patch_embd.weight`` and ``.weight.1``), stacked back by
# the builder.
QWEN35_TOWER = {
    "v.patch_embd": "visual.patch_embed.proj",
    "v.position_embd": "visual.pos_embed",
    "v.blk.{}.attn_qkv": "visual.blocks.{}.attn.qkv",
    "v.blk.{}.attn_out": "visual.blocks.{}.attn.proj",
    "v.blk.{}.ln1": "visual.blocks.{}.norm1",
    "v.blk.{}.ln2": "visual.blocks.{}.norm2",
    "v.blk.{}.ffn_up": "visual.blocks.{}.mlp.linear_fc1",
    "v.blk.{}.ffn_down": "visual.blocks.{}.mlp.linear_fc2",
    "v.post_ln": "visual.merger.norm",
    "mm.0": "visual.merger.linear_fc1",
    "mm.2": "visual.merger.linear_fc2",
}

AUDIO_PREFIXES = ("a.", "mm.a.")  # llama.cpp's audio encoder and its projector

# A builder: (the file's header, its state by parameter name, float32, the text model's
# tokenizer, its hidden size) -> the family's parts.
MmprojBuilder = Callable[[MmprojHeader, dict[str, torch.Tensor], object, int], VisionParts]


@dataclass(slots=True, frozen=True)
class Projector:
    projector_type: str  # clip.projector_type
    family: str  # the model family, for messages
    names: dict[str, str]  # GGUF stem -> parameter stem ("{}": the block index)
    build: MmprojBuilder
    # The text models (config model_type) whose forward takes its images.
    text_models: tuple[str, ...]
    # Its tower computes in bfloat16 where the family's folder tower does
    # (VisionFamily.cpu_bfloat16, model.tower_dtype).
    cpu_bfloat16: bool = False


def _projectors() -> dict[str, Projector]:
    from engine.vision import gemma3, gemma4, idefics3, qwen35

    smolvlm = Projector("idefics3", "SmolVLM / Idefics3",
                        {**SIGLIP_TOWER, "mm.model.fc": "connector.modality_projection.proj"},
                        idefics3.build_from_mmproj, ("llama",))
    gemma_3 = Projector("gemma3", "Gemma 3", GEMMA3_TOWER, gemma3.build_from_mmproj,
                        ("gemma3_text",), cpu_bfloat16=gemma3.GEMMA3.cpu_bfloat16)
    gemma = Projector("gemma4v", "Gemma 4", GEMMA4_TOWER, gemma4.build_from_mmproj,
                      ("gemma4_text",))
    # Qwen3-VL writes the same type (with deepstack tensors, refused by name) for text
    # models Folio does not run.
    qwen = Projector("qwen3vl_merger", "Qwen3.5", QWEN35_TOWER, qwen35.build_from_mmproj,
                     ("qwen3_5_text", "qwen3_5_moe_text"),
                     cpu_bfloat16=qwen35.QWEN35.cpu_bfloat16)
    return {p.projector_type: p for p in (smolvlm, gemma_3, gemma, qwen)}


def supported_projectors() -> tuple[str, ...]:
    return tuple(_projectors())


def projector_of(header: MmprojHeader) -> Projector:
    """The entry for the file's projector type; FolioLoadError naming it when Folio does
    not run that type."""
    projectors = _projectors()
    if header.projector not in projectors:
        raise FolioLoadError(f"{header.path}: the mmproj file's projector type "
                             f"{header.projector!r} is not one Folio runs (it runs "
                             f"{', '.join(projectors)})")
    return projectors[header.projector]


def pairs_with(header: MmprojHeader, text_model: str) -> bool:
    """Whether the file's projector feeds images to a text model of this model_type."""
    return text_model in projector_of(header).text_models


def check_width(header: MmprojHeader, text_hidden: int) -> None:
    """FolioLoadError unless the projector's output width is the text model's."""
    width = header.require("projection_dim")
    if width != text_hidden:
        raise FolioLoadError(f"{header.path}: the mmproj file projects to {width} wide "
                             f"embeddings (clip.vision.projection_dim), but the text model "
                             f"is {text_hidden} wide; it belongs to another model")


def load_mmproj(header: MmprojHeader, tokenizer, text_hidden: int, dtype: torch.dtype,
                device: torch.device | str = "cpu",
                encoder_dtype: torch.dtype | None = None,
                text_model: str | None = None) -> VisionModel:
    """The vision model the file holds, for a text model of width ``text_hidden`` and its
    ``tokenizer`` (and of ``text_model``, its config model_type, when given);
    FolioLoadError naming the file for what does not fit. ``encoder_dtype``: the tower's
    compute dtype (None: as load_vision chooses it)."""
    projector = projector_of(header)
    if text_model is not None and not pairs_with(header, text_model):
        raise FolioLoadError(f"{header.path}: the mmproj file's projector type "
                             f"{header.projector!r} gives images to a {projector.family} "
                             f"text model ({', '.join(projector.text_models)}), and this "
                             f"model is {text_model}")
    check_width(header, text_hidden)
    state = read_state(header, projector.names)
    parts = projector.build(header, state, tokenizer, text_hidden)
    return placed_model(parts, projector, dtype, device, encoder_dtype)


def read_state(header: MmprojHeader, names: dict[str, str]) -> dict[str, torch.Tensor]:
    """Every vision tensor of the file, dequantized to float32, by its parameter name (a
    file that holds an audio encoder too, as Gemma 4 E2B's, keeps it under ``a.*`` and
    ``mm.a.*``: left out)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize, quant_shape_to_byte_shape

    patterns = [(_pattern(stem), target) for stem, target in names.items()]
    data = np.memmap(header.path, dtype=np.uint8, mode="r")
    state: dict[str, torch.Tensor] = {}
    for tensor in header.tensors:
        if tensor.name.startswith(AUDIO_PREFIXES):
            continue
        target = _parameter(tensor.name, patterns)
        if target is None:
            raise FolioLoadError(f"{header.path}: tensor {tensor.name} has no place in "
                                 f"the {header.projector} encoder; the file is damaged or "
                                 "from a newer converter")
        try:
            qtype = GGMLQuantizationType(tensor.qtype)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
            n_bytes = int(np.prod(tensor.shape)) * block_bytes // block
            if tensor.offset + n_bytes > data.size:
                raise ValueError("it ends past the end of the file: the file is truncated")
            raw = data[tensor.offset:tensor.offset + n_bytes]
            values = dequantize(raw.reshape(quant_shape_to_byte_shape(tensor.shape, qtype)),
                                qtype)
        except (ValueError, KeyError, NotImplementedError) as exc:
            raise FolioLoadError(f"{header.path}: tensor {tensor.name} cannot be read "
                                 f"({exc})") from exc
        state[target] = torch.from_numpy(np.array(values, dtype=np.float32)
                                         .reshape(tensor.shape))
    return state


# What may follow a stem: a weight or bias, a clipped linear's ranges (Gemma 4), a
# second temporal slice of a patch kernel (Qwen's ``weight.1``).
_SUFFIXES = r"weight\.1|weight|bias|input_min|input_max|output_min|output_max"


def _pattern(stem: str) -> re.Pattern:
    return re.compile(re.escape(stem).replace(r"\{\}", r"(\d+)") + rf"(?:\.({_SUFFIXES}))?")


def _parameter(name: str, patterns: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, target in patterns:
        match = pattern.fullmatch(name)
        if match:
            *block, kind = match.groups()
            stem = target.replace("{}", block[0]) if block else target
            return stem if kind is None else f"{stem}.{kind}"
    return None
