"""A loaded model's eyes: ``VisionModel`` prepares an image for a prompt (on the
caller's thread) and encodes it (on the engine's), for the one family that sees
images today, SmolVLM / Idefics3.

``load_vision(folder)`` is None for a folder without a vision tower Folio runs; for an
``Idefics3ForConditionalGeneration`` folder it reads the image settings, builds the
tower and the connector (engine/vision/siglip.py) and fills them from the folder's
``model.vision_model.*`` and ``model.connector.*`` tensors, which the text loader skips.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.models.registry import VISION_ARCHITECTURES
from engine.vision.decode import DecodedImage
from engine.vision.idefics3 import (
    IMAGE_TOKEN,
    Frames,
    Idefics3Processing,
    image_text,
    preprocess,
    tower_spec,
)
from engine.vision.siglip import Idefics3Encoder

_TOWER_PREFIXES = ("model.vision_model.", "model.connector.")


@dataclass(slots=True, frozen=True)
class PreparedImage:
    """An image ready for a prompt: its content key, the prompt text it stands for, its
    frames and how many image tokens (embedding rows) that text holds."""

    key: bytes
    text: str
    frames: Frames
    num_tokens: int


class VisionModel:
    def __init__(self, encoder: Idefics3Encoder, processing: Idefics3Processing,
                 image_token_id: int, dtype: torch.dtype, device: torch.device) -> None:
        self.encoder = encoder
        self.processing = processing
        self.image_token_id = image_token_id
        self.image_token = IMAGE_TOKEN
        self.dtype = dtype
        self.device = device

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.encoder.parameters())

    def prepare(self, image: DecodedImage) -> PreparedImage:
        frames = preprocess(image.image, self.processing)
        per_frame = self.encoder.spec.tokens_per_frame(self.processing.tile)
        return PreparedImage(image.key, image_text(frames.rows, frames.cols, per_frame),
                             frames, per_frame * frames.pixels.shape[0])

    @torch.inference_mode()
    def encode(self, image: PreparedImage) -> torch.Tensor:
        """The image's token embeddings [num_tokens, text width], all its frames in one
        run."""
        pixels = image.frames.pixels.to(self.device, self.dtype)
        return self.encoder(pixels)


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
    if not set(raw.get("architectures") or ()) & set(VISION_ARCHITECTURES):
        return None
    from transformers import AutoConfig

    from engine.loaders.safetensors import safetensors_shards

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    encoder = Idefics3Encoder(tower_spec(config))
    state = _tower_tensors(safetensors_shards(folder))
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{folder}: the vision tower's weights do not fit its config "
                         f"(missing: {missing[:3]}, unexpected: {unexpected[:3]})")
    encoder = encoder.to(device=device, dtype=dtype).eval()
    return VisionModel(encoder, Idefics3Processing.read(folder), int(config.image_token_id),
                       dtype, torch.device(device))


def _tower_tensors(shards: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                if name.startswith(_TOWER_PREFIXES):
                    state[name.removeprefix("model.")] = handle.get_tensor(name).float()
    return state
