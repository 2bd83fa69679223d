"""Gemma 4's decoder shape read from its Hugging Face config: per-layer heads and MLP
widths, which layers compute K/V and which read an earlier layer's, the rope per layer
kind; the variants Folio does not run refused by name (engine/models/gemma4.py has the
model)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

from engine.models.gemma import checked_window
from engine.models.spec import DecoderSpec, FamilyTraits, base_spec


@dataclass(slots=True)
class Gemma4Spec(DecoderSpec):
    layer_types: tuple[str, ...] = ()
    window: int | None = None  # of the sliding layers
    # Per decoder layer: (num_kv_heads, head_dim), the layer whose K/V it reads (itself
    # when it computes its own), and its MLP width.
    layer_heads: tuple[tuple[int, int], ...] = ()
    kv_source: tuple[int, ...] = ()
    layer_intermediate: tuple[int, ...] = ()
    k_eq_v: bool = False  # global layers' values are their keys' projection
    ple_size: int = 0  # hidden_size_per_layer_input; 0: no per-layer embeddings
    ple_vocab: int = 0
    # An image token's per-layer inputs are the pad token's (transformers' Gemma4Model).
    pad_token_id: int = 0
    final_logit_softcap: float | None = None
    # Per layer kind: (theta, rotated share of the pairs, frequency divisor).
    rope: tuple[tuple[str, float, float, float], ...] = ()


def gemma4_spec(hf_config: Any, architecture: str, traits: FamilyTraits) -> Gemma4Spec:
    if getattr(hf_config, "enable_moe_block", False):
        raise ValueError("enable_moe_block: Gemma 4's mixture-of-experts variant is not "
                         "supported; its dense models are")
    if getattr(hf_config, "use_bidirectional_attention", None) == "all":
        raise ValueError("use_bidirectional_attention 'all' is not supported; Folio decodes "
                         "causally")
    # transformers refuses reads of a per-layer field (head_dim, num_key_value_heads) on
    # the whole config: the shared fields come from its plain dict (the sliding layers'
    # values), the per-layer ones from per_layer_config below.
    base = base_spec(SimpleNamespace(**hf_config.to_dict()), architecture, traits,
                     act_field="hidden_activation", read_rope=False)
    n = base.num_layers
    layer_types = tuple(getattr(hf_config, "layer_types", None) or ())
    window = checked_window(layer_types, n, getattr(hf_config, "sliding_window", None))
    heads = tuple(_layer_heads(hf_config, i, base) for i in range(n))
    sources = _kv_sources(layer_types, int(getattr(hf_config, "num_kv_shared_layers", 0) or 0))
    double = bool(getattr(hf_config, "use_double_wide_mlp", False))
    widths = tuple(base.intermediate_size * (2 if double and sources[i] != i else 1)
                   for i in range(n))
    shared = {f.name: getattr(base, f.name) for f in fields(DecoderSpec)}
    shared |= {"sliding_window": None, "qk_norm": True}
    return Gemma4Spec(
        **shared, layer_types=layer_types, window=window,
        layer_heads=heads, kv_source=sources, layer_intermediate=widths,
        k_eq_v=bool(getattr(hf_config, "attention_k_eq_v", False)),
        ple_size=int(getattr(hf_config, "hidden_size_per_layer_input", 0) or 0),
        ple_vocab=int(getattr(hf_config, "vocab_size_per_layer_input", 0) or 0),
        pad_token_id=int(getattr(hf_config, "pad_token_id", 0) or 0),
        final_logit_softcap=getattr(hf_config, "final_logit_softcapping", None),
        rope=tuple(_rope(hf_config, kind) for kind in sorted(set(layer_types))))


def _layer_heads(hf_config: Any, layer: int, base: DecoderSpec) -> tuple[int, int]:
    """A layer's (num_kv_heads, head_dim): transformers keeps the global layers' own
    sizes in ``per_layer_config``."""
    per_layer = getattr(hf_config, "per_layer_config", None)
    try:
        own = per_layer[layer] if per_layer is not None else None
    except (KeyError, IndexError, TypeError, ValueError):
        own = None
    head_dim = getattr(own, "head_dim", None) or base.head_dim
    kv_heads = getattr(own, "num_key_value_heads", None) or base.num_kv_heads
    if base.num_heads % kv_heads:
        raise ValueError(f"num_attention_heads ({base.num_heads}) must be a multiple of layer "
                         f"{layer}'s num_key_value_heads ({kv_heads})")
    return int(kv_heads), int(head_dim)


def _kv_sources(layer_types: tuple[str, ...], num_shared: int) -> tuple[int, ...]:
    """Each layer's K/V source: itself, or for the last ``num_shared`` layers the last
    layer of the same kind before them (transformers' kv_sharing_modes)."""
    n = len(layer_types)
    first = n - num_shared
    if not 0 <= num_shared < n:
        raise ValueError(f"num_kv_shared_layers must be in [0, {n}), got {num_shared}")
    last: dict[str, int] = {}
    for i in range(first):
        last[layer_types[i]] = i
    if num_shared and set(layer_types[first:]) - set(last):
        raise ValueError("num_kv_shared_layers: a shared layer's kind has no earlier layer "
                         "computing its K/V")
    return tuple(i if i < first else last[layer_types[i]] for i in range(n))


def _rope(hf_config: Any, kind: str) -> tuple[str, float, float, float]:
    params = (getattr(hf_config, "rope_parameters", None) or {}).get(kind) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "proportional"):
        raise ValueError(f"rope_parameters[{kind!r}].rope_type {rope_type!r} is not "
                         "supported; supported: default, proportional")
    share = float(params.get("partial_rotary_factor", 1.0)) if rope_type == "proportional" else 1.0
    factor = float(params.get("factor", 1.0)) if rope_type == "proportional" else 1.0
    return kind, float(params.get("rope_theta", 10000.0)), share, factor
