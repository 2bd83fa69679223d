"""Which model class builds which Hugging Face architecture."""

from __future__ import annotations

from typing import Any

import torch

from engine.models.llama import LlamaForCausalLM
from engine.models.spec import FamilyTraits, spec_from_hf_config

_FAMILIES: dict[str, FamilyTraits] = {
    "LlamaForCausalLM": FamilyTraits(mlp_bias_from_config=True),
    "MistralForCausalLM": FamilyTraits(o_bias_from_config=False),
    "Qwen2ForCausalLM": FamilyTraits(qkv_bias_always=True, o_bias_from_config=False),
    "Qwen3ForCausalLM": FamilyTraits(qk_norm=True),
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_FAMILIES)
# Configs without an `architectures` list (hand-written ones) still name a model_type.
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_architecture(hf_config: Any) -> str:
    """The supported architecture a config describes; ValueError naming it otherwise."""
    architectures = list(getattr(hf_config, "architectures", None) or [])
    for name in architectures:
        if name in _FAMILIES:
            return name
    model_type = getattr(hf_config, "model_type", None)
    if not architectures and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    described = ", ".join(architectures) if architectures else f"model_type {model_type!r}"
    raise ValueError(
        f"unsupported model architecture {described}; supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")


def build_model(
    hf_config: Any,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
) -> LlamaForCausalLM:
    """An empty (uninitialized) model for `hf_config`; fill it with load_weights."""
    architecture = resolve_architecture(hf_config)
    spec = spec_from_hf_config(hf_config, architecture, _FAMILIES[architecture])
    return LlamaForCausalLM(spec, resolve_dtype(dtype), device)
