"""llama.cpp's ``mmproj`` files (a GGUF model's vision tower and projector in a GGUF of
their own): finding one for a model file, and reading its header.

Found as LM Studio and llama.cpp find it: a ``.gguf`` file in the model file's folder
whose name holds ``mmproj`` (any case), the model itself left out; with several, the
first by name (case-insensitive), so "mmproj-F16" is taken before "mmproj-Q8_0" and the
choice does not depend on the order the folder lists them in. An explicit path
(``EngineConfig.mmproj``, ``--mmproj``) overrides the search.

An mmproj file is what llama.cpp's converter writes for a vision model: architecture
``clip`` (``general.type`` ``mmproj``), ``clip.has_vision_encoder``, the projector type
under ``clip.projector_type`` (or ``clip.vision.projector_type`` in files that hold an
audio encoder too), the tower's shape under ``clip.vision.*`` and its tensors named
``v.*`` (tower) and ``mm.*`` (projector). engine/vision/mmproj.py builds the encoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.loaders.base import FolioLoadError
from engine.loaders.gguf.header import GGUFTensorInfo, parse_gguf_header

MMPROJ_MARK = "mmproj"
CLIP_ARCHITECTURE = "clip"
# The projector type's keys, the vision-only one first (gguf.Keys.ClipVision / Clip).
PROJECTOR_KEYS = ("clip.vision.projector_type", "clip.projector_type")


def is_mmproj_name(path: Path) -> bool:
    """A ``.gguf`` file named as a projector (not a model: listings leave it out)."""
    return path.suffix.lower() == ".gguf" and MMPROJ_MARK in path.name.lower()


def find_mmproj(model: Path, explicit: str | Path | None = None,
                field: str = "EngineConfig.mmproj") -> Path | None:
    """The mmproj file for ``model``: ``explicit`` (which must be a file and goes with a
    .gguf model only), else the one beside a .gguf model (see the module docstring), else
    None. ``field`` names the setting in the errors."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise FolioLoadError(f"{field}: {path} is not a file; pass the mmproj .gguf "
                                 "that goes with the model")
        if not (model.is_file() and model.suffix.lower() == ".gguf"):
            raise FolioLoadError(f"{field}: an mmproj file goes with a .gguf model, and "
                                 f"{model} is not one (a model folder carries its own "
                                 "vision tower)")
        return path.absolute()
    if not (model.is_file() and model.suffix.lower() == ".gguf"):
        return None
    try:
        beside = [p for p in model.parent.iterdir() if p.is_file() and is_mmproj_name(p)
                  and p.name != model.name]
    except OSError:
        return None
    return min(beside, key=lambda p: (p.name.lower(), p.name)) if beside else None


@dataclass(slots=True, frozen=True)
class MmprojHeader:
    """An mmproj file's keys (arrays of numbers whole: the image mean and std) and tensor
    directory, checked to be a vision projector; ``projector`` its type."""

    path: Path
    projector: str
    metadata: dict[str, object]
    tensors: list[GGUFTensorInfo]

    def key(self, name: str, default: object = None) -> object:
        """A ``clip.vision.*`` key's value (``name`` without that prefix)."""
        return self.metadata.get(f"clip.vision.{name}", default)

    def triple(self, name: str, default: tuple[float, float, float] = (0.5, 0.5, 0.5)
               ) -> tuple[float, float, float]:
        """A key of three numbers (the image mean and std), ``default`` when absent;
        ValueError naming it when it holds something else."""
        values = self.key(name, default)
        if not isinstance(values, list | tuple) or len(values) != 3:
            raise ValueError(f"{self.path}: clip.vision.{name} must be three numbers, got "
                             f"{values!r}")
        return tuple(float(v) for v in values)

    def require(self, name: str) -> object:
        value = self.key(name)
        if value is None:
            raise FolioLoadError(f"{self.path}: the mmproj file has no clip.vision.{name}; "
                                 "it is damaged or from a converter Folio does not know")
        return value


_ARRAYS = frozenset({"clip.vision.image_mean", "clip.vision.image_std"})


def read_mmproj_header(path: Path) -> MmprojHeader:
    """``path``'s header; FolioLoadError naming the file when it is not a GGUF, not an
    mmproj (another architecture), or holds no vision encoder."""
    try:
        header = parse_gguf_header(path, _ARRAYS)
    except (OSError, ValueError) as exc:
        raise FolioLoadError(f"{path}: the mmproj file is not a readable GGUF file ({exc})"
                             ) from exc
    meta = header.metadata
    arch = meta.get("general.architecture")
    if arch != CLIP_ARCHITECTURE:
        raise FolioLoadError(f"{path}: not an mmproj file (its general.architecture is "
                             f"{arch!r}, an mmproj's is {CLIP_ARCHITECTURE!r}); pass the "
                             "projector file that goes with the model")
    if not meta.get("clip.has_vision_encoder"):
        raise FolioLoadError(f"{path}: the mmproj file holds no vision encoder "
                             "(clip.has_vision_encoder is not set)")
    projector = next((meta[k] for k in PROJECTOR_KEYS if isinstance(meta.get(k), str)), None)
    if projector is None:
        raise FolioLoadError(f"{path}: the mmproj file names no projector type "
                             f"({' or '.join(PROJECTOR_KEYS)})")
    return MmprojHeader(path, projector, meta, header.tensors)


def mmproj_beside(model: Path) -> MmprojHeader | None:
    """The header of the mmproj file beside a .gguf model, or None (none there, or one
    that is not a readable mmproj: the listings' question, asked without raising)."""
    try:
        found = find_mmproj(model)
        return None if found is None else read_mmproj_header(found)
    except FolioLoadError:
        return None
