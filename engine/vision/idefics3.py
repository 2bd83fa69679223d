"""SmolVLM / Idefics3 (``Idefics3ForConditionalGeneration``): a folder's image settings,
its preprocessing, and the text an image stands for in the prompt.

Preprocessing follows transformers' Idefics3 image processor (the PIL one, its oracle in
the tests): the picture's longer side scaled to ``size["longest_edge"]`` (the shorter
one rounded up to even), then, with ``do_image_splitting``, scaled up to whole tiles of
``max_image_size["longest_edge"]`` and cut into rows x cols tiles plus the whole picture
squeezed to one tile (the "global" image); without splitting, the picture squeezed to
one tile. Resizing is Lanczos on 8-bit RGB, then x / 255, then (x - mean) / std.
From a GGUF model's mmproj file (projector type "idefics3", ``build_from_mmproj``) the
same settings come from its keys, as llama.cpp reads them: ``clip.vision.image_size`` is
the tile, ``preproc_image_size`` the first resize, and images are always split.

In the prompt an image is the processor's text: per tile ``<fake_token_around_image>
<row_r_col_c>`` then the tile's ``<image>`` tokens, a newline after each row, then
``<fake_token_around_image><global-img>``, the global image's tokens and
``<fake_token_around_image>`` (only the last part for an unsplit image).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from engine.loaders.gguf.mmproj import MmprojHeader
from engine.vision.model import Preprocessed, VisionFamily, VisionParts, load_tower
from engine.vision.siglip import SiglipTower, TowerSpec

IMAGE_TOKEN = "<image>"
FAKE_TOKEN = "<fake_token_around_image>"
GLOBAL_TAG = "<global-img>"
# transformers' cap on the longer side after the first resize.
MAX_IMAGE_SIZE = 4096


@dataclass(slots=True, frozen=True)
class Idefics3Processing:
    longest_edge: int  # size["longest_edge"]: the first resize
    tile: int  # max_image_size["longest_edge"]: one frame's side
    split: bool  # do_image_splitting
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale: float
    resample: int  # a PIL resampling filter (Lanczos in every Idefics3 release)

    @classmethod
    def read(cls, folder: Path) -> Idefics3Processing:
        """From the folder's preprocessor_config.json (transformers' defaults where a key
        is missing)."""
        path = folder / "preprocessor_config.json"
        raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        return cls(int(raw.get("size", {}).get("longest_edge", 4 * 364)),
                   int(raw.get("max_image_size", {}).get("longest_edge", 364)),
                   bool(raw.get("do_image_splitting", True)),
                   tuple(raw.get("image_mean", (0.5, 0.5, 0.5))),
                   tuple(raw.get("image_std", (0.5, 0.5, 0.5))),
                   float(raw.get("rescale_factor", 1 / 255)),
                   int(raw.get("resample", Image.Resampling.LANCZOS)))


@dataclass(slots=True, frozen=True)
class Frames:
    """One image preprocessed: its frames [rows * cols (+1 global), 3, tile, tile] (the
    tiles row by row, the global image last) and its tile grid (0 x 0: not split)."""

    pixels: torch.Tensor
    rows: int
    cols: int


def preprocess(rgb: Image.Image, p: Idefics3Processing) -> Frames:
    """An RGB picture to its frames (see the module docstring)."""
    width, height = rgb.size
    height, width = _longest_to(height, width, p.longest_edge)
    height, width = _bounded(height, width, MAX_IMAGE_SIZE)
    picture = rgb.resize((width, height), p.resample)
    rows = cols = 0
    frames: list[Image.Image] = []
    if p.split:
        height, width = _whole_tiles(height, width, p.tile)
        picture = picture.resize((width, height), p.resample)
        if height > p.tile or width > p.tile:
            rows, cols = height // p.tile, width // p.tile
            frames = [picture.crop((c * p.tile, r * p.tile, (c + 1) * p.tile, (r + 1) * p.tile))
                      for r in range(rows) for c in range(cols)]
    frames.append(picture.resize((p.tile, p.tile), p.resample))
    scaled = np.stack([np.asarray(f, dtype=np.float32) for f in frames]) * p.rescale
    mean, std = np.asarray(p.mean, np.float32), np.asarray(p.std, np.float32)
    normalized = (scaled - mean) / std  # [N, tile, tile, 3]
    return Frames(torch.from_numpy(np.ascontiguousarray(normalized.transpose(0, 3, 1, 2))),
                  rows, cols)


@dataclass(slots=True, frozen=True)
class Idefics3Processor:
    """A picture to its frames, its prompt text and its token count."""

    processing: Idefics3Processing
    tokens_per_frame: int

    def preprocess(self, rgb: Image.Image) -> Preprocessed:
        frames = preprocess(rgb, self.processing)
        return Preprocessed(image_text(frames.rows, frames.cols, self.tokens_per_frame),
                            frames, self.tokens_per_frame * frames.pixels.shape[0])


def image_text(rows: int, cols: int, tokens_per_frame: int) -> str:
    """The prompt text one image stands for (see the module docstring)."""
    images = IMAGE_TOKEN * tokens_per_frame
    text = ""
    if rows or cols:
        for r in range(rows):
            text += "".join(f"{FAKE_TOKEN}<row_{r + 1}_col_{c + 1}>{images}"
                            for c in range(cols))
            text += "\n"
        text += "\n"
    return f"{text}{FAKE_TOKEN}{GLOBAL_TAG}{images}{FAKE_TOKEN}"


def _longest_to(height: int, width: int, longest: int) -> tuple[int, int]:
    """The longer side set to ``longest``, the other kept in proportion and made even."""
    ratio = width / height
    if width >= height:
        width, height = longest, int(longest / ratio)
        height += height % 2
    else:
        height, width = longest, int(longest * ratio)
        width += width % 2
    return max(height, 1), max(width, 1)


def _bounded(height: int, width: int, bound: int) -> tuple[int, int]:
    """Scaled down so that the longer side is at most ``bound``."""
    ratio = width / height
    if width >= height and width > bound:
        width, height = bound, int(bound / ratio)
    elif height > width and height > bound:
        height, width = bound, int(bound * ratio)
    return max(height, 1), max(width, 1)


def _whole_tiles(height: int, width: int, tile: int) -> tuple[int, int]:
    """Both sides rounded up to whole tiles, the longer first and the other from it."""
    ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * ratio) / tile) * tile
    return height, width


class _Connector(nn.Module):
    """Idefics3's pixel-shuffle connector: it folds each ``scale x scale`` square of
    patch states into one state ``scale**2`` times as wide and projects it to the text
    model's width, so a frame of ``(size / patch)**2`` patches becomes
    ``(size / patch / scale)**2`` image tokens."""

    def __init__(self, width: int, scale: int, text_width: int) -> None:
        super().__init__()
        self.scale = scale
        self.modality_projection = nn.Module()
        self.modality_projection.proj = nn.Linear(width * scale ** 2, text_width, bias=False)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """states [B, side * side, D] (side = patches per frame side) ->
        [B, (side / s)**2, text width]: token (i, j) holds the patches of rows
        i*s .. i*s+s-1 and columns j*s .. j*s+s-1, row by row, each patch's D channels
        together."""
        b, p, d = states.shape
        s = self.scale
        side = int(round(p ** 0.5))
        if side * side != p or side % s:
            raise ValueError(f"a frame of {p} patches cannot be folded by {s}")
        folded = (states.view(b, side // s, s, side // s, s, d)
                  .permute(0, 1, 3, 2, 4, 5)
                  .reshape(b, (side // s) ** 2, s * s * d))
        return self.modality_projection.proj(folded)


class Idefics3Encoder(nn.Module):
    """``forward(frames)``: frames [N, 3, S, S] (preprocessed, equal size) -> image
    token embeddings [N * tokens_per_frame(S), text width], frame after frame. Names
    as the checkpoint's under ``model.vision_model.`` and ``model.connector.``; the
    tower reads frames of any size by fractional positions."""

    def __init__(self, spec: TowerSpec, scale: int, text_width: int) -> None:
        super().__init__()
        self.spec = spec
        self.vision_model = SiglipTower(spec, fractional_positions=True)
        self.connector = _Connector(spec.hidden_size, scale, text_width)

    def tokens_per_frame(self, frame_size: int) -> int:
        side = frame_size // self.spec.patch_size
        return (side // self.connector.scale) ** 2

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        tokens = self.connector(self.vision_model(frames))
        return tokens.reshape(-1, tokens.shape[-1])

    def encode(self, frames, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``frames``: an image's ``Frames``, all encoded in one run."""
        return self(frames.pixels.to(device, dtype))


def _load(folder: Path, config, state: dict[str, torch.Tensor]) -> VisionParts:
    encoder = Idefics3Encoder(TowerSpec.of(config.vision_config), int(config.scale_factor),
                              config.text_config.hidden_size)
    load_tower(encoder, state, str(folder))
    processing = Idefics3Processing.read(folder)
    processor = Idefics3Processor(processing, encoder.tokens_per_frame(processing.tile))
    return VisionParts(encoder, processor, IMAGE_TOKEN, int(config.image_token_id))


def build_from_mmproj(header: MmprojHeader, state: dict[str, torch.Tensor], tokenizer,
                      text_hidden: int) -> VisionParts:
    """The parts from an mmproj file's keys and tensors (engine/vision/mmproj.py), the
    image tokens' ids from the GGUF model's own vocabulary."""
    from engine.vision.vocab import image_token_ids

    tile = int(header.require("image_size"))
    longest = int(header.key("preproc_image_size") or 4 * tile)  # transformers' default
    # ggml's GELU is the tanh approximation, what Idefics3's towers were trained with.
    spec = TowerSpec(int(header.require("embedding_length")),
                     int(header.require("feed_forward_length")),
                     int(header.require("block_count")),
                     int(header.require("attention.head_count")), tile,
                     int(header.require("patch_size")),
                     float(header.key("attention.layer_norm_epsilon", 1e-6)),
                     "gelu_pytorch_tanh")
    encoder = Idefics3Encoder(spec, int(header.key("projector.scale_factor", 2)), text_hidden)
    load_tower(encoder, state, str(header.path))
    processing = Idefics3Processing(longest, tile, True, header.triple("image_mean"),
                                    header.triple("image_std"), 1 / 255,
                                    int(Image.Resampling.LANCZOS))
    side = math.ceil(min(longest, MAX_IMAGE_SIZE) / tile)  # the most tiles a side gets
    grid = [f"<row_{r}_col_{c}>" for r in range(1, side + 1) for c in range(1, side + 1)]
    ids = image_token_ids(tokenizer, [IMAGE_TOKEN, FAKE_TOKEN, GLOBAL_TAG, *grid],
                          str(header.path))
    return VisionParts(encoder, Idefics3Processor(processing, encoder.tokens_per_frame(tile)),
                       IMAGE_TOKEN, ids[IMAGE_TOKEN])



IDEFICS3 = VisionFamily("Idefics3ForConditionalGeneration",
                        ("model.vision_model.", "model.connector."), _load)
