"""GGUF files (llama.cpp's format) to a transformers config, tokenizer and HF-named weights.

The first load opens the file with `gguf.GGUFReader` (about 3 s for the starter) and has
transformers convert the tokenizer (several seconds). Both results, with the tensor directory
(names, shapes, quant types, byte offsets), are cached under the user cache dir, keyed by the
file's path, size and mtime, so a later load reads one JSON file and a saved tokenizer and then
dequantizes each tensor straight from a memory map. Dequantized weights are never cached:
they are four to eight times the size of the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch

from engine.loader import (
    FolioLoadError,
    LoadedModel,
    ProgressFn,
    WeightStream,
    check_weight_shapes,
    display_name,
)

log = logging.getLogger(__name__)

CACHE_VERSION = 1
# general.architecture -> (HF model_type, HF class, Q/K rows permuted by llama.cpp for rope).
# llama.cpp permutes only the "llama" family (Llama, Mistral, SmolLM); Qwen runs NEOX rope.
GGUF_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM", True),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", False),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", False),
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
ROPE_FREQS = "rope_freqs.weight"  # llama 3 rope scaling, folded into the config


def cache_root() -> Path:
    import platformdirs

    return Path(os.environ.get("FOLIO_CACHE_DIR") or platformdirs.user_cache_dir("folio"))


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face parameter name of a GGUF tensor, or None when it has none."""
    stem, dot, kind = gguf_name.rpartition(".")
    if not dot or kind not in ("weight", "bias"):
        return None
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{kind}"
    return None


def unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's rope row order for Q/K: it keeps each head's two rotary halves
    interleaved, (head, pair, half) where Hugging Face stores (head, half, pair)."""
    rows = weight.shape[0]
    split = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def gguf_config_dict(metadata: Mapping[str, object], tensor_names: set[str],
                     rope_freqs: np.ndarray | None, where: Path) -> dict[str, object]:
    """A config.json-style dict from GGUF metadata (arrays given as their lengths)."""
    arch = metadata.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise FolioLoadError(f"{where}: architecture {arch!r} is not supported; Folio runs "
                             f"Llama-family GGUF files ({', '.join(GGUF_ARCHITECTURES)})")
    model_type, hf_class, _ = GGUF_ARCHITECTURES[arch]

    def key(name: str, default: object = None) -> object:
        value = metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise FolioLoadError(f"{where}: metadata {arch}.{name} is missing; the file is "
                                 "incomplete, download or convert it again")
        return value

    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    head_dim = int(key("attention.key_length", hidden // heads))
    vocab = metadata.get(f"{arch}.vocab_size") or metadata.get("tokenizer.ggml.tokens")
    if not vocab:
        raise FolioLoadError(f"{where}: no vocabulary size in the metadata; the file is "
                             "incomplete, download or convert it again")
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise FolioLoadError(f"{where}: partial rotary embeddings are not supported")
    config: dict[str, object] = {
        "model_type": model_type, "architectures": [hf_class], "vocab_size": int(vocab),
        "hidden_size": hidden, "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)), "head_dim": head_dim,
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": _f32(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(key("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    for name in ("bos", "eos", "padding"):
        token = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if token is not None:
            config[f"{name.replace('padding', 'pad')}_token_id"] = int(token)
    scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear",
                                  "factor": _f32(key("rope.scaling.factor"))}
    elif scaling != "none":
        raise FolioLoadError(f"{where}: rope scaling {scaling!r} is not supported")
    if rope_freqs is not None:
        config["rope_scaling"] = _llama3_scaling(rope_freqs, config, metadata, where)
    return config


def llama3_rope_factors(theta: float, head_dim: int, scaling: Mapping[str, float]) -> np.ndarray:
    """Per-frequency divisors of Llama 3's rope scaling, as llama.cpp stores in rope_freqs."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    orig, low, high = (scaling["original_max_position_embeddings"], scaling["low_freq_factor"],
                       scaling["high_freq_factor"])
    smooth = (orig / wavelen - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / scaling["factor"] + smooth)
    return np.where(wavelen < orig / high, 1.0,
                    np.where(wavelen > orig / low, scaling["factor"], blended))


def _llama3_scaling(rope_freqs: np.ndarray, config: Mapping[str, object],
                    metadata: Mapping[str, object], where: Path) -> dict[str, object]:
    # The file keeps only the resulting factors; Meta's 3.1-3.3 releases all use these low/high
    # factors, so we check that assumption against the stored factors rather than trust it.
    orig = metadata.get("llama.rope.scaling.original_context_length", 8192)
    scaling = {"rope_type": "llama3", "factor": float(np.max(rope_freqs)),
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": int(orig)}
    expected = llama3_rope_factors(config["rope_theta"], config["head_dim"], scaling)
    if expected.shape != rope_freqs.shape or not np.allclose(expected, rope_freqs, rtol=1e-3):
        raise FolioLoadError(f"{where}: its rope_freqs tensor is not a Llama 3 rope scaling "
                             "Folio recognizes; this file is not supported")
    return scaling


def _f32(value: object) -> float:
    # GGUF stores float32; its shortest str gives back the config's value (1e-05, not 9.99e-06).
    return float(str(np.float32(value)))


def load_gguf(path: Path, dtype: torch.dtype, progress: ProgressFn | None) -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer

    report = progress or (lambda stage, fraction: None)
    _check_magic(path)
    report("open", 0.0)
    entry = _cache_entry(path)
    meta = _read_meta(entry)
    tokenizer = None
    if meta is not None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(entry / "tokenizer", local_files_only=True)
        except Exception as exc:  # a damaged cache entry is rebuilt, not fatal
            log.warning("rebuilding the GGUF cache entry %s: %s", entry, exc)
        else:
            report("open", 1.0)
    if tokenizer is None:
        meta, tokenizer = _convert(path, report)
        report("cache", 0.0)
        _write_cache(entry, meta, tokenizer)
        report("cache", 1.0)
    config_dict = dict(meta["config"])
    config = AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    tensors = meta["tensors"]
    shapes = {t[0]: tuple(t[1]) for t in tensors}
    check_weight_shapes(config, shapes, lambda name: str(path), str(path))

    def opener() -> Iterator[tuple[str, torch.Tensor]]:
        from gguf import GGMLQuantizationType, dequantize, quant_shape_to_byte_shape

        data = np.memmap(path, dtype=np.uint8, mode="r")
        if data.size != meta["size"]:
            raise FolioLoadError(f"{path}: the file changed after it was opened; load it again")
        for name, shape, qtype_id, offset, n_bytes, permute_heads in tensors:
            qtype = GGMLQuantizationType(qtype_id)
            raw = data[offset:offset + n_bytes].reshape(quant_shape_to_byte_shape(shape, qtype))
            weight = dequantize(raw, qtype)
            if permute_heads:
                weight = unpermute_rows(weight, permute_heads)
            elif np.may_share_memory(weight, data):  # F32 comes back as a view of the file
                weight = weight.copy()
            yield name, torch.from_numpy(weight).to(dtype)

    return LoadedModel(config=config, tokenizer=tokenizer,
                       weights=WeightStream(shapes, opener, progress), source=path,
                       format="gguf", name=display_name(path))


def _check_magic(path: Path) -> None:
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise FolioLoadError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF'); "
                             "download or convert the model again")


def _convert(path: Path, report: ProgressFn) -> tuple[dict, object]:
    """Read the file the slow way: metadata, tensor directory and tokenizer."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    try:
        reader = GGUFReader(path)
        metadata = {name: _field_value(field) for name, field in reader.fields.items()}
        directory = [(t.name, tuple(int(d) for d in reversed(t.shape)), int(t.tensor_type),
                      int(t.data_offset), int(t.n_bytes)) for t in reader.tensors]
        rope_freqs = next((np.array(t.data, dtype=np.float32) for t in reader.tensors
                           if t.name == ROPE_FREQS), None)
    except Exception as exc:  # the reader raises bare ValueError/IndexError on damaged files
        raise FolioLoadError(f"{path}: unreadable GGUF file ({exc}); it is truncated or "
                             "corrupt, download or convert it again") from exc
    config = gguf_config_dict(metadata, {t[0] for t in directory}, rope_freqs, path)
    permute = GGUF_ARCHITECTURES[metadata["general.architecture"]][2]
    size = path.stat().st_size
    tensors, known_qtypes = [], set()
    for gguf_name, shape, qtype, offset, n_bytes in directory:
        if gguf_name == ROPE_FREQS:
            continue
        hf_name = hf_tensor_name(gguf_name)
        if hf_name is None:
            raise FolioLoadError(f"{path}: tensor {gguf_name} has no Llama counterpart; "
                                 "this GGUF is not a supported Llama-family model")
        if qtype not in known_qtypes:
            _check_dequantizable(qtype, gguf_name, path)
            known_qtypes.add(qtype)
        if offset + n_bytes > size:
            raise FolioLoadError(f"{path}: truncated (tensor {gguf_name} ends past the end of "
                                 "the file); download it again")
        heads = 0
        if permute and ".attn_q." in gguf_name:
            heads = config["num_attention_heads"]
        elif permute and ".attn_k." in gguf_name:
            heads = config["num_key_value_heads"]
        tensors.append([hf_name, list(shape), qtype, offset, n_bytes, heads])
    report("open", 1.0)
    report("tokenizer", 0.0)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                                  local_files_only=True)
    except Exception as exc:
        raise FolioLoadError(f"{path}: its tokenizer cannot be converted ({exc})") from exc
    if tokenizer.chat_template is None and metadata.get("tokenizer.chat_template"):
        tokenizer.chat_template = metadata["tokenizer.chat_template"]
    report("tokenizer", 1.0)
    stat = path.stat()
    meta = {"version": CACHE_VERSION, "source": str(path.resolve()), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "config": config, "tensors": tensors}
    return meta, tokenizer


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


def _field_value(field) -> object:
    """A metadata value as plain Python; arrays (the vocabulary, merges) become their length."""
    from gguf import GGUFValueType

    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        return len(field.data)
    part = field.parts[field.data[0]]
    if kind == GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    return part[0].item()


def _cache_entry(path: Path) -> Path:
    import transformers

    stat = path.stat()
    # The transformers version is in the key: a tokenizer saved by one may not load in another.
    key = f"{CACHE_VERSION}|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|" \
          f"{transformers.__version__}"
    return cache_root() / "gguf" / hashlib.sha256(key.encode()).hexdigest()[:24]


def _read_meta(entry: Path) -> dict | None:
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("version") == CACHE_VERSION else None


def _write_cache(entry: Path, meta: dict, tokenizer) -> None:
    """Write the entry atomically (a temp folder renamed into place); failures only warn,
    since the cache saves time but loading works without it."""
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
        tokenizer.save_pretrained(tmp / "tokenizer")
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        _drop_stale_entries(entry.parent, meta["source"])
        shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)
    except OSError as exc:
        log.warning("cannot write the GGUF cache entry %s: %s", entry, exc)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _drop_stale_entries(root: Path, source: str) -> None:
    # Entries of an older version of the same file (other size or mtime) are dead weight.
    for meta_file in root.glob("*/meta.json"):
        if meta_file.parent.name.startswith("."):  # entries being written, ours included
            continue
        try:
            stale = json.loads(meta_file.read_text(encoding="utf-8")).get("source") == source
        except (OSError, ValueError, AttributeError):
            continue
        if stale:
            shutil.rmtree(meta_file.parent, ignore_errors=True)
