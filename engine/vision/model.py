"""A loaded model's eyes: ``VisionModel`` prepares an image for a prompt (on the
caller's thread) and encodes it (on the engine's), whatever the family.

``load_vision(folder)`` is None for a folder without a vision tower Folio runs. For a
multimodal folder it finds the architecture's ``VisionFamily`` in ``FAMILIES`` (one
module per family under engine/vision) and asks it for the family's encoder, processor
and image marker, built from the folder's tower tensors (which the text loader skips).

A family gives two objects:
- an ``ImageProcessor``: a decoded picture to the prompt text it stands for, its pixels
  in the form its encoder takes and how many image tokens (embedding rows) that text
  holds (transformers' image processor for the family is its oracle);
- an encoder (a ``torch.nn.Module``): ``encode(pixels)`` -> [num_tokens, text width].
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from PIL import Image

from engine.vision.decode import DecodedImage


@dataclass(slots=True, frozen=True)
class PreparedImage:
    """An image ready for a prompt: its content key, the prompt text it stands for, its
    pixels as the family's encoder takes them and how many image tokens that text
    holds."""

    key: bytes
    text: str
    pixels: object
    num_tokens: int


@dataclass(slots=True, frozen=True)
class Preprocessed:
    """What a family's processor makes of one picture (``PreparedImage`` without the
    key)."""

    text: str
    pixels: object
    num_tokens: int


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
    image_token: str  # the marker the template sees, one per image
    image_token_id: int  # the id of the rows the encoder's embeddings replace
    # The marker's id where it is not the image token's (Gemma 3's <start_of_image>).
    marker_token_id: int | None = None
    # Whether one image's run of image tokens attends to itself bidirectionally in the
    # text model (Gemma 3), not causally (ImageSpan.joint).
    bidirectional: bool = False
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


class VisionModel:
    def __init__(self, parts: VisionParts, dtype: torch.dtype, device: torch.device) -> None:
        self.encoder = parts.encoder
        self.processor = parts.processor
        self.image_token = parts.image_token
        self.image_token_id = parts.image_token_id
        self.marker_id = (parts.image_token_id if parts.marker_token_id is None
                          else parts.marker_token_id)
        self.bidirectional = parts.bidirectional
        self.joins_text = parts.joins_text
        self.dtype = dtype
        self.device = device

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.encoder.parameters())

    def prepare(self, image: DecodedImage) -> PreparedImage:
        done = self.processor.preprocess(image.image)
        return PreparedImage(image.key, done.text, done.pixels, done.num_tokens)

    @torch.inference_mode()
    def encode(self, image: PreparedImage) -> torch.Tensor:
        """The image's token embeddings [num_tokens, text width], in one run."""
        return self.encoder.encode(image.pixels, self.dtype, self.device)


def _families() -> dict[str, VisionFamily]:
    from engine.vision.gemma3 import GEMMA3
    from engine.vision.idefics3 import IDEFICS3

    return {f.architecture: f for f in (IDEFICS3, GEMMA3)}


def load_vision(folder: Path, dtype: torch.dtype,
                device: torch.device | str = "cpu") -> VisionModel | None:
    """The folder's vision model, or None (a text model, a GGUF file, a tower Folio does
    not run). ValueError naming the tensor for a folder whose tower is incomplete."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not folder.is_dir() or not config_path.is_file():
        return None
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    families = _families()
    family = next((families[a] for a in raw.get("architectures") or () if a in families),
                  None)
    if family is None:
        return None
    from transformers import AutoConfig

    from engine.loaders.safetensors import safetensors_shards

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    state = tower_tensors(safetensors_shards(folder), family.tower_prefixes)
    parts = family.load(folder, config, state)
    parts.encoder.to(device=device, dtype=dtype).eval()
    placed = getattr(parts.encoder, "placed", None)
    if placed is not None:  # an encoder's own choices for where it runs (Gemma 3's)
        placed(dtype, torch.device(device))
    return VisionModel(parts, dtype, torch.device(device))


def load_tower(module: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """``module`` filled from ``state`` by name; ValueError naming what does not fit."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{where}: the vision tower's weights do not fit its config "
                         f"(missing: {missing[:3]}, unexpected: {unexpected[:3]})")


def tower_tensors(shards: list[Path], prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The shards' tensors under ``prefixes``, float32, named without their leading
    ``model.``."""
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                if name.startswith(prefixes):
                    state[name.removeprefix("model.")] = handle.get_tensor(name).float()
    return state
