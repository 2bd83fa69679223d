"""Hugging Face model folders: config.json, a tokenizer and safetensors shards.

A folder's first load reads config.json as a FileConfig where its family lists its
config_defaults (Llama, Qwen2, Qwen3) and it states every size the decoder needs, else
builds it with transformers' class; later loads read it back from the cache
(folder_cache.py), as a GGUF's is.
The shards' headers are read first (shapes checked against the config, truncated files
caught) and the tensors only when the weight stream is iterated. A folder whose experts
are stored in MXFP4 (gpt-oss as released) reads them through `hf_mxfp4`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.loaders.base import (
    FolioLoadError,
    LoadedModel,
    ProgressFn,
    WeightStream,
    check_weight_shapes,
    display_name,
)
from engine.loaders.folder_cache import load_tokenizer, read_config, write_config
from engine.loaders.gguf.file_config import FileConfig, config_from_values
from engine.loaders.hf_mxfp4 import fused_shapes, joined, quant_method
from engine.models.qwen35_mtp import MTP_PREFIX
from engine.models.registry import family_of, text_part, text_weight_name

log = logging.getLogger(__name__)


def load_hf_folder(folder: Path, dtype: torch.dtype, progress: ProgressFn | None,
                   keep_quantized: bool = False, with_mtp: bool = False) -> LoadedModel:
    """keep_quantized: MXFP4 experts come out as `Mxfp4Experts` (else dequantized to
    `dtype`); with_mtp: the ``mtp.*`` tensors come too (else never read)."""
    report = progress or (lambda stage, fraction: None)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FolioLoadError(f"{config_path}: missing; a Hugging Face model folder needs "
                             "config.json (for a GGUF model pass the .gguf file itself)")
    report("config", 0.0)
    config, prefix = read_config(folder) or _first_config(folder, config_path)
    quantized = quant_method(config, config_path) is not None
    report("config", 1.0)
    report("tokenizer", 0.0)
    try:
        tokenizer = load_tokenizer(folder)
    except Exception as exc:
        raise FolioLoadError(f"{folder}: no usable tokenizer (tokenizer.json or "
                             f"tokenizer.model with tokenizer_config.json): {exc}") from exc
    report("tokenizer", 1.0)
    report("index", 0.0)
    shards = safetensors_shards(folder)
    headers = {shard: read_safetensors_header(shard) for shard in shards}
    if prefix is None and _base_model(headers):
        prefix = ""  # every name under "model.", as the causal LM's
    shapes: dict[str, tuple[int, ...]] = {}
    origin: dict[str, Path] = {}
    for shard in shards:
        for stored, shape in headers[shard].items():
            name = _weight_name(stored, prefix, with_mtp)
            if name is None:
                continue  # the vision and audio towers, an unwanted MTP head
            shapes[name] = shape
            origin[name] = shard
    if quantized:
        shapes = fused_shapes(shapes, folder)[0]
        origin |= {name.removesuffix("_blocks"): path for name, path in origin.items()}
    check_weight_shapes(config, shapes, lambda name: str(origin.get(name, folder)), str(folder))
    report("index", 1.0)

    def opener() -> Iterator[tuple[str, torch.Tensor]]:
        return joined(tensors(), keep_quantized, dtype) if quantized else tensors()

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import SafetensorError, safe_open

        for shard in shards:
            try:
                with safe_open(str(shard), framework="pt") as handle:
                    for stored in handle.keys():
                        name = _weight_name(stored, prefix, with_mtp)
                        if name is None:
                            continue  # never read: the towers Folio does not run
                        tensor = handle.get_tensor(stored)
                        yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor
            except SafetensorError as exc:
                raise FolioLoadError(f"{shard}: unreadable safetensors data ({exc}); "
                                     "download the file again") from exc

    return LoadedModel(config=config, tokenizer=tokenizer,
                       weights=WeightStream(shapes, opener, progress), source=folder,
                       format="hf", name=display_name(folder))


def _weight_name(stored: str, prefix: str | None, with_mtp: bool) -> str | None:
    """A stored tensor's name as the model takes it (``prefix``: a multimodal file's
    text part), or None for one not read: other towers, and the MTP head's ``mtp.*``
    unless asked for (it sits at the top level beside the text model)."""
    if stored.startswith(MTP_PREFIX):
        return stored if with_mtp else None
    return stored if prefix is None else text_weight_name(stored, prefix)


def _base_model(headers: dict[Path, dict[str, tuple[int, ...]]]) -> bool:
    """A base model's checkpoint (transformers' ``Qwen3Model``, as Qwen3-Embedding is
    saved): its layers' names without the causal LM's ``model.`` prefix."""
    names = [name for header in headers.values() for name in header]
    return any(n.startswith("layers.") for n in names) and \
        not any(n.startswith("model.") for n in names)


# The fields every decoder reads without a default (engine/models/spec.py's base_spec); a
# config.json without one of them goes through transformers' class, which fills it in.
_STATED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads", "rms_norm_eps", "max_position_embeddings")


def _first_config(folder: Path, config_path: Path):
    """The config of a folder's first load and its text weights' prefix, kept for later
    loads: config.json as it states it where that is enough, else transformers'."""
    plain = _plain_config(config_path)
    if plain is None:
        return _transformers_config(folder, config_path)
    write_config(folder, plain, None)
    return plain, None


def _plain_config(config_path: Path) -> FileConfig | None:
    """config.json as a FileConfig (config_from_values) when it names one architecture of
    a family with config_defaults, that family's model_type, and every ``_STATED`` size as
    a number; None otherwise (transformers' class reads it, and says what is wrong)."""
    try:
        values = json.loads(config_path.read_text(encoding="utf-8"))
        family = family_of(FileConfig(values)) if isinstance(values, dict) else None
    except (OSError, ValueError):
        return None
    if (family is None or family.config_defaults is None
            or values.get("architectures") != [family.architecture]
            or values.get("model_type") != family.model_type):
        return None
    if any(isinstance(values.get(name), bool) or not isinstance(values.get(name), (int, float))
           for name in _STATED):
        return None
    return config_from_values(values, family.config_defaults)


def _transformers_config(folder: Path, config_path: Path):
    """The folder's config as transformers builds it (its text part's, for a multimodal
    checkpoint) and that part's weight prefix, kept for later loads (folder_cache.py)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad config
        raise FolioLoadError(f"{config_path}: cannot be read as a model config ({exc})") from exc
    prefix = text_part(getattr(config, "architectures", None))
    if prefix is not None:
        log.info("%s: a multimodal checkpoint (%s): loading its text part only", folder,
                 ", ".join(config.architectures))
        config = config.text_config
    write_config(folder, config, prefix)
    return config, prefix


def safetensors_shards(folder: Path) -> list[Path]:
    """The folder's safetensors files, in index order; raises when there are none."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FolioLoadError(f"{index}: not a valid safetensors index ({exc})") from exc
        shards = [folder / name for name in dict.fromkeys(weight_map.values())]
        for shard in shards:
            if not shard.is_file():
                raise FolioLoadError(f"{shard}: missing, but {index.name} lists it; "
                                     "download the model again")
        return shards
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if found:
        return found
    if any(folder.glob("*.bin")) or any(folder.glob("*.pth")):
        raise FolioLoadError(f"{folder}: only PyTorch .bin/.pth weights; Folio needs "
                             "safetensors (download the repo's safetensors files, or convert)")
    raise FolioLoadError(f"{folder}: no weights (model.safetensors or "
                         "model.safetensors.index.json); download the model's weights")


def read_safetensors_header(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from a safetensors header, after checking the file holds all the data."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ValueError("shorter than the 8-byte header length")
            header_len = int.from_bytes(prefix, "little")
            if header_len > size - 8:
                raise ValueError(f"header of {header_len} bytes in a {size}-byte file")
            header = json.loads(handle.read(header_len))
        header.pop("__metadata__", None)
        shapes = {name: tuple(int(d) for d in info["shape"]) for name, info in header.items()}
        data_end = max((int(info["data_offsets"][1]) for info in header.values()), default=0)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FolioLoadError(f"{path}: not a valid safetensors file ({exc}); "
                             "download it again") from exc
    needed = 8 + header_len + data_end
    if needed > size:
        raise FolioLoadError(f"{path}: truncated ({size} bytes, its header needs {needed}); "
                             "the download is incomplete, download it again")
    return shapes
