"""GGUF files (llama.cpp's format) to a transformers config, tokenizer and HF-named weights.

The first load reads the file's header with engine.loaders.gguf.header, its tokenizer's
arrays whole, and builds the tokenizer from them (tokenizer.py); the kinds built there
only by transformers' conversion (Gemma's sentencepiece files, say) are converted by it
(slow: it parses the whole file with gguf.GGUFReader).
The config is built from the file's keys: as a FileConfig for the families whose registry
entry lists its config_defaults (Llama, Qwen2, Qwen3: no transformers model code
imported), else by transformers' config class for the family (file_config.py). It and the
tokenizer, with the tensor directory (names, shapes, quant types, byte offsets), are cached
under the user cache dir (cache.py), keyed by the file's path, size and mtime, so a later
load reads one JSON file and a saved tokenizer, importing no transformers model code,
and then reads each tensor straight from a memory map: quantized matrices as views of the
map (`keep_quantized`, what weights="stored" asks for; llama.cpp's Q/K row order is undone
by an index, `QuantizedTensor.row_order`, so the bytes are never copied), everything else
dequantized. Every tensor's extent is checked
against the file's size before any is read. Dequantized weights are never cached: they are
four to eight times the size of the file.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch

from engine.loaders.base import (
    FolioLoadError,
    LoadedModel,
    ProgressFn,
    WeightStream,
    check_weight_shapes,
    display_name,
)
from engine.loaders.gguf.cache import (  # noqa: F401 - CACHE_VERSION, cache_root: re-exported
    CACHE_VERSION,
    cache_entry,
    cache_root,
    read_meta,
    read_tokenizer,
    write_cache,
)
from engine.loaders.gguf.config import gguf_config_dict
from engine.loaders.gguf.file_config import (
    FileConfig,
    config_from_record,
    config_from_values,
    config_record,
)
from engine.loaders.gguf.header import check_gguf_magic, parse_gguf_header
from engine.loaders.gguf.mapping import map_weights
from engine.loaders.gguf.rope import config_tensor_names
from engine.loaders.gguf.tokenizer import (
    TOKENIZER_ARRAYS,
    build_tokenizer,
    convert_with_transformers,
)
from engine.models import ModelFamily, family_of, gguf_file_family
from engine.models.registry import GGUF_LLAMA_BLOCK_NAMES
from engine.text.file_tokenizer import FileTokenizer
from kernels.quant.formats import QuantizedTensor, quant_format

log = logging.getLogger(__name__)

# Values llama.cpp's converter changed, undone on load (by the entry's transform name):
# Qwen3.5's ssm_a holds -exp(A_log).
_TRANSFORMS = {"log_neg": lambda w: np.log(-w)}
_TRANSFORMED = {"linear_attn.A_log": "log_neg"}
# Every family's; the per-layer names (blk.N.<part>) are the family's gguf_block_names.
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head",
                 # Gemma 4's per-layer embeddings.
                 "per_layer_token_embd": "model.embed_tokens_per_layer",
                 "per_layer_model_proj": "model.per_layer_model_projection",
                 "per_layer_proj_norm": "model.per_layer_projection_norm"}
# Block parameters Hugging Face names without a .weight (llama.cpp's converter added one).
_BARE_PARAMETERS = ("layer_scalar",)


def hf_tensor_name(gguf_name: str, family: ModelFamily | None = None) -> str | None:
    """The Hugging Face parameter name of a GGUF tensor in `family`'s files (the Llama names
    when None), or None when it has none."""
    block_names: Mapping[str, str] = (GGUF_LLAMA_BLOCK_NAMES if family is None
                                      else family.gguf_block_names)
    parts = gguf_name.split(".")
    if len(parts) >= 3 and parts[0] == "blk" and parts[1].isdigit():
        whole = ".".join(parts[2:])  # a name the family maps whole ("ssm_a", "ssm_dt.bias")
        if whole in block_names and whole not in ("weight", "bias"):
            return f"model.layers.{parts[1]}.{block_names[whole]}"
    stem, dot, kind = gguf_name.rpartition(".")
    if not dot or kind not in ("weight", "bias"):
        return None
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in block_names:
        name = f"model.layers.{parts[1]}.{block_names[parts[2]]}"
        return name if block_names[parts[2]] in _BARE_PARAMETERS else f"{name}.{kind}"
    return None


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's rope row order for Q/K: it keeps each head's two rotary halves
    interleaved, (head, pair, half) where Hugging Face stores (head, half, pair)."""
    rows = weight.shape[0]
    split = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def load_gguf(path: Path, dtype: torch.dtype, progress: ProgressFn | None,
              keep_quantized: bool = False) -> LoadedModel:
    """keep_quantized: matrices of the block types in kernels.quant.formats come out as
    QuantizedTensor (their bytes, rows in Hugging Face order), the rest as `dtype`."""
    report = progress or (lambda stage, fraction: None)
    _check_magic(path)
    report("open", 0.0)
    entry = cache_entry(path)
    meta = read_meta(entry)
    tokenizer = None
    if meta is not None:
        try:
            record = meta["hf_config"]
            config = (_transformers_config(meta["config"], path) if record is None
                      else config_from_record(record))
            tokenizer = read_tokenizer(entry / "tokenizer")
        except Exception as exc:  # a damaged cache entry is rebuilt, not fatal
            log.warning("rebuilding the GGUF cache entry %s: %s", entry, exc)
        else:
            report("open", 1.0)
    if tokenizer is None:
        meta, tokenizer = _convert(path, report)
        config = _first_config(meta["config"], path)
        meta["hf_config"] = config_record(config)
        report("cache", 0.0)
        write_cache(entry, meta, tokenizer)
        report("cache", 1.0)
    tensors = meta["tensors"]
    shapes = {t[0]: tuple(t[1]) for t in tensors}
    check_weight_shapes(config, shapes, lambda name: str(path), str(path))

    def opener() -> Iterator[tuple[str, torch.Tensor]]:
        data = map_weights(path)
        if data.size != meta["size"]:
            raise FolioLoadError(f"{path}: the file changed after it was opened; load it again")
        for name, shape, qtype_id, offset, n_bytes, permute_heads, shift, transform in tensors:
            if (keep_quantized and len(shape) == 2 and not shift and not transform
                    and quant_format(qtype_id)):
                # A view of the map: pages are read when a product first touches them.
                rows = torch.from_numpy(data[offset:offset + n_bytes].reshape(shape[0], -1))
                order = None
                if permute_heads:  # whole rows move: said by an index, the bytes stay
                    order = torch.from_numpy(unpermute_rows(np.arange(shape[0]),
                                                            permute_heads))
                yield name, QuantizedTensor(qtype_id, tuple(shape), rows, order)
                continue
            weight = _dequantize_at(data, shape, qtype_id, offset, n_bytes)
            if permute_heads:
                weight = unpermute_rows(weight, permute_heads)
            if shift:  # a new array, so never a view of the file
                weight = weight - np.float32(shift)
            elif transform:
                weight = _TRANSFORMS[transform](weight).astype(np.float32)
            elif np.may_share_memory(weight, data):  # F32 comes back as a view of the file
                weight = weight.copy()
            yield name, torch.from_numpy(weight).to(dtype)

    return LoadedModel(config=config, tokenizer=tokenizer,
                       weights=WeightStream(shapes, opener, progress), source=path,
                       format="gguf", name=display_name(path))


def _first_config(config_dict: dict, path: Path):
    """The config of a file's first load: from its keys and its family's config_defaults
    where the family lists them, else as transformers' class for its model type builds
    it."""
    defaults = family_of(FileConfig(config_dict)).config_defaults
    if defaults is not None:
        return config_from_values(config_dict, defaults)
    return _transformers_config(config_dict, path)


def _transformers_config(config_dict: dict, path: Path):
    """The file's config as transformers' class for its model type builds it (its defaults
    filled in); the cache keeps it whole, so only a file's first load imports that class."""
    from transformers import AutoConfig

    config_dict = dict(config_dict)
    try:
        return AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    except (ValueError, TypeError) as exc:  # transformers' own validation of the values
        raise FolioLoadError(f"{path}: its metadata gives a config transformers rejects "
                             f"({exc}); the file is damaged or not supported") from exc


def _check_magic(path: Path) -> None:
    try:
        check_gguf_magic(path)
    except (OSError, ValueError) as exc:
        raise FolioLoadError(f"{path}: not a GGUF file ({exc}); download or convert the model "
                             "again") from exc


def _convert(path: Path, report: ProgressFn) -> tuple[dict, object]:
    """Read the header (metadata and tensor directory) and convert the tokenizer."""

    try:
        header = parse_gguf_header(path, TOKENIZER_ARRAYS)
        # The tokenizer's arrays, read whole for it; the config sees their lengths.
        metadata = dict(header.metadata)
        vocabulary = {key: metadata[key] for key in TOKENIZER_ARRAYS
                      if isinstance(metadata.get(key), list)}
        metadata.update({key: len(value) for key, value in vocabulary.items()})
        directory = []
        size = path.stat().st_size
        for tensor in header.tensors:
            n_bytes = _tensor_bytes(tensor.name, tensor.shape, tensor.qtype, path)
            # Checked before anything is read, so no tensor is read past the end.
            if tensor.offset + n_bytes > size:
                raise FolioLoadError(f"{path}: truncated (tensor {tensor.name} ends past the "
                                     "end of the file); download it again")
            directory.append((tensor.name, tensor.shape, tensor.qtype, tensor.offset, n_bytes))
        family = gguf_file_family(metadata)
        config_names = () if family is None else config_tensor_names(family.model_type)
        config_tensors = {
            entry[0]: np.array(_dequantize_at(np.memmap(path, dtype=np.uint8, mode="r"),
                                              *entry[1:]), dtype=np.float32)
            for entry in directory if entry[0] in config_names}
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:
        raise FolioLoadError(f"{path}: unreadable GGUF file ({exc}); it is truncated or "
                             "corrupt, download or convert it again") from exc
    config = gguf_config_dict(metadata, {t[0] for t in directory}, config_tensors, path)
    assert family is not None  # gguf_config_dict rejects the architectures Folio lacks
    permute = family.gguf_rope_permuted
    tensors, known_qtypes = [], set()
    for gguf_name, shape, qtype, offset, n_bytes in directory:
        if gguf_name in config_names:
            continue
        hf_name = hf_tensor_name(gguf_name, family)
        if hf_name is None:
            raise FolioLoadError(f"{path}: tensor {gguf_name} has no counterpart in "
                                 f"{family.architecture}; this GGUF is not a model Folio "
                                 "supports")
        if qtype not in known_qtypes:
            _check_dequantizable(qtype, gguf_name, path)
            known_qtypes.add(qtype)
        heads = 0
        if permute and ".attn_q." in gguf_name:
            heads = config["num_attention_heads"]
        elif permute and ".attn_k." in gguf_name:
            heads = config["num_key_value_heads"]
        # llama.cpp's converter added the offset to these (the name test is its own).
        shift = family.gguf_norm_offset if hf_name.endswith("norm.weight") else 0.0
        if hf_name.endswith(family.gguf_unshifted_norms or ("\0",)):
            shift = 0.0
        transform = next((t for suffix, t in _TRANSFORMED.items() if hf_name.endswith(suffix)),
                         "")
        if hf_name.endswith("conv1d.weight") and len(shape) == 2:
            shape = (shape[0], 1, shape[1])  # llama.cpp squeezed the depthwise conv's [C, 1, K]
        tensors += _split_experts([hf_name, list(shape), qtype, offset, n_bytes, heads, shift,
                                   transform], path)
    report("open", 1.0)
    report("tokenizer", 0.0)
    try:
        tokenizer = build_tokenizer({**metadata, **vocabulary})
        if tokenizer is None:  # a kind built by transformers' conversion only
            converted = convert_with_transformers(path)
            # Kept as Folio's object where that answers the same: later loads then
            # import no transformers.
            tokenizer = FileTokenizer.from_transformers(converted) or converted
    except Exception as exc:
        raise FolioLoadError(f"{path}: its tokenizer cannot be converted ({exc})") from exc
    if tokenizer.chat_template is None and metadata.get("tokenizer.chat_template"):
        tokenizer.chat_template = metadata["tokenizer.chat_template"]
    report("tokenizer", 1.0)
    stat = path.stat()
    meta = {"version": CACHE_VERSION, "source": str(path.resolve()), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "config": config, "tensors": tensors}
    return meta, tokenizer


def _split_experts(entry: list, path: Path) -> list[list]:
    """A mixture of experts' stacked [experts, rows, k] tensor as one entry per expert
    (its name's "{}" the expert's index), each its own run of the file's bytes: experts are
    then read, kept quantized and checked as the one-matrix-per-expert checkpoints are."""
    hf_name, shape, qtype, offset, n_bytes, heads, shift, transform = entry
    if "{}" not in hf_name:
        return [entry]
    # gpt-oss's experts carry biases: [experts, rows], one row per expert.
    if len(shape) != 3 and not (len(shape) == 2 and hf_name.endswith(".bias")):
        raise FolioLoadError(f"{path}: expert tensor {hf_name.replace('{}', '*')} has shape "
                             f"{shape}, not [experts, rows, columns]; the file is damaged")
    size = n_bytes // shape[0]
    return [[hf_name.format(e), shape[1:], qtype, offset + e * size, size, heads, shift,
             transform]
            for e in range(shape[0])]


def _tensor_bytes(name: str, shape: tuple[int, ...], qtype_id: int, path: Path) -> int:
    """The bytes of one tensor, or FolioLoadError naming it: an unknown block type, or a
    row that is not a whole number of blocks (its bytes would be misread)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype_id)]
    except (ValueError, KeyError):
        raise FolioLoadError(f"{path}: tensor {name} has block type {qtype_id}, which is not "
                             "a GGUF type Folio knows; use another quantization of the "
                             "model") from None
    # shape is Hugging Face's order, so the row (GGUF's first dimension) is the last.
    if shape and shape[-1] % block:
        raise FolioLoadError(f"{path}: tensor {name} has rows of {shape[-1]} values, not a "
                             f"multiple of its {GGMLQuantizationType(qtype_id).name} block of "
                             f"{block}; the file is damaged")
    return math.prod(shape) * block_bytes // block


def _dequantize_at(data: np.ndarray, shape: tuple[int, ...], qtype_id: int, offset: int,
                   n_bytes: int) -> np.ndarray:
    """One tensor, dequantized to float32, from the bytes of the whole file."""
    from gguf import GGMLQuantizationType, dequantize, quant_shape_to_byte_shape

    qtype = GGMLQuantizationType(qtype_id)
    return dequantize(data[offset:offset + n_bytes].reshape(
        quant_shape_to_byte_shape(shape, qtype)), qtype)


def _check_dequantizable(qtype_id: int, gguf_name: str, path: Path) -> None:
    # Fail at load time, naming the tensor, rather than midway through reading the weights.
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

    qtype = GGMLQuantizationType(qtype_id)
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
    except NotImplementedError as exc:
        raise FolioLoadError(f"{path}: tensor {gguf_name} is stored as {qtype.name}, which "
                             "Folio cannot dequantize; use another quantization of the "
                             "model") from exc
