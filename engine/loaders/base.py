"""Model files to config + tokenizer + named weights: Hugging Face folders and GGUF files.

`load_model_files` does not build the model: it hands the model code a transformers config,
a tokenizer, and a re-iterable stream of (Hugging Face parameter name, tensor) pairs that reads
one tensor at a time, so peak memory stays near the size of the model in the runtime dtype.
Everything a user can get wrong (missing files, truncated downloads, wrong shapes) raises
`FolioLoadError` naming the file and what to do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

ProgressFn = Callable[[str, float], None]

# model_type values whose weights follow the Llama layout that the shape check knows.
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")

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
    config: object  # transformers.PretrainedConfig
    tokenizer: object  # transformers.PreTrainedTokenizerFast
    weights: WeightStream
    source: Path
    format: str  # "hf" or "gguf"
    name: str


def load_model_files(source: str | Path, dtype: torch.dtype = torch.float32,
                     progress: ProgressFn | None = None) -> LoadedModel:
    """Load a Hugging Face model folder or a .gguf file (see the module docstring).

    `progress(stage, fraction)` hears each stage start at 0.0 and end at 1.0; stages are
    "config", "tokenizer", "index" (folders) or "open", "tokenizer", "cache" (GGUF), then
    "weights" while `weights` is iterated.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    path = Path(source).expanduser()
    if not path.exists():
        raise FolioLoadError(f"{path}: no such file or folder; pass a model folder with "
                             "config.json and safetensors weights, or a .gguf file")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            from engine.loaders.gguf.loader import (
                load_gguf,  # late: gguf_loader imports this module
            )

            return load_gguf(path, dtype, progress)
        raise FolioLoadError(f"{path}: not a model; pass its folder (with config.json) "
                             "or a .gguf file")
    return _load_hf_folder(path, dtype, progress)


def _load_hf_folder(folder: Path, dtype: torch.dtype, progress: ProgressFn | None) -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer

    report = progress or (lambda stage, fraction: None)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FolioLoadError(f"{config_path}: missing; a Hugging Face model folder needs "
                             "config.json (for a GGUF model pass the .gguf file itself)")
    report("config", 0.0)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad config
        raise FolioLoadError(f"{config_path}: cannot be read as a model config ({exc})") from exc
    report("config", 1.0)
    report("tokenizer", 0.0)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, use_fast=True)
    except Exception as exc:
        raise FolioLoadError(f"{folder}: no usable tokenizer (tokenizer.json or "
                             f"tokenizer.model with tokenizer_config.json): {exc}") from exc
    report("tokenizer", 1.0)
    report("index", 0.0)
    shards = safetensors_shards(folder)
    shapes: dict[str, tuple[int, ...]] = {}
    origin: dict[str, Path] = {}
    for shard in shards:
        for name, shape in read_safetensors_header(shard).items():
            shapes[name] = shape
            origin[name] = shard
    check_weight_shapes(config, shapes, lambda name: str(origin[name]), str(folder))
    report("index", 1.0)

    def opener() -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import SafetensorError, safe_open

        for shard in shards:
            try:
                with safe_open(str(shard), framework="pt") as handle:
                    for name in handle.keys():
                        tensor = handle.get_tensor(name)
                        yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor
            except SafetensorError as exc:
                raise FolioLoadError(f"{shard}: unreadable safetensors data ({exc}); "
                                     "download the file again") from exc

    return LoadedModel(config=config, tokenizer=tokenizer,
                       weights=WeightStream(shapes, opener, progress), source=folder,
                       format="hf", name=display_name(folder))


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


def llama_weight_shapes(config) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) parameter shapes that a Llama-family config implies."""
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = config.intermediate_size
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    required = {"model.embed_tokens.weight": (config.vocab_size, hidden),
                "model.norm.weight": (hidden,)}
    optional = {"lm_head.weight": (config.vocab_size, hidden)}
    if not getattr(config, "tie_word_embeddings", False):
        required["lm_head.weight"] = optional.pop("lm_head.weight")
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        required |= {
            p + "self_attn.q_proj.weight": (q_rows, hidden),
            p + "self_attn.k_proj.weight": (kv_rows, hidden),
            p + "self_attn.v_proj.weight": (kv_rows, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_rows),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
        biases = {p + "self_attn.q_proj.bias": (q_rows,), p + "self_attn.k_proj.bias": (kv_rows,),
                  p + "self_attn.v_proj.bias": (kv_rows,), p + "self_attn.o_proj.bias": (hidden,),
                  p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                  p + "mlp.down_proj.bias": (hidden,)}
        norms = {p + "self_attn.q_norm.weight": (head_dim,),
                 p + "self_attn.k_norm.weight": (head_dim,)}
        if config.model_type == "qwen2":  # Qwen2 always has q/k/v biases
            required |= {name: biases.pop(name) for name in list(biases)[:3]}
        if config.model_type == "qwen3":
            required |= norms
        else:
            optional |= norms
        optional |= biases
    return required, optional


def check_weight_shapes(config, shapes: Mapping[str, tuple[int, ...]],
                        origin: Callable[[str], str], source: str) -> None:
    """Raise FolioLoadError when the weights do not fit a Llama-family config.

    `origin(name)` names the file holding a tensor; `source` names the model for missing ones.

    Other architectures are left to the model registry. Names the config does not imply
    (for example old checkpoints' rotary inv_freq buffers) pass through unchecked.
    """
    if getattr(config, "model_type", None) not in LLAMA_FAMILY:
        return
    required, optional = llama_weight_shapes(config)
    for name, shape in shapes.items():
        expected = required.get(name) or optional.get(name)
        if expected is not None and tuple(shape) != expected:
            raise FolioLoadError(f"{origin(name)}: tensor {name} has shape {list(shape)}, but "
                                 f"the config implies {list(expected)}; the weights do not "
                                 "belong to this config")
        layer = _LAYER_NAME.match(name)
        if layer and int(layer.group(1)) >= config.num_hidden_layers:
            raise FolioLoadError(f"{origin(name)}: tensor {name} is beyond the config's "
                                 f"{config.num_hidden_layers} layers; the weights do not "
                                 "belong to this config")
    missing = [name for name in required if name not in shapes]
    if missing:
        raise FolioLoadError(f"{source}: {len(missing)} weights the config needs are missing "
                             f"(first: {', '.join(missing[:3])}); the weights are incomplete "
                             "or belong to another model")
