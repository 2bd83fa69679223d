"""GGUF metadata (llama.cpp's keys) to a Hugging Face config.json-style dict.

Shared by the loader, which builds the model's config from it, and the models catalog, which
reads sizes from it without loading anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from engine.loaders.base import FolioLoadError
from engine.models import GGUF_ARCHITECTURES, gguf_family
from engine.models.spec import head_dim_of

ROPE_FREQS = "rope_freqs.weight"  # llama 3 rope scaling, folded into the config


def gguf_config_dict(metadata: Mapping[str, object], tensor_names: set[str],
                     rope_freqs: np.ndarray | None, where: Path) -> dict[str, object]:
    """A config.json-style dict from GGUF metadata (arrays given as their lengths)."""
    arch = metadata.get("general.architecture")
    family = gguf_family(arch)
    if family is None:
        raise FolioLoadError(f"{where}: architecture {arch!r} is not supported; Folio runs "
                             f"these GGUF architectures: {', '.join(GGUF_ARCHITECTURES)}")

    def key(name: str, default: object = None) -> object:
        value = metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise FolioLoadError(f"{where}: metadata {arch}.{name} is missing; the file is "
                                 "incomplete, download or convert it again")
        return value

    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    head_dim = int(key("attention.key_length", head_dim_of(None, hidden, heads)))
    vocab = metadata.get(f"{arch}.vocab_size") or metadata.get("tokenizer.ggml.tokens")
    if not vocab:
        raise FolioLoadError(f"{where}: no vocabulary size in the metadata; the file is "
                             "incomplete, download or convert it again")
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise FolioLoadError(f"{where}: partial rotary embeddings are not supported")
    config: dict[str, object] = {
        "model_type": family.model_type, "architectures": [family.architecture],
        "vocab_size": int(vocab),
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
