"""Qwen3.5 (``Qwen3_5ForConditionalGeneration``) and Qwen3.5-MoE
(``Qwen3_5MoeForConditionalGeneration``: the same vision config, tower and tensor names
beside a sparse text model): a folder's image settings, its preprocessing, and the text
an image stands for in the prompt.

Preprocessing follows transformers' Qwen2-VL image processor (the PIL one, Qwen3.5's,
its oracle in the tests): the picture resized to the nearest sides that are multiples of
``patch * merge`` ("smart resize": each side rounded, then the whole scaled into
[min_pixels, max_pixels] keeping the aspect), bicubic on 8-bit RGB, x * rescale, then
(x - mean) / std, then cut into patches written as the tower reads them (``patchify``:
each patch repeated ``temporal_patch_size`` times, as a still frame of a video is).

In the prompt an image is ``<|vision_start|><|image_pad|><|vision_end|>`` (what the
family's template writes for an image part), its ``<|image_pad|>`` expanded to one token
per merged patch; those tokens then take 3-D rotary positions (engine/core/mrope.py:
the image's rows x cols of tokens is its ``ImageSpan.grid``).

From a GGUF model's mmproj file (projector type "qwen3vl_merger", ``build_from_mmproj``)
the tower's shape comes from ``clip.vision.*`` (``spatial_merge_size``, 2 without it) and
its tensors (the position table's length, the two temporal slices of the patch kernel);
the mean and std from ``image_mean`` / ``image_std``; the pixel bounds from
``image_min_pixels`` / ``image_max_pixels`` where the file has them, else
transformers' defaults, as for a folder whose processor names none. The image tokens
are the text model's ``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``.
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
from engine.vision.model import Preprocessed, VisionFamily, VisionParts, load_tower
from engine.vision.qwen35_tower import Qwen35Encoder, Qwen35TowerSpec

IMAGE_PAD = "<|image_pad|>"
MARKER_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"
# transformers' defaults (Qwen2-VL's image processor) where a folder sets none.
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT = 200


@dataclass(slots=True, frozen=True)
class Qwen35Processing:
    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale: float
    resample: int  # a PIL resampling filter (bicubic in every release)

    @classmethod
    def read(cls, folder: Path, tower: Qwen35TowerSpec) -> Qwen35Processing:
        """From the folder's preprocessor_config.json (the tower's patch sizes, and
        transformers' defaults for the rest, where a key is missing)."""
        path = folder / "preprocessor_config.json"
        raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        size = raw.get("size") or {}
        return cls(int(raw.get("min_pixels") or size.get("shortest_edge") or MIN_PIXELS),
                   int(raw.get("max_pixels") or size.get("longest_edge") or MAX_PIXELS),
                   int(raw.get("patch_size", tower.patch_size)),
                   int(raw.get("temporal_patch_size", tower.temporal_patch_size)),
                   int(raw.get("merge_size", tower.merge_size)),
                   tuple(raw.get("image_mean", CLIP_MEAN)), tuple(raw.get("image_std", CLIP_STD)),
                   float(raw.get("rescale_factor", 1 / 255)),
                   int(raw.get("resample", Image.Resampling.BICUBIC)))

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


@dataclass(slots=True, frozen=True)
class PatchGrid:
    """One image preprocessed: its patches [rows * cols, 3 * T * p * p] (merge-block
    order) and its grid of rows x cols patches."""

    pixels: torch.Tensor
    rows: int
    cols: int


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """Sides that are multiples of ``factor``, near the picture's, with an area in
    [min_pixels, max_pixels] and about its aspect. ValueError for a picture longer than
    200 times its width (or the other way)."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"image: {width} x {height} is longer than {MAX_ASPECT} times its "
                         "other side")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def preprocess(rgb: Image.Image, p: Qwen35Processing) -> PatchGrid:
    """An RGB picture to its patches (see the module docstring)."""
    height, width = smart_resize(rgb.height, rgb.width, p.factor, p.min_pixels, p.max_pixels)
    picture = rgb.resize((width, height), p.resample)
    scaled = np.asarray(picture, dtype=np.float32) * np.float32(p.rescale)
    mean, std = np.asarray(p.mean, np.float32), np.asarray(p.std, np.float32)
    normalized = ((scaled - mean) / std).transpose(2, 0, 1)  # [3, H, W]
    return patchify(np.ascontiguousarray(normalized), p)


def patchify(image: np.ndarray, p: Qwen35Processing) -> PatchGrid:
    """image [C, H, W] -> patches [rows * cols, C * T * p * p]: patch (r, c) at the place
    of its merge square (squares row by row, cells row by row within), its pixels channel
    by channel, each channel's p x p block repeated T times."""
    c, height, width = image.shape
    s, m, t = p.patch_size, p.merge_size, p.temporal_patch_size
    rows, cols = height // s, width // s
    blocks = image.reshape(c, rows // m, m, s, cols // m, m, s).transpose(1, 4, 2, 5, 0, 3, 6)
    repeated = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, s, s))
    flat = np.ascontiguousarray(repeated).reshape(rows * cols, c * t * s * s)
    return PatchGrid(torch.from_numpy(flat), rows, cols)


@dataclass(slots=True, frozen=True)
class Qwen35Processor:
    """A picture to its patches, its prompt text and its token count."""

    processing: Qwen35Processing

    def preprocess(self, rgb: Image.Image) -> Preprocessed:
        grid = preprocess(rgb, self.processing)
        m = self.processing.merge_size
        token_grid = (grid.rows // m, grid.cols // m)
        count = token_grid[0] * token_grid[1]
        return Preprocessed(IMAGE_PAD * count, grid, count, token_grid)


def _load(folder: Path, config, state: dict[str, torch.Tensor]) -> VisionParts:
    spec = Qwen35TowerSpec.of(config.vision_config)
    processing = Qwen35Processing.read(folder, spec)
    if (processing.patch_size, processing.temporal_patch_size, processing.merge_size) != \
            (spec.patch_size, spec.temporal_patch_size, spec.merge_size):
        raise ValueError(f"{folder}: preprocessor_config.json's patch_size, "
                         "temporal_patch_size and merge_size differ from vision_config's")
    encoder = Qwen35Encoder(spec)
    load_tower(encoder, state, str(folder))
    return VisionParts(encoder, Qwen35Processor(processing), IMAGE_PAD,
                       int(config.image_token_id), MARKER_TEXT)


def build_from_mmproj(header: MmprojHeader, state: dict[str, torch.Tensor], tokenizer,
                      text_hidden: int) -> VisionParts:
    """The parts from an mmproj file's keys and tensors (engine/vision/mmproj.py; see the
    module docstring), the image tokens' ids from the GGUF model's own vocabulary."""
    from engine.vision.vocab import image_token_ids

    where = str(header.path)
    kernel = "visual.patch_embed.proj.weight"
    if kernel not in state or f"{kernel}.1" not in state:
        raise ValueError(f"{where}: the mmproj file lacks v.patch_embd.weight or its second "
                         "temporal slice, v.patch_embd.weight.1")
    # [D, C, p, p] twice -> the Conv3d's [D, C, T, p, p]
    state = dict(state)
    state[kernel] = torch.stack([state[kernel], state.pop(f"{kernel}.1")], dim=2)
    table = state.get("visual.pos_embed.weight")
    spec = Qwen35TowerSpec(
        int(header.require("block_count")), int(header.require("embedding_length")),
        int(header.require("feed_forward_length")), int(header.require("attention.head_count")),
        int(header.require("patch_size")), 2, int(header.key("spatial_merge_size", 2)),
        0 if table is None else table.shape[0], text_hidden, "gelu_pytorch_tanh", 10000.0)
    if spec.hidden_size % spec.num_heads or (spec.hidden_size // spec.num_heads) % 4:
        raise ValueError(f"{where}: clip.vision.attention.head_count {spec.num_heads}: the "
                         "head width must be a multiple of 4")
    encoder = Qwen35Encoder(spec)
    load_tower(encoder, state, where)
    processing = Qwen35Processing(
        int(header.key("image_min_pixels", MIN_PIXELS)),
        int(header.key("image_max_pixels", MAX_PIXELS)), spec.patch_size,
        spec.temporal_patch_size, spec.merge_size, header.triple("image_mean", CLIP_MEAN),
        header.triple("image_std", CLIP_STD), 1 / 255, int(Image.Resampling.BICUBIC))
    ids = image_token_ids(tokenizer, ["<|vision_start|>", IMAGE_PAD, "<|vision_end|>"], where)
    return VisionParts(encoder, Qwen35Processor(processing), IMAGE_PAD, ids[IMAGE_PAD],
                       MARKER_TEXT)



# bfloat16 on the CPU: engine/bench/vision_qwen35.py measures it and its tolerance.
QWEN35 = VisionFamily("Qwen3_5ForConditionalGeneration", ("model.visual.",), _load,
                      cpu_bfloat16=True)
# transformers 5's Qwen3.5-MoE vision model is the dense one's, line for line.
QWEN35_MOE = VisionFamily("Qwen3_5MoeForConditionalGeneration", ("model.visual.",), _load,
                          cpu_bfloat16=True)
