"""The family table of the GGUF reader: each family's keys beyond the shared Llama ones
(`FAMILY_KEYS`, by model_type), with Gemma 2 / 3 / 4's and Phi-3's readers here and the
mixtures' and hybrids' in moe_keys.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from engine.loaders.base import FolioLoadError
from engine.loaders.gguf.keys import GGUFKeys, f32, per_layer
from engine.loaders.gguf.moe_keys import gpt_oss_keys, moe_keys, qwen35_keys, qwen35_moe_keys
from engine.loaders.gguf.rope import ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT, ROPE_FREQS
from engine.models.gemma import FULL, SLIDING


def gemma_layers(keys: GGUFKeys, config: dict[str, object], default_pattern: int) -> None:
    """Sliding and full layers, the window, and the attention score scale of Gemma 2 / 3."""
    layers = int(config["num_hidden_layers"])
    name = "attention.sliding_window_pattern"
    pattern = keys.optional(name)
    if pattern is None:  # llama.cpp's default: Gemma 2 alternates, Gemma 3 is 5 local : 1
        pattern = default_pattern
    if isinstance(pattern, tuple):  # one flag per layer, true for a sliding one
        if len(pattern) != layers:
            raise keys.bad(name, pattern, f"one flag per layer ({layers})")
        sliding = list(pattern)
    elif type(pattern) is int and pattern >= 0:
        # llama.cpp's set_swa_pattern: in every run of n layers the last is full; n = 0
        # makes every layer sliding, n = 1 none.
        sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
    else:
        raise keys.bad(name, pattern, "a layer period (an integer >= 0) or per-layer flags")
    config["layer_types"] = [SLIDING if s else FULL for s in sliding]
    # A file of full layers only (Gemma 3 with pattern 1) has no window key.
    config["sliding_window"] = keys.count("attention.sliding_window") if any(sliding) else None
    # llama.cpp stores no query_pre_attn_scalar: it scales scores by 1/sqrt(head_dim), except
    # for the 27B models (46 Gemma 2 layers, 62 Gemma 3 layers), scaled by 1/sqrt(hidden /
    # heads) as Google's configs say (query_pre_attn_scalar 144 and 168). Same rule here.
    is_27b = layers == (46 if config["model_type"] == "gemma2" else 62)
    config["query_pre_attn_scalar"] = (
        int(config["hidden_size"]) // int(config["num_attention_heads"]) if is_27b
        else int(config["head_dim"]))


def gemma2_keys(keys: GGUFKeys, config: dict[str, object],
                 tensors: Mapping[str, np.ndarray] | None) -> None:
    # Gemma2Model writes both caps and the window; Gemma2Config's defaults (50, 30, 4096)
    # are not silently assumed for a file that lacks them.
    config["attn_logit_softcapping"] = f32(keys.positive("attn_logit_softcapping"))
    config["final_logit_softcapping"] = f32(keys.positive("final_logit_softcapping"))
    gemma_layers(keys, config, default_pattern=2)


def gemma3_keys(keys: GGUFKeys, config: dict[str, object],
                 tensors: Mapping[str, np.ndarray] | None) -> None:
    # Gemma 3 has no attention soft-cap; a final one only when its config sets one.
    cap = keys.optional("final_logit_softcapping")
    config["final_logit_softcapping"] = (
        None if cap is None else f32(keys.positive("final_logit_softcapping")))
    gemma_layers(keys, config, default_pattern=6)
    # rope.freq_base and rope.scaling.* are the full (global) layers'; llama.cpp runs the
    # sliding layers at base 10000 without scaling (hard-coded, as Gemma3TextConfig's
    # rope_local_base_freq default), unless the file states rope.freq_base_swa.
    full = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    scaling = config.pop("rope_scaling", None)
    if isinstance(scaling, dict):
        full.update(scaling)
    local = f32(keys.positive("rope.freq_base_swa", 10000.0))
    config["rope_parameters"] = {SLIDING: {"rope_type": "default", "rope_theta": local},
                                 FULL: full}


def gemma4_keys(keys: GGUFKeys, config: dict[str, object],
                 tensors: Mapping[str, np.ndarray] | None) -> None:
    """Gemma4Model's keys over Gemma 3's: key_length is the global layers' head size
    (key_length_swa the sliding ones'), head counts and MLP widths may be per layer (the
    global layers' KV heads; the KV-shared layers' double-wide MLP), and the global
    layers' proportional rope keeps its rotated share in rope_freqs (1 turns, 1e30 not)."""
    gemma3_keys(keys, config, tensors)
    del config["query_pre_attn_scalar"]  # Gemma 4 scales scores by 1
    layers, types = int(config["num_hidden_layers"]), config["layer_types"]
    config["global_head_dim"] = config["head_dim"]
    config["head_dim"] = keys.count("attention.key_length_swa", config["head_dim"])
    kv = per_layer(keys, "attention.head_count_kv", layers)
    by_kind = {kind: {kv[i] for i in range(layers) if types[i] == kind} for kind in set(types)}
    if any(len(counts) != 1 for counts in by_kind.values()):
        raise keys.bad("attention.head_count_kv", kv, "one count per layer kind")
    config["num_key_value_heads"] = min(by_kind.get(SLIDING, by_kind[FULL]))
    config["num_global_key_value_heads"] = min(by_kind.get(FULL, by_kind[SLIDING]))
    widths = per_layer(keys, "feed_forward_length", layers)
    config["use_double_wide_mlp"] = any(w != widths[0] for w in widths)
    shared = keys.count("attention.shared_kv_layers", 0, minimum=0)
    config["num_kv_shared_layers"] = shared
    # A global layer with keys but no values shares one projection (attention_k_eq_v).
    first_full = types.index(FULL) if FULL in types else None
    config["attention_k_eq_v"] = first_full is not None and (
        f"blk.{first_full}.attn_v.weight" not in keys.tensor_names)
    config["hidden_size_per_layer_input"] = keys.count("embedding_length_per_layer_input", 0,
                                                       minimum=0)
    config["vocab_size_per_layer_input"] = config["vocab_size"]
    freqs = None if tensors is None else tensors.get(ROPE_FREQS)
    share = 1.0 if freqs is None else float(np.count_nonzero(freqs == 1.0)) / len(freqs)
    full = config["rope_parameters"][FULL]
    config["rope_parameters"][FULL] = {"rope_type": "proportional",
                                       "rope_theta": full["rope_theta"],
                                       "partial_rotary_factor": share}


def phi3_keys(keys: GGUFKeys, config: dict[str, object],
               tensors: Mapping[str, np.ndarray] | None) -> None:
    if "rope_scaling" in config:
        raise FolioLoadError(f"{keys.where}: rope scaling {config['rope_scaling']['rope_type']!r}"
                             " is not supported for phi3; Phi-3 runs plain rope or LongRoPE")
    head_dim = int(config["head_dim"])
    # Phi3MiniModel writes int(partial_rotary_factor * hidden) // heads: Phi-4-mini rotates
    # 96 of 128 dims.
    rotary = keys.count("rope.dimension_count", head_dim)
    if rotary > head_dim or rotary % 2:
        raise keys.bad("rope.dimension_count", rotary,
                       f"an even number of dims of the {head_dim}-dim heads")
    if rotary != head_dim:
        factor = rotary / head_dim
        if int(head_dim * factor) != rotary:  # the spec computes int(head_dim * factor)
            raise keys.bad("rope.dimension_count", rotary, "a rotary width Folio can express")
        config["partial_rotary_factor"] = factor
    # 0 is the converter's "no window" (Phi-4-mini); Phi-3-mini-4k has 2047.
    config["sliding_window"] = keys.count("attention.sliding_window", 0, minimum=0) or None
    config["original_max_position_embeddings"] = keys.count(
        "rope.scaling.original_context_length", config["max_position_embeddings"])
    if tensors is None:
        return
    long, short = tensors.get(ROPE_FACTORS_LONG), tensors.get(ROPE_FACTORS_SHORT)
    if long is None and short is None:
        return
    for name, values in ((ROPE_FACTORS_LONG, long), (ROPE_FACTORS_SHORT, short)):
        if values is None:
            other = ROPE_FACTORS_SHORT if name == ROPE_FACTORS_LONG else ROPE_FACTORS_LONG
            raise FolioLoadError(f"{keys.where}: tensor {name} is missing while {other} is "
                                 "there; LongRoPE needs both, convert the model again")
        if values.shape != (rotary // 2,) or not np.all(np.isfinite(values)):
            raise FolioLoadError(f"{keys.where}: tensor {name} has shape {list(values.shape)},"
                                 f" but {keys.arch}.rope.dimension_count {rotary} implies "
                                 f"[{rotary // 2}] finite factors; the file is damaged")
    scaling: dict[str, object] = {
        "rope_type": "longrope",
        # float32 in the file; its exact values (often already float32 in config.json).
        "short_factor": [float(v) for v in np.asarray(short, np.float32)],
        "long_factor": [float(v) for v in np.asarray(long, np.float32)]}
    if keys.optional("rope.scaling.attn_factor") is not None:
        # The converter computes it (sqrt(1 + ln(s) / ln(original))); its float32 as is.
        scaling["attention_factor"] = keys.positive("rope.scaling.attn_factor")
    config["rope_scaling"] = scaling


FamilyKeys = Callable[[GGUFKeys, dict[str, object], Mapping[str, np.ndarray] | None], None]
# Families whose config needs more than the shared Llama keys, by model_type.
FAMILY_KEYS: dict[str, FamilyKeys] = {
    "gemma2": gemma2_keys, "gemma3_text": gemma3_keys, "gemma4_text": gemma4_keys,
    "phi3": phi3_keys,
    "olmoe": moe_keys, "qwen3_moe": moe_keys, "mixtral": moe_keys,
    "gpt_oss": gpt_oss_keys,
    "qwen3_5_text": qwen35_keys, "qwen3_5_moe_text": qwen35_moe_keys,
}
# Families whose rope.dimension_count may be < head_dim.
PARTIAL_ROTARY = ("phi3", "qwen3_5_text", "qwen3_5_moe_text")
OWN_ROPE_FREQS = ("gemma4_text",)  # families whose rope_freqs is not Llama 3's scaling
