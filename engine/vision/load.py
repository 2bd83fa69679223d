"""A folder's eyes: ``load_vision`` finds the architecture's ``VisionFamily`` in the
table of families (one module per family under engine/vision) and builds its parts from
the folder's tower tensors, which the text loader skips (a GGUF model's tower is
mmproj.py's).

The table lives here, not in model.py, because every family module imports model.py's
types: the loader sits above the families, the types below them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from engine.vision.model import VisionFamily, VisionModel, VisionUnavailable, placed_model

log = logging.getLogger(__name__)


def families() -> dict[str, VisionFamily]:
    """The vision families by their Hugging Face class."""
    from engine.vision.gemma3 import GEMMA3
    from engine.vision.gemma4 import GEMMA4
    from engine.vision.idefics3 import IDEFICS3
    from engine.vision.qwen35 import QWEN35, QWEN35_MOE

    return {f.architecture: f for f in (IDEFICS3, GEMMA3, GEMMA4, QWEN35, QWEN35_MOE)}


def load_vision(folder: Path, dtype: torch.dtype, device: torch.device | str = "cpu",
                encoder_dtype: torch.dtype | None = None) -> VisionModel | None:
    """The folder's vision model, or None (a text model, a GGUF file, a tower Folio does
    not run, a folder without tower tensors, ``VisionUnavailable``: logged). ValueError
    naming the tensor for a folder whose tower is incomplete. ``encoder_dtype``: the
    tower's compute dtype; None: ``dtype``, or bfloat16 where the family and the CPU take
    it (``VisionFamily.cpu_bfloat16``, ``tower_dtype``)."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not folder.is_dir() or not config_path.is_file():
        return None
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    table = families()
    family = next((table[a] for a in raw.get("architectures") or () if a in table), None)
    if family is None:
        return None
    from transformers import AutoConfig

    from engine.loaders.safetensors import safetensors_shards

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    state = tower_tensors(safetensors_shards(folder), family.tower_prefixes)
    if not state:  # a release's text part saved under its multimodal class
        log.warning("%s: no vision tower tensors: the model reads text only", folder)
        return None
    try:
        parts = family.load(folder, config, state)
    except VisionUnavailable as reason:
        log.warning("%s: the model reads text only: %s", folder, reason)
        return None
    return placed_model(parts, family, dtype, device, encoder_dtype)


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
