"""A loaded model's eyes: ``VisionModel`` prepares an image for a prompt (on the
caller's thread) and encodes it (on the engine's), whatever the family; the types every
family module builds (``VisionFamily``, ``VisionParts``) and what they share
(``load_tower``, ``placed_model``, ``tower_dtype``). Which family a folder is, and its
loading, is load.py's.

A family gives two objects:
- an ``ImageProcessor``: a decoded picture to the prompt text it stands for, its pixels
  in the form its encoder takes and how many image tokens (embedding rows) that text
  holds (transformers' image processor for the family is its oracle);
- an encoder (a ``torch.nn.Module``): ``encode(pixels)`` -> [num_tokens, text width].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from PIL import Image

from engine.vision.decode import DecodedImage


class VisionUnavailable(ValueError):
    """A multimodal folder whose images Folio cannot place (its tokenizer lacks the image
    tokens, a variant not run yet): it loads as the text model it also is."""


@dataclass(slots=True, frozen=True)
class PreparedImage:
    """An image ready for a prompt: its content key, the prompt text it stands for, its
    pixels as the family's encoder takes them and how many image tokens that text
    holds."""

    key: bytes
    text: str
    pixels: object
    num_tokens: int
    grid: tuple[int, int] | None = None  # Preprocessed.grid


@dataclass(slots=True, frozen=True)
class Preprocessed:
    """What a family's processor makes of one picture (``PreparedImage`` without the
    key)."""

    text: str
    pixels: object
    num_tokens: int
    # The image tokens' rows x cols, for a text model that places them in 2-D (M-RoPE,
    # engine/core/mrope.py); None where image tokens take positions like text.
    grid: tuple[int, int] | None = None


class ImageProcessor(Protocol):
    def preprocess(self, rgb: Image.Image) -> Preprocessed: ...


class ImageEncoder(Protocol):
    def encode(self, pixels: object, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor: ...

    def parameters(self): ...


@dataclass(slots=True, frozen=True)
class VisionParts:
    """A family loader's answer: the pieces ``VisionModel`` holds."""

    encoder: ImageEncoder
    processor: ImageProcessor
    image_token: str  # the token the processor expands, one per image
    image_token_id: int  # the id of the rows the encoder's embeddings replace
    # What an image part becomes in the text the template sees (None: image_token);
    # Qwen's wraps its pad token in vision start and end tokens.
    marker_text: str | None = None
    # The marker's id where it is not the image token's (Gemma 3's <start_of_image>).
    marker_token_id: int | None = None
    # Whether one image's run of image tokens attends to itself bidirectionally in the
    # text model (Gemma 3), not causally (ImageSpan.joint).
    bidirectional: bool = False
    # Whether that holds in the sliding-window layers only, the global ones causal
    # (Gemma 4's "vision" mode); the runner gives the run's key limits to those groups.
    bidirectional_in_windows: bool = False
    # Whether an image's text opens or closes with plain text that the tokenizer joins
    # with the prompt's (Gemma 3's "\n\n"): expand_images tokenizes them together.
    joins_text: bool = False


# A family's loader: (folder, its transformers config, its tower tensors by the names
# under the architecture's prefix) -> its parts, built in float32 on the CPU.
VisionLoader = Callable[[Path, object, dict[str, torch.Tensor]], VisionParts]


@dataclass(slots=True, frozen=True)
class VisionFamily:
    architecture: str
    tower_prefixes: tuple[str, ...]  # the checkpoint's tower and projector tensors
    load: VisionLoader
    # Its tower computes in bfloat16 on a CPU with bfloat16 matrix units (AMX,
    # AVX512-BF16) when the model computes in float32: where ``folio bench vision``
    # measured it faster, its output within a stated tolerance of float32's.
    cpu_bfloat16: bool = False


class VisionModel:
    def __init__(self, parts: VisionParts, dtype: torch.dtype, device: torch.device,
                 encoder_dtype: torch.dtype | None = None) -> None:
        """``dtype``: the text model's (the embeddings' dtype); ``encoder_dtype``: the
        tower's compute dtype (None: the same)."""
        self.encoder = parts.encoder
        self.processor = parts.processor
        self.image_token = parts.image_token
        self.image_token_id = parts.image_token_id
        self.marker_text = parts.marker_text or parts.image_token
        self.marker_id = (parts.image_token_id if parts.marker_token_id is None
                          else parts.marker_token_id)
        self.bidirectional = parts.bidirectional
        self.bidirectional_in_windows = parts.bidirectional_in_windows
        self.joins_text = parts.joins_text
        self.dtype = dtype
        self.encoder_dtype = encoder_dtype or dtype
        self.device = device

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.encoder.parameters())

    def prepare(self, image: DecodedImage) -> PreparedImage:
        done = self.processor.preprocess(image.image)
        return PreparedImage(image.key, done.text, done.pixels, done.num_tokens, done.grid)

    @torch.inference_mode()
    def encode(self, image: PreparedImage) -> torch.Tensor:
        """The image's token embeddings [num_tokens, text width], in one run."""
        rows = self.encoder.encode(image.pixels, self.encoder_dtype, self.device)
        return rows.to(self.dtype)


def placed_model(parts: VisionParts, family, dtype: torch.dtype,
                 device: torch.device | str, encoder_dtype: torch.dtype | None
                 ) -> VisionModel:
    """The parts' encoder moved to ``device`` in its compute dtype (``encoder_dtype``, else
    ``tower_dtype``'s choice for ``family``: anything with ``cpu_bfloat16``), as a
    VisionModel; a folder's tower and an mmproj file's alike."""
    device = torch.device(device)
    encoder_dtype = encoder_dtype or tower_dtype(family, dtype, device)
    placed = getattr(parts.encoder, "placed", None)
    if placed is None:
        parts.encoder.to(device=device, dtype=encoder_dtype).eval()
    else:
        # An encoder that takes a compute dtype its own way (Gemma 3's: bfloat16 matmuls
        # under a float32 residual stream) keeps the model's dtype at its ends.
        parts.encoder.to(device=device, dtype=dtype).eval()
        placed(encoder_dtype)
        encoder_dtype = dtype
    return VisionModel(parts, dtype, device, encoder_dtype)


def tower_dtype(family: VisionFamily, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """bfloat16 for a ``cpu_bfloat16`` family's tower on a CPU with bfloat16 matrix units
    when the model computes in float32; else the model's dtype. ``family``: anything with
    ``cpu_bfloat16`` (an mmproj projector entry too)."""
    if family.cpu_bfloat16 and device.type == "cpu" and dtype == torch.float32 and \
            (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()):
        return torch.bfloat16
    return dtype


def load_tower(module: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """``module`` filled from ``state`` by name; ValueError naming what does not fit."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{where}: the vision tower's weights do not fit its config "
                         f"(missing: {missing[:3]}, unexpected: {unexpected[:3]})")
