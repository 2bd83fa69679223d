"""Rope scaling in GGUF files: the `rope.scaling.*` keys (linear, YaRN) and the config
tensors that hold it (Llama 3's rope_freqs, Phi-3's LongRoPE factors), folded into the
config dict."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from engine.loaders.base import FolioLoadError
from engine.loaders.gguf.keys import GGUFKeys, f32

ROPE_FREQS = "rope_freqs.weight"  # llama 3 rope scaling, folded into the config
# Phi-3's LongRoPE factors (rotary dims / 2 each), folded into the config's rope_scaling.
ROPE_FACTORS_LONG = "rope_factors_long.weight"
ROPE_FACTORS_SHORT = "rope_factors_short.weight"
CONFIG_TENSORS = (ROPE_FREQS, ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT)  # all, any family


def config_tensor_names(model_type: str) -> tuple[str, ...]:
    """The tensors of a family's GGUF files that are config, not weights: the loader reads
    them for gguf_config_dict and does not hand them to the model."""
    if model_type == "phi3":
        return ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT
    if model_type in ("gemma2", "gemma3_text"):
        return ()
    return (ROPE_FREQS,)  # Llama 3's scaling; Gemma 4's rotated share (gemma4_keys)


def key_scaling(keys: GGUFKeys) -> dict[str, object] | None:
    """The scaling the `rope.scaling.*` keys state (None: none)."""
    key = keys.get
    scaling = keys.metadata.get(f"{keys.arch}.rope.scaling.type", "none")
    if scaling == "none":
        return None
    if scaling == "linear":
        return {"rope_type": "linear", "factor": f32(key("rope.scaling.factor"))}
    if scaling != "yarn":
        raise FolioLoadError(f"{keys.where}: rope scaling {scaling!r} is not supported")
    yarn: dict[str, object] = {
        "rope_type": "yarn", "factor": f32(keys.positive("rope.scaling.factor")),
        "original_max_position_embeddings": keys.count(
            "rope.scaling.original_context_length")}
    if keys.optional("rope.scaling.attn_factor") is not None:
        yarn["attention_factor"] = f32(keys.positive("rope.scaling.attn_factor"))
    return yarn


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


def llama3_scaling(rope_freqs: np.ndarray, config: Mapping[str, object],
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
