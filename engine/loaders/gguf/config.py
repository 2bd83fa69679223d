"""GGUF metadata (llama.cpp's keys) to a Hugging Face config.json-style dict.

Shared by the loader, which builds the model's config from it, and the models catalog, which
reads sizes from it without loading anything. The keys each family reads are the ones
llama.cpp's convert_hf_to_gguf.py writes for it (gguf.constants.Keys); a family's quirks are
in its reader below (`_FAMILY_KEYS`), its tensor names in engine.models.registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from engine.loaders.base import FolioLoadError
from engine.models import GGUF_ARCHITECTURES, gguf_file_family
from engine.models.gemma import FULL, SLIDING
from engine.models.qwen35 import LINEAR, TILED_V_HEADS
from engine.models.spec import head_dim_of

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
    return (ROPE_FREQS,)  # Llama 3's scaling; Gemma 4's rotated share (_gemma4_keys)


def gguf_config_dict(metadata: Mapping[str, object], tensor_names: set[str],
                     config_tensors: Mapping[str, np.ndarray] | None,
                     where: Path) -> dict[str, object]:
    """A config.json-style dict from GGUF metadata (arrays given as their lengths).

    `config_tensors` holds the values of the file's config tensors (config_tensor_names);
    None when they were not read (the catalog, which wants sizes only): rope scaling that
    lives in tensors is then left out."""
    arch = metadata.get("general.architecture")
    family = gguf_file_family(metadata)
    if family is None:
        raise FolioLoadError(f"{where}: architecture {arch!r} is not supported; Folio runs "
                             f"these GGUF architectures: {', '.join(GGUF_ARCHITECTURES)}")
    keys = _Keys(metadata, str(arch), where, tensor_names)
    key = keys.get

    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    head_dim = int(key("attention.key_length", head_dim_of(None, hidden, heads)))
    vocab = metadata.get(f"{arch}.vocab_size") or metadata.get("tokenizer.ggml.tokens")
    if not vocab:
        raise FolioLoadError(f"{where}: no vocabulary size in the metadata; the file is "
                             "incomplete, download or convert it again")
    if family.model_type not in _PARTIAL_ROTARY and int(
            key("rope.dimension_count", head_dim)) != head_dim:
        raise FolioLoadError(f"{where}: partial rotary embeddings are not supported")
    config: dict[str, object] = {
        "model_type": family.model_type, "architectures": [family.architecture],
        "vocab_size": int(vocab),
        # A per-layer array (Gemma 4's) gives its first layer's; the family's reader the rest.
        # Qwen3.5-MoE files (every layer sparse) have no feed_forward_length.
        "hidden_size": hidden, "intermediate_size": _first(key(
            "feed_forward_length", keys.optional("expert_feed_forward_length"))),
        "num_hidden_layers": int(key("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": _first(key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
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
    elif scaling == "yarn":
        config["rope_scaling"] = {
            "rope_type": "yarn", "factor": _f32(keys.positive("rope.scaling.factor")),
            "original_max_position_embeddings": keys.count(
                "rope.scaling.original_context_length")}
        if keys.optional("rope.scaling.attn_factor") is not None:
            config["rope_scaling"]["attention_factor"] = _f32(
                keys.positive("rope.scaling.attn_factor"))
    elif scaling != "none":
        raise FolioLoadError(f"{where}: rope scaling {scaling!r} is not supported")
    tensors = config_tensors or {}
    if tensors.get(ROPE_FREQS) is not None and family.model_type not in _OWN_ROPE_FREQS:
        config["rope_scaling"] = _llama3_scaling(tensors[ROPE_FREQS], config, metadata, where)
    reader = _FAMILY_KEYS.get(family.model_type)
    if reader is not None:
        reader(keys, config, config_tensors)
    return config


class _Keys:
    """The file's `{arch}.*` keys, each read or rejected by name."""

    def __init__(self, metadata: Mapping[str, object], arch: str, where: Path,
                 tensor_names: set[str] | frozenset[str] = frozenset()) -> None:
        self.metadata, self.arch, self.where = metadata, arch, where
        self.tensor_names = tensor_names

    def optional(self, name: str) -> object:
        return self.metadata.get(f"{self.arch}.{name}")

    def get(self, name: str, default: object = None) -> object:
        value = self.metadata.get(f"{self.arch}.{name}", default)
        if value is None:
            raise FolioLoadError(f"{self.where}: metadata {self.arch}.{name} is missing; the "
                                 "file is incomplete, download or convert it again")
        return value

    def bad(self, name: str, value: object, expected: str) -> FolioLoadError:
        shown = f"{len(value)} flags" if isinstance(value, tuple) else repr(value)
        return FolioLoadError(f"{self.where}: metadata {self.arch}.{name} is {shown}, not "
                              f"{expected}; the file is damaged, download or convert it again")

    def count(self, name: str, default: object = None, minimum: int = 1) -> int:
        """An integer key >= minimum (a GGUF uint32); bools and floats are malformed."""
        value = self.get(name, default)
        if type(value) is not int or value < minimum:
            raise self.bad(name, value, "a positive integer" if minimum == 1 else
                           f"an integer >= {minimum}")
        return value

    def positive(self, name: str, default: object = None) -> float:
        """A finite number > 0 (a GGUF float32), as stored."""
        value = self.get(name, default)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise self.bad(name, value, "a positive number")
        return float(value)


def _gemma_layers(keys: _Keys, config: dict[str, object], default_pattern: int) -> None:
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


def _gemma2_keys(keys: _Keys, config: dict[str, object],
                 tensors: Mapping[str, np.ndarray] | None) -> None:
    # Gemma2Model writes both caps and the window; Gemma2Config's defaults (50, 30, 4096)
    # are not silently assumed for a file that lacks them.
    config["attn_logit_softcapping"] = _f32(keys.positive("attn_logit_softcapping"))
    config["final_logit_softcapping"] = _f32(keys.positive("final_logit_softcapping"))
    _gemma_layers(keys, config, default_pattern=2)


def _gemma3_keys(keys: _Keys, config: dict[str, object],
                 tensors: Mapping[str, np.ndarray] | None) -> None:
    # Gemma 3 has no attention soft-cap; a final one only when its config sets one.
    cap = keys.optional("final_logit_softcapping")
    config["final_logit_softcapping"] = (
        None if cap is None else _f32(keys.positive("final_logit_softcapping")))
    _gemma_layers(keys, config, default_pattern=6)
    # rope.freq_base and rope.scaling.* are the full (global) layers'; llama.cpp runs the
    # sliding layers at base 10000 without scaling (hard-coded, as Gemma3TextConfig's
    # rope_local_base_freq default), unless the file states rope.freq_base_swa.
    full = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    scaling = config.pop("rope_scaling", None)
    if isinstance(scaling, dict):
        full.update(scaling)
    local = _f32(keys.positive("rope.freq_base_swa", 10000.0))
    config["rope_parameters"] = {SLIDING: {"rope_type": "default", "rope_theta": local},
                                 FULL: full}


def _gemma4_keys(keys: _Keys, config: dict[str, object],
                 tensors: Mapping[str, np.ndarray] | None) -> None:
    """Gemma4Model's keys over Gemma 3's: key_length is the global layers' head size
    (key_length_swa the sliding ones'), head counts and MLP widths may be per layer (the
    global layers' KV heads; the KV-shared layers' double-wide MLP), and the global
    layers' proportional rope keeps its rotated share in rope_freqs (1 turns, 1e30 not)."""
    _gemma3_keys(keys, config, tensors)
    del config["query_pre_attn_scalar"]  # Gemma 4 scales scores by 1
    layers, types = int(config["num_hidden_layers"]), config["layer_types"]
    config["global_head_dim"] = config["head_dim"]
    config["head_dim"] = keys.count("attention.key_length_swa", config["head_dim"])
    kv = _per_layer(keys, "attention.head_count_kv", layers)
    by_kind = {kind: {kv[i] for i in range(layers) if types[i] == kind} for kind in set(types)}
    if any(len(counts) != 1 for counts in by_kind.values()):
        raise keys.bad("attention.head_count_kv", kv, "one count per layer kind")
    config["num_key_value_heads"] = min(by_kind.get(SLIDING, by_kind[FULL]))
    config["num_global_key_value_heads"] = min(by_kind.get(FULL, by_kind[SLIDING]))
    widths = _per_layer(keys, "feed_forward_length", layers)
    config["use_double_wide_mlp"] = any(w != widths[0] for w in widths)
    shared = keys.count("attention.shared_kv_layers", 0, minimum=0)
    config["num_kv_shared_layers"] = shared
    # A global layer with keys but no values shares one projection (attention_k_eq_v).
    first_full = types.index(FULL) if FULL in types else None
    config["attention_k_eq_v"] = first_full is not None and (
        f"blk.{first_full}.attn_v.weight" not in keys.tensor_names)
    per_layer = keys.count("embedding_length_per_layer_input", 0, minimum=0)
    config["hidden_size_per_layer_input"] = per_layer
    config["vocab_size_per_layer_input"] = config["vocab_size"]
    freqs = None if tensors is None else tensors.get(ROPE_FREQS)
    share = 1.0 if freqs is None else float(np.count_nonzero(freqs == 1.0)) / len(freqs)
    full = config["rope_parameters"][FULL]
    config["rope_parameters"][FULL] = {"rope_type": "proportional",
                                       "rope_theta": full["rope_theta"],
                                       "partial_rotary_factor": share}


def _per_layer(keys: _Keys, name: str, layers: int) -> tuple[int, ...]:
    """A key stored once or once per layer, as one value per layer."""
    value = keys.get(name)
    if not isinstance(value, tuple):
        return (int(value),) * layers
    if len(value) != layers:
        raise keys.bad(name, value, f"one value per layer ({layers})")
    return value


def _first(value: object) -> int:
    return int(value[0] if isinstance(value, tuple) else value)


def _phi3_keys(keys: _Keys, config: dict[str, object],
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


def _moe_keys(keys: _Keys, config: dict[str, object],
              tensors: Mapping[str, np.ndarray] | None) -> None:
    """The experts of OLMoE, Qwen3-MoE and Mixtral files: how many, how many a token takes,
    each one's size and whether the top k are rescaled (llama.cpp normalises Qwen3-MoE's
    and Mixtral's, not OLMoE's, unless the file says)."""
    experts = keys.count("expert_count")
    used = keys.count("expert_used_count")
    if used > experts:
        raise keys.bad("expert_used_count", used, f"at most expert_count ({experts})")
    model_type = config["model_type"]
    config["num_local_experts" if model_type == "mixtral" else "num_experts"] = experts
    config["num_experts_per_tok"] = used
    norm = keys.optional("expert_weights_norm")
    if norm is not None and not isinstance(norm, bool):
        raise keys.bad("expert_weights_norm", norm, "a flag")
    config["norm_topk_prob"] = (model_type != "olmoe") if norm is None else norm
    if model_type == "qwen3_moe":
        config["moe_intermediate_size"] = keys.count("expert_feed_forward_length")
        config["mlp_only_layers"] = []
        config["decoder_sparse_step"] = 1
    if model_type == "olmoe":
        clamp = keys.optional("attention.clamp_kqv")
        config["clip_qkv"] = None if clamp is None else _f32(
            keys.positive("attention.clamp_kqv"))
    if model_type == "mixtral":
        config["sliding_window"] = None


def _gpt_oss_keys(keys: _Keys, config: dict[str, object],
                  tensors: Mapping[str, np.ndarray] | None) -> None:
    """gpt-oss (llama.cpp's GptOssModel): the experts, each of expert_feed_forward_length;
    sliding and full layers alternating (llama.cpp's swa pattern 2, as transformers'
    default layer_types), the window; YaRN as gpt-oss's config states it (its ramp ends
    not rounded, ``truncate`` false, which the file does not record). The SwiGLU's limit:
    swiglu_clamp_exp where a file states it, else gpt-oss's 7.0, which llama.cpp
    hard-codes (as its alpha, 1.702, the config's default)."""
    experts = keys.count("expert_count")
    used = keys.count("expert_used_count")
    if used > experts:
        raise keys.bad("expert_used_count", used, f"at most expert_count ({experts})")
    config["num_local_experts"] = experts
    config["num_experts_per_tok"] = used
    config["intermediate_size"] = keys.count("expert_feed_forward_length",
                                             config["intermediate_size"])
    layers = int(config["num_hidden_layers"])
    config["layer_types"] = [SLIDING if i % 2 == 0 else FULL for i in range(layers)]
    config["sliding_window"] = keys.count("attention.sliding_window")
    if keys.optional("swiglu_clamp_exp") is not None:
        config["swiglu_limit"] = _f32(keys.positive("swiglu_clamp_exp"))
    rope = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    scaling = config.pop("rope_scaling", None)
    if isinstance(scaling, dict):
        rope |= {**scaling, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    config["rope_parameters"] = rope


def _qwen35_keys(keys: _Keys, config: dict[str, object],
                 tensors: Mapping[str, np.ndarray] | None) -> None:
    """Qwen3.5's linear layers (Qwen3NextModel's ssm.* keys), the layer period, the
    partial rotary, and llama.cpp's tiled value heads."""
    v_heads = keys.count("ssm.time_step_rank")
    inner = keys.count("ssm.inner_size")
    if inner % v_heads:
        raise keys.bad("ssm.inner_size", inner, f"a multiple of ssm.time_step_rank ({v_heads})")
    config |= {"linear_num_value_heads": v_heads, "linear_value_head_dim": inner // v_heads,
               "linear_num_key_heads": keys.count("ssm.group_count"),
               "linear_key_head_dim": keys.count("ssm.state_size"),
               "linear_conv_kernel_dim": keys.count("ssm.conv_kernel"), TILED_V_HEADS: True}
    period = keys.count("full_attention_interval", 4)
    config["layer_types"] = [FULL if (i + 1) % period == 0 else LINEAR
                             for i in range(int(config["num_hidden_layers"]))]
    head_dim = int(config["head_dim"])
    rotary = keys.count("rope.dimension_count", head_dim // 4)
    if rotary > head_dim or rotary % 2:
        raise keys.bad("rope.dimension_count", rotary,
                       f"an even number of dims of the {head_dim}-dim heads")
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": config.pop("rope_theta"),
                                 "partial_rotary_factor": rotary / head_dim}


def _qwen35_moe_keys(keys: _Keys, config: dict[str, object],
                     tensors: Mapping[str, np.ndarray] | None) -> None:
    """Qwen3.5-MoE (Qwen3NextModel's keys for its experts): Qwen3.5's linear layers, the
    experts and the shared expert's width; the top k always rescaled (the model's rule)."""
    _qwen35_keys(keys, config, tensors)
    experts = keys.count("expert_count")
    used = keys.count("expert_used_count")
    if used > experts:
        raise keys.bad("expert_used_count", used, f"at most expert_count ({experts})")
    config |= {"num_experts": experts, "num_experts_per_tok": used,
               "moe_intermediate_size": keys.count("expert_feed_forward_length"),
               "shared_expert_intermediate_size": keys.count(
                   "expert_shared_feed_forward_length")}


_FamilyKeys = Callable[[_Keys, dict[str, object], Mapping[str, np.ndarray] | None], None]
# Families whose config needs more than the shared Llama keys, by model_type.
_FAMILY_KEYS: dict[str, _FamilyKeys] = {
    "gemma2": _gemma2_keys, "gemma3_text": _gemma3_keys, "gemma4_text": _gemma4_keys,
    "phi3": _phi3_keys,
    "olmoe": _moe_keys, "qwen3_moe": _moe_keys, "mixtral": _moe_keys,
    "gpt_oss": _gpt_oss_keys,
    "qwen3_5_text": _qwen35_keys, "qwen3_5_moe_text": _qwen35_moe_keys,
}
# Families whose rope.dimension_count may be < head_dim.
_PARTIAL_ROTARY = ("phi3", "qwen3_5_text", "qwen3_5_moe_text")
_OWN_ROPE_FREQS = ("gemma4_text",)  # families whose rope_freqs is not Llama 3's scaling


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
