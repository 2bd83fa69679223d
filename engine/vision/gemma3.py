"""Gemma 3 (``Gemma3ForConditionalGeneration``): its image processor, the text an image
stands for, and its encoder (a SigLIP tower and Gemma 3's projector).

Preprocessing follows transformers' Gemma 3 image processor (the PIL one, its oracle in
the tests) with pan-and-scan off, its default: the picture resized to the tower's
``size`` (896 x 896 in every release; the aspect ratio is not kept) with the folder's
``resample`` filter (bilinear) on 8-bit RGB, then x * rescale_factor, then
(x - mean) / std.

In the prompt an image is Gemma3Processor's expansion of its ``<start_of_image>``
marker: ``\\n\\n<start_of_image>``, ``mm_tokens_per_image`` soft tokens
(``<image_soft_token>``, whose rows the encoder's embeddings replace) and
``<end_of_image>\\n\\n``. Gemma 3's text model attends bidirectionally among one
image's soft tokens during prefill (``VisionParts.bidirectional``: the engine keeps the
run in one prefill chunk and lets its tokens see the whole run). The newlines join the
prompt's text around the marker when tokenized (``VisionParts.joins_text``), as the
processor tokenizes the whole expanded prompt.

The encoder: the tower's patch states [B, 64 * 64, D] (896 / 14 per side) are averaged
over k x k squares of the patch grid to ``mm_tokens_per_image`` tokens (k = 64 / 16),
normalized by Gemma's RMSNorm (scale 1 + weight, in float32) and multiplied by
``mm_input_projection_weight`` [D, text width]. The rows go into the prompt as they
are: transformers multiplies the token embeddings by sqrt(hidden) before it puts the
image rows in their place, so image rows are never scaled (GemmaForCausalLM.forward).

From a GGUF model's mmproj file (projector type "gemma3", ``build_from_mmproj``) the
tower's shape comes from ``clip.vision.*``, the pooling from
``clip.vision.projector.scale_factor`` (4 without it, as the converter writes it only
otherwise), the mean and std from ``image_mean`` / ``image_std``, the resize filter is
the processor's default (bilinear); the image tokens are the text model's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from engine.loaders.gguf.mmproj import MmprojHeader
from engine.vision.model import Preprocessed, VisionFamily, VisionParts, load_tower
from engine.vision.siglip import SiglipTower, TowerSpec
from engine.vision.vocab import added_tokens, image_token_ids

BOI, EOI, SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"


@dataclass(slots=True, frozen=True)
class Gemma3Processing:
    height: int
    width: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale: float
    resample: int  # a PIL resampling filter

    @classmethod
    def read(cls, folder: Path, image_size: int) -> Gemma3Processing:
        """From the folder's preprocessor_config.json (transformers' defaults where a
        key is missing; the size defaults to the tower's). ValueError for pan-and-scan,
        which Folio does not run."""
        path = folder / "preprocessor_config.json"
        raw = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        if raw.get("do_pan_and_scan"):
            raise ValueError(f"{path}: do_pan_and_scan is not supported (its crops each "
                             "take an image's tokens); save the processor without it")
        size = raw.get("size") or {}
        return cls(int(size.get("height", image_size)), int(size.get("width", image_size)),
                   tuple(raw.get("image_mean", (0.5, 0.5, 0.5))),
                   tuple(raw.get("image_std", (0.5, 0.5, 0.5))),
                   float(raw.get("rescale_factor", 1 / 255)),
                   int(raw.get("resample", Image.Resampling.BILINEAR)))


def preprocess(rgb: Image.Image, p: Gemma3Processing) -> torch.Tensor:
    """An RGB picture to its one frame [1, 3, height, width]."""
    picture = rgb.resize((p.width, p.height), p.resample)
    scaled = np.asarray(picture, dtype=np.float32) * p.rescale
    mean, std = np.asarray(p.mean, np.float32), np.asarray(p.std, np.float32)
    normalized = (scaled - mean) / std  # [H, W, 3]
    return torch.from_numpy(np.ascontiguousarray(normalized.transpose(2, 0, 1)))[None]


def image_text(num_tokens: int) -> str:
    """The prompt text of one image, as Gemma3Processor's ``full_image_sequence``."""
    return f"\n\n{BOI}{SOFT * num_tokens}{EOI}\n\n"


@dataclass(slots=True, frozen=True)
class Gemma3ImageProcessor:
    processing: Gemma3Processing
    num_tokens: int  # mm_tokens_per_image

    def preprocess(self, rgb: Image.Image) -> Preprocessed:
        return Preprocessed(image_text(self.num_tokens), preprocess(rgb, self.processing),
                            self.num_tokens)


class _Projector(nn.Module):
    """Gemma 3's multi-modal projector (names as ``model.multi_modal_projector.``)."""

    def __init__(self, width: int, text_width: int, eps: float, patches_per_side: int,
                 tokens_per_image: int) -> None:
        super().__init__()
        tokens_per_side = int(round(tokens_per_image ** 0.5))
        if tokens_per_side ** 2 != tokens_per_image or patches_per_side % tokens_per_side:
            raise ValueError(f"mm_tokens_per_image: {tokens_per_image} tokens do not pool "
                             f"a {patches_per_side} x {patches_per_side} patch grid evenly")
        self.side = patches_per_side
        self.kernel = patches_per_side // tokens_per_side
        self.eps = eps
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(width, text_width))
        self.mm_soft_emb_norm = nn.Module()
        self.mm_soft_emb_norm.weight = nn.Parameter(torch.zeros(width))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        # states [B, side * side, D] -> grid [B, D, side, side] -> pooled [B, T, D]
        b, _, d = states.shape
        grid = states.transpose(1, 2).reshape(b, d, self.side, self.side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        x = pooled.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = (x * (1.0 + self.mm_soft_emb_norm.weight.float())).to(states.dtype)
        return torch.matmul(normed, self.mm_input_projection_weight)


class Gemma3Encoder(nn.Module):
    """``forward(frames)``: frames [N, 3, S, S] -> image token embeddings
    [N * mm_tokens_per_image, text width]. Names as ``checkpoint_names`` gives the
    folder's: ``vision_tower.`` and ``multi_modal_projector.``."""

    def __init__(self, spec: TowerSpec, text_width: int, tokens_per_image: int) -> None:
        super().__init__()
        self.spec = spec
        self.vision_tower = SiglipTower(spec)
        self.multi_modal_projector = _Projector(
            spec.hidden_size, text_width, spec.layer_norm_eps,
            spec.image_size // spec.patch_size, tokens_per_image)

    @property
    def tower(self) -> SiglipTower:
        return self.vision_tower

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        tokens = self.multi_modal_projector(self.tower(frames))
        return tokens.reshape(-1, tokens.shape[-1])

    def encode(self, frames: torch.Tensor, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
        return self(frames.to(device, dtype))

    def placed(self, compute: torch.dtype) -> None:
        """After the module's move to the model's dtype: a float32 tower asked to compute
        in bfloat16 (model.tower_dtype) runs its matmuls and attention in bfloat16, its
        residual stream and norms staying float32."""
        if compute == torch.bfloat16 and self.tower.embeddings.patch_embedding.weight.dtype \
                == torch.float32:
            self.tower.use_matmul_dtype(torch.bfloat16)


def _token_strings(folder: Path, config) -> tuple[str, str, str]:
    """The boi, eoi and soft token strings by the config's ids in tokenizer.json's added
    tokens (Gemma 3's own strings where a file lacks them)."""
    path = folder / "tokenizer.json"
    names = added_tokens(path) if path.is_file() else {}
    return (names.get(int(config.boi_token_index), BOI),
            names.get(int(config.eoi_token_index), EOI),
            names.get(int(config.image_token_index), SOFT))


def _load(folder: Path, config, state: dict[str, torch.Tensor]) -> VisionParts:
    boi, eoi, soft = _token_strings(folder, config)
    if (boi, eoi, soft) != (BOI, EOI, SOFT):
        raise ValueError(f"{folder}: the image tokens are {(boi, eoi, soft)}, not Gemma 3's "
                         f"{(BOI, EOI, SOFT)}")
    spec = TowerSpec.of(config.vision_config)
    tokens = int(config.mm_tokens_per_image)
    encoder = Gemma3Encoder(spec, config.text_config.hidden_size, tokens)
    load_tower(encoder, checkpoint_names(state), str(folder))
    processor = Gemma3ImageProcessor(Gemma3Processing.read(folder, spec.image_size), tokens)
    return VisionParts(encoder, processor, BOI, int(config.image_token_index),
                       marker_token_id=int(config.boi_token_index), bidirectional=True,
                       joins_text=True)


def checkpoint_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tower tensors under Gemma3Encoder's names. transformers 5 saves the tower as
    ``vision_tower.embeddings...``, the released checkpoints (and transformers 4) as
    ``vision_tower.vision_model.embeddings...``; a SigLIP pooling head
    (``vision_tower.head.``, vision_use_head) is never read by Gemma 3."""
    out = {}
    for name, tensor in state.items():
        name = name.replace("vision_tower.vision_model.", "vision_tower.", 1)
        if not name.startswith("vision_tower.head."):
            out[name] = tensor
    return out


def build_from_mmproj(header: MmprojHeader, state: dict[str, torch.Tensor], tokenizer,
                      text_hidden: int) -> VisionParts:
    """The parts from a ``gemma3`` mmproj file (engine/vision/mmproj.py): the tower's
    shape from ``clip.vision.*``, the pooling from ``projector.scale_factor`` (4 without
    it, as Gemma3VisionModel writes it only when it differs), the soft-embedding norm's
    weight less the 1 the converter added, the image tokens' ids from the GGUF model's
    own vocabulary. The resize filter is the processor's default (bilinear): no key
    carries it."""
    where = str(header.path)
    # ggml's GELU is the tanh approximation, SigLIP's own in Gemma 3.
    spec = TowerSpec(int(header.require("embedding_length")),
                     int(header.require("feed_forward_length")),
                     int(header.require("block_count")),
                     int(header.require("attention.head_count")),
                     int(header.require("image_size")), int(header.require("patch_size")),
                     float(header.key("attention.layer_norm_epsilon", 1e-6)),
                     "gelu_pytorch_tanh")
    side = spec.image_size // spec.patch_size
    scale = int(header.key("projector.scale_factor", 4))
    if scale < 1 or side % scale:
        raise ValueError(f"{where}: clip.vision.projector.scale_factor {scale} does not "
                         f"pool a {side} x {side} patch grid evenly")
    tokens = (side // scale) ** 2
    encoder = Gemma3Encoder(spec, text_hidden, tokens)
    load_tower(encoder, _checkpoint_layout(state), where)
    processing = Gemma3Processing(spec.image_size, spec.image_size, header.triple("image_mean"),
                                  header.triple("image_std"), 1 / 255,
                                  int(Image.Resampling.BILINEAR))
    ids = image_token_ids(tokenizer, [BOI, EOI, SOFT], where)
    return VisionParts(encoder, Gemma3ImageProcessor(processing, tokens), BOI, ids[SOFT],
                       marker_token_id=ids[BOI], bidirectional=True, joins_text=True)


def _checkpoint_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The file's tensors under Gemma3Encoder's names: the projection a bare parameter
    (``mm_input_projection_weight``), the soft-embedding norm's stored 1 + w back to w."""
    out = dict(state)
    projection = "multi_modal_projector.mm_input_projection"
    if f"{projection}.weight" in out:
        out[f"{projection}_weight"] = out.pop(f"{projection}.weight")
    norm = "multi_modal_projector.mm_soft_emb_norm.weight"
    if norm in out:
        out[norm] = out[norm] - 1
    return out



GEMMA3 = VisionFamily("Gemma3ForConditionalGeneration",
                      ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                       "model.multi_modal_projector."), _load, cpu_bfloat16=True)
