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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from engine.vision.gemma4_tower import Gemma4Encoder, Gemma4TowerSpec
from engine.vision.model import (
    Preprocessed,
    VisionFamily,
    VisionParts,
    VisionUnavailable,
    load_tower,
)

SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)  # the budgets Gemma 4 was trained with


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
    try:
        added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the image tokens ({exc})") from exc
    by_id = {t.get("id"): t.get("content") for t in added if isinstance(t, dict)}
    missing = [what for what, i in ids.items() if not isinstance(by_id.get(i), str)]
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


GEMMA4 = VisionFamily("Gemma4ForConditionalGeneration",
                      ("model.vision_tower.", "model.embed_vision."), _load)
