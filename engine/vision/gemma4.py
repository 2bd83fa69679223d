"""Gemma 4 (``Gemma4ForConditionalGeneration``): a folder's image settings, its
preprocessing, and the text an image stands for in the prompt.

Preprocessing follows transformers' Gemma 4 image processor (the PIL one, its oracle in
the tests): the picture resized, keeping its aspect ratio, to the largest size whose
sides are whole multiples of ``pooling * patch`` pixels and whose patches fit the token
budget (``max_soft_tokens * pooling**2``), bicubic on 8-bit RGB, then x / 255 (no
normalization: the tower shifts its input itself), cut into patches row by row. So an
image's token count follows its shape, up to the budget.

In the prompt an image is the processor's text: the begin-of-image token, one image token
per soft token, the end-of-image token.

From a GGUF model's mmproj file (projector type "gemma4v", ``build_from_mmproj``) the
tower's shape comes from the file's keys and tensors: head size and KV heads from the
query and key matrices, the position tables' length from their tensor, clipped linears
and standardization from their tensors being there; the pooling from
``clip.vision.projector.scale_factor`` (3 without it, as llama.cpp), the rotary base 100
(llama.cpp's, which no key carries), the token budget from ``clip.vision.image_max_pixels``
(280 without it, the processor's default). The image tokens are the text model's
``<|image>``, ``<|image|>`` and ``<image|>``, as llama.cpp writes them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from engine.loaders.gguf.mmproj import MmprojHeader
from engine.vision.gemma4_tower import Gemma4Encoder, Gemma4TowerSpec
from engine.vision.model import (
    Preprocessed,
    VisionFamily,
    VisionParts,
    VisionUnavailable,
    load_tower,
)
from engine.vision.vocab import added_tokens, image_token_ids

SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)  # the budgets Gemma 4 was trained with
MMPROJ_TOKENS = ("<|image>", "<|image|>", "<image|>")  # begin, image, end


@dataclass(slots=True, frozen=True)
class Gemma4Patches:
    """One image cut into patches [rows * cols, 3 * p * p] (row in patch, column in
    patch, channel), the patch rows row by row, and the patch grid."""

    patches: torch.Tensor
    rows: int
    cols: int


@dataclass(slots=True, frozen=True)
class Gemma4Processing:
    patch: int
    pooling: int
    max_soft_tokens: int
    rescale: float
    resample: int

    @classmethod
    def read(cls, folder: Path) -> Gemma4Processing:
        """From the folder's preprocessor_config.json (transformers' defaults where a key
        is missing)."""
        path = folder / "preprocessor_config.json"
        raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        budget = int(raw.get("max_soft_tokens", 280))
        if budget not in SOFT_TOKEN_BUDGETS:
            raise ValueError(f"{path}: max_soft_tokens {budget} is not one of "
                             f"{SOFT_TOKEN_BUDGETS}")
        if raw.get("do_normalize"):
            raise ValueError(f"{path}: do_normalize is not supported for Gemma 4 (its "
                             "tower shifts its input itself)")
        return cls(int(raw.get("patch_size", 16)), int(raw.get("pooling_kernel_size", 3)),
                   budget, float(raw.get("rescale_factor", 1 / 255)),
                   int(raw.get("resample", Image.Resampling.BICUBIC)))


def fitted_size(height: int, width: int, p: Gemma4Processing) -> tuple[int, int]:
    """The size an image is resized to (see the module docstring); a sliver too thin
    for one whole square keeps one square across and as many along as its shape asks."""
    budget_px = p.max_soft_tokens * p.pooling ** 2 * p.patch ** 2
    factor = math.sqrt(budget_px / (height * width))
    side = p.pooling * p.patch
    new_h = int(math.floor(factor * height / side)) * side
    new_w = int(math.floor(factor * width / side)) * side
    longest = p.max_soft_tokens * side
    if new_h == 0 and new_w == 0:
        raise ValueError(f"an image of {width} x {height} cannot be fitted")
    if new_h == 0:
        new_h, new_w = side, min(width // height * side, longest)
    elif new_w == 0:
        new_w, new_h = side, min(height // width * side, longest)
    return new_h, new_w


def preprocess(rgb: Image.Image, p: Gemma4Processing) -> Gemma4Patches:
    width, height = rgb.size
    new_h, new_w = fitted_size(height, width, p)
    if (new_h, new_w) != (height, width):
        rgb = rgb.resize((new_w, new_h), p.resample)
    # [H, W, 3]; scaled in float64 then rounded, as the processor does
    pixels = (np.asarray(rgb, dtype=np.float64) * p.rescale).astype(np.float32)
    rows, cols = new_h // p.patch, new_w // p.patch
    patches = (pixels.reshape(rows, p.patch, cols, p.patch, 3)
               .transpose(0, 2, 1, 3, 4)
               .reshape(rows * cols, -1))
    return Gemma4Patches(torch.from_numpy(np.ascontiguousarray(patches)), rows, cols)


@dataclass(slots=True, frozen=True)
class Gemma4Processor:
    processing: Gemma4Processing
    begin: str  # the begin-of-image token's text
    image: str
    end: str

    def preprocess(self, rgb: Image.Image) -> Preprocessed:
        patches = preprocess(rgb, self.processing)
        tokens = patches.rows * patches.cols // self.processing.pooling ** 2
        return Preprocessed(f"{self.begin}{self.image * tokens}{self.end}", patches, tokens)


def added_token_texts(folder: Path, ids: dict[str, int]) -> dict[str, str]:
    """The texts of the tokenizer's added tokens ``ids`` (by what they are for), from
    the folder's tokenizer.json; VisionUnavailable naming the one it lacks."""
    path = folder / "tokenizer.json"
    by_id = added_tokens(path)
    missing = [what for what, i in ids.items() if i not in by_id]
    if missing:
        named = ", ".join(f"{w} {ids[w]}" for w in missing)
        raise VisionUnavailable(f"{path}: the tokenizer lacks the {', '.join(missing)} "
                                f"token(s) the config names ({named})")
    return {what: by_id[i] for what, i in ids.items()}


def _load(folder: Path, config, state: dict[str, torch.Tensor]) -> VisionParts:
    spec = Gemma4TowerSpec.of(config)
    encoder = Gemma4Encoder(spec)
    load_tower(encoder, state, str(folder))
    processing = Gemma4Processing.read(folder)
    if (processing.patch, processing.pooling) != (spec.patch_size, spec.pooling):
        raise ValueError(f"{folder}: the image processor's patch {processing.patch} and "
                         f"pooling {processing.pooling} differ from the tower's "
                         f"({spec.patch_size}, {spec.pooling})")
    texts = added_token_texts(folder, {"begin-of-image": config.boi_token_id,
                                       "image": config.image_token_id,
                                       "end-of-image": config.eoi_token_id})
    processor = Gemma4Processor(processing, texts["begin-of-image"], texts["image"],
                                texts["end-of-image"])
    # The larger releases' sliding layers read an image's tokens both ways (transformers'
    # use_bidirectional_attention "vision"), their global layers causally.
    both_ways = getattr(config.text_config, "use_bidirectional_attention", None) == "vision"
    return VisionParts(encoder, processor, texts["image"], int(config.image_token_id),
                       bidirectional=both_ways, bidirectional_in_windows=both_ways)


def build_from_mmproj(header: MmprojHeader, state: dict[str, torch.Tensor], tokenizer,
                      text_hidden: int) -> VisionParts:
    """The parts from an mmproj file's keys and tensors (engine/vision/mmproj.py; see the
    module docstring), the image tokens' ids from the GGUF model's own vocabulary."""
    where = str(header.path)
    patch = int(header.require("patch_size"))
    pooling = int(header.key("projector.scale_factor", 3))
    for key, want in (("image_mean", 0.0), ("image_std", 1.0)):
        values = header.key(key, [want] * 3)
        if [float(v) for v in values] != [want] * 3:
            raise ValueError(f"{where}: clip.vision.{key} {list(values)} is not supported "
                             f"for Gemma 4 (its tower shifts its input itself: {want} each)")
    state = _checkpoint_layout(state, patch)
    heads = int(header.require("attention.head_count"))
    layer = "vision_tower.encoder.layers.0.self_attn."
    if f"{layer}q_proj.linear.weight" not in state or f"{layer}k_proj.linear.weight" not in state:
        raise ValueError(f"{where}: the mmproj file has no v.blk.0.attn_q / attn_k tensors")
    head_dim = state[f"{layer}q_proj.linear.weight"].shape[0] // heads
    table = state.get("vision_tower.patch_embedder.position_embedding_table")
    spec = Gemma4TowerSpec(
        int(header.require("embedding_length")), int(header.require("feed_forward_length")),
        int(header.require("block_count")), heads,
        state[f"{layer}k_proj.linear.weight"].shape[0] // head_dim, head_dim, patch, pooling,
        0 if table is None else table.shape[1], 100.0,
        float(header.key("attention.layer_norm_epsilon", 1e-6)), "gelu_pytorch_tanh",
        any(name.endswith(".input_min") for name in state),
        "vision_tower.std_bias" in state, text_hidden)
    encoder = Gemma4Encoder(spec)
    load_tower(encoder, state, where)
    max_pixels = int(header.key("image_max_pixels", 280 * (pooling * patch) ** 2))
    budget = max_pixels // (pooling * patch) ** 2
    if budget not in SOFT_TOKEN_BUDGETS:
        raise ValueError(f"{where}: clip.vision.image_max_pixels {max_pixels} is a budget of "
                         f"{budget} soft tokens, not one of {SOFT_TOKEN_BUDGETS}")
    processing = Gemma4Processing(patch, pooling, budget, 1 / 255,
                                  int(Image.Resampling.BICUBIC))
    begin, image, end = MMPROJ_TOKENS
    ids = image_token_ids(tokenizer, list(MMPROJ_TOKENS), where)
    return VisionParts(encoder, Gemma4Processor(processing, begin, image, end), image,
                       ids[image])


def _checkpoint_layout(state: dict[str, torch.Tensor], patch: int) -> dict[str, torch.Tensor]:
    """The file's tensors in the checkpoint's shapes: linear weights under ``.linear``,
    the patch kernel [hidden, 3, p, p] flattened back to (row, column, channel), the
    position table without the ``.weight`` the converter adds, one-value ranges as
    scalars."""
    out = {}
    for name, tensor in state.items():
        if name.endswith("_proj.weight") and name.startswith("vision_tower.encoder."):
            name = name.removesuffix("weight") + "linear.weight"
        elif name == "vision_tower.patch_embedder.input_proj.weight" and tensor.dim() == 4:
            tensor = tensor.permute(0, 2, 3, 1).reshape(tensor.shape[0], 3 * patch * patch)
        elif name.endswith("position_embedding_table.weight"):
            name = name.removesuffix(".weight")
        elif name.endswith(("_min", "_max")) and tensor.numel() == 1:
            tensor = tensor.reshape(())
        out[name] = tensor
    return out


GEMMA4 = VisionFamily("Gemma4ForConditionalGeneration",
                      ("model.vision_tower.", "model.embed_vision."), _load)
