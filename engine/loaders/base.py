"""What every loader shares: the error a user sees, the weight stream, the loaded model.

A loader hands the model code a transformers config, a tokenizer, and a re-iterable
stream of (Hugging Face parameter name, tensor) pairs that reads one tensor at a time, so
peak memory stays near the size of the model in the runtime dtype. Everything a user can
get wrong (missing files, truncated downloads, wrong shapes) raises `FolioLoadError`
naming the file and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

ProgressFn = Callable[[str, float], None]

_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.")


class FolioLoadError(ValueError):
    """A model file or folder that cannot be loaded; the message names it and what to do."""


@dataclass(slots=True)
class WeightStream:
    """(name, tensor) pairs read on demand; each iteration reads the files again.

    `progress`, when set, hears ("weights", fraction done) as tensors are produced.
    """

    shapes: dict[str, tuple[int, ...]]
    opener: Callable[[], Iterator[tuple[str, torch.Tensor]]]
    progress: ProgressFn | None = None

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        total = max(len(self.shapes), 1)
        if self.progress is not None:
            self.progress("weights", 0.0)
        for done, item in enumerate(self.opener(), 1):
            yield item
            if self.progress is not None:
                self.progress("weights", done / total)

    def __len__(self) -> int:
        return len(self.shapes)


@dataclass(slots=True)
class LoadedModel:
    config: object  # a transformers PretrainedConfig, or a FileConfig (gguf/file_config.py)
    # Folio's FileTokenizer (engine/text/file_tokenizer.py) or transformers' tokenizer.
    tokenizer: object
    weights: WeightStream
    source: Path
    format: str  # "hf" or "gguf"
    name: str


def display_name(path: Path) -> str:
    """A repo id (plus the file's path inside it) for a Hugging Face cache snapshot, which
    `resolve_model` accepts back; else the folder name or the file's stem."""
    # absolute(), not resolve(): cache files are symlinks to blobs named by their hash.
    parts = path.absolute().parts
    for i in range(1, len(parts) - 1):
        if parts[i] == "snapshots" and parts[i - 1].startswith("models--"):
            repo_id = parts[i - 1].removeprefix("models--").replace("--", "/")
            return "/".join((repo_id, *parts[i + 2:]))
    return path.stem if path.is_file() else path.name


def check_weight_shapes(config, shapes: Mapping[str, tuple[int, ...]],
                        origin: Callable[[str], str], source: str) -> None:
    """Raise FolioLoadError when the weights do not fit the config, before any is read.

    The expected names and shapes are the model's own (`engine.models.checkpoint_shapes`).
    `origin(name)` names the file holding a tensor; `source` names the model for missing
    ones. An architecture Folio does not run is left to the model registry's error; names
    the model does not take (old checkpoints' rotary inv_freq buffers) pass through here.
    """
    from engine.models import checkpoint_shapes, split_fused_shapes

    try:
        expected_shapes = checkpoint_shapes(config)
    except ValueError:
        return
    shapes = split_fused_shapes(config, dict(shapes))
    num_layers = config.num_hidden_layers
    for name, shape in shapes.items():
        expected = expected_shapes.get(name)
        if expected is not None and tuple(shape) != expected:
            raise FolioLoadError(f"{origin(name)}: tensor {name} has shape {list(shape)}, but "
                                 f"the config implies {list(expected)}; the weights do not "
                                 "belong to this config")
        layer = _LAYER_NAME.match(name)
        if layer and int(layer.group(1)) >= num_layers:
            raise FolioLoadError(f"{origin(name)}: tensor {name} is beyond the config's "
                                 f"{num_layers} layers; the weights do not "
                                 "belong to this config")
    missing = [name for name in expected_shapes if name not in shapes]
    if missing:
        raise FolioLoadError(f"{source}: {len(missing)} weights the config needs are missing "
                             f"(first: {', '.join(missing[:3])}); the weights are incomplete "
                             "or belong to another model")
